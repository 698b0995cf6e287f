"""What the workflow needs to plan the kernel_tests stage's job, from the stage's config block."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from functools import cache
from pathlib import Path

from cs336_systems.core.config import Checker, Facts

# the most xdist workers `auto` starts: more compete for one GPU and its compiler threads
MAX_AUTO_WORKERS = 16


def worker_count(requested: str | int) -> int:
    """pytest-xdist workers: `auto` is this process's CPU cores (at most MAX_AUTO_WORKERS). The
    rule declares them as its `threads`, so that Snakemake runs nothing else on those cores."""
    if requested == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, min(MAX_AUTO_WORKERS, cores or 1))
    return max(1, int(requested))


def kernel_args(cfg: dict) -> str:
    """--kernel NAME=REGEX arguments, shell-quoted (the regexes hold | and ^)."""
    return " ".join(
        shlex.quote(f"--kernel={name}={regex}") for name, regex in cfg["kernels"].items()
    )


def option(cfg: dict, key: str) -> str:
    """A pytest selection option (-k / -m expression), shell-quoted; '' when unset."""
    return shlex.quote(cfg[key])


@cache
def _expression():
    """pytest's own -k/-m expression parser (`_pytest/mark/expression.py`, standard library
    only), loaded without importing the rest of pytest (a tenth of a second while planning)."""
    name = "_cs336_pytest_expression"
    spec = importlib.util.find_spec("_pytest")
    path = Path(spec.origin).parent / "mark" / "expression.py" if spec and spec.origin else None
    if path is None or not path.is_file():
        from _pytest.mark.expression import Expression

        return Expression
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    module_spec.loader.exec_module(module)
    return module.Expression


def expression_problem(text: str) -> str | None:
    """Why pytest cannot parse the -k/-m expression `text`, or None ('' selects everything)."""
    if not text.strip():
        return None
    try:
        _expression().compile(text)
    except SyntaxError as exc:
        return f"at column {exc.offset}: {exc.msg}"
    return None


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """Test files that exist, -k and -m expressions pytest parses, kernel regexes that compile.
    (Whether -k selects any test needs the tests collected, which imports torch: the stage
    checks that before it runs them.)"""
    for i, f in enumerate(cfg["files"]):
        # the files must be where the stage runs; a run without the stage needs none
        if "kernel_tests" in facts.stages and not Path(f).is_file():
            at.fail(("files", i), f, "an existing test file (relative to the workflow)")
    for key, flag in (("select", "-k"), ("marker", "-m")):
        if why := expression_problem(cfg[key]):
            at.fail(key, cfg[key], f"a pytest {flag} expression; {why}")
    for name, regex in cfg["kernels"].items():
        try:
            re.compile(regex)
        except re.error as exc:
            at.fail(("kernels", name), regex, f"a regular expression on test names; {exc}")
