"""The kernel_tests stage's knobs (`KernelTestsKnobs`, one per preset block of
config/stages/kernel_tests.yaml) and what the workflow needs to plan its job and check a block
beyond its schema (no torch)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

# the most xdist workers `auto` starts: more compete for one GPU and its compiler threads
MAX_AUTO_WORKERS = 16


@dataclass(frozen=True)
class KernelTestsKnobs(Knobs):
    """The kernels' pytest suites."""

    files: list[str] = knob(
        "the kernels' test files",
        minItems=1,
        uniqueItems=True,
        items={
            "pattern": r"^tests/([A-Za-z0-9_]+/)*test_[A-Za-z0-9_]+\.py$",
            "allowed": "a test file tests/.../test_<name>.py",
        },
    )
    kernels: dict[str, str] = knob(
        "kernel -> regex on a test's name (first match wins)",
        minProperties=1,
        propertyNames={"pattern": "^[a-z][a-z0-9_]*$", "allowed": "a kernel name: a-z, 0-9, _"},
        values={"minLength": 1},
    )
    select: str = knob("pytest -k expression ('' selects every test)")
    marker: str = knob("pytest -m expression ('' selects every test)")
    # pytest and torch take seconds to start: a shorter limit only times out
    timeout_s: int = knob("seconds the suite may take", minimum=60)
    workers: Literal["auto"] | int | None = knob(
        "pytest-xdist worker processes: auto (this machine's CPU cores, at most 16; one runs"
        " without xdist), or a number",
        default=None,
        minimum=1,
        allowed="auto or a whole number of at least 1",
    )


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = KernelTestsKnobs


def worker_count(requested: str | int) -> int:
    """pytest-xdist workers: `auto` is this process's CPU cores (at most MAX_AUTO_WORKERS). The
    rule declares them as its `threads`, so that Snakemake runs nothing else on those cores."""
    if requested == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, min(MAX_AUTO_WORKERS, cores or 1))
    return max(1, int(requested))


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


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"kernel_tests": lambda w: "kernel_tests"}


# seconds of test time of the handout's code parts' test files, beside the kernels' suite (the
# device's `kernel_tests_s`): measured one by one on the 2-core CPU (`pytest -n 0 --durations`,
# the cpu preset's selection), gloo processes included; shared by two workers at least
CODE_PART_TEST_S = {
    "tests/unit/core/test_harness.py": 1.5,
    "tests/stages/benchmark/test_benchmark.py": 6.0,
    "tests/stages/ddp/test_ddp.py": 8.5,
    "tests/unit/parallel/test_sharded_optimizer.py": 0.5,
    "tests/unit/parallel/test_fsdp.py": 3.5,
    "tests/unit/adapters/test_adapters.py": 1.0,
}


def estimate(k: KernelTestsKnobs, cost: Costs) -> list[Job]:
    """The kernels' pytest suite on its xdist workers (the preset's selection), and the tests
    of the handout's code parts where the block runs their files."""
    extra = sum(CODE_PART_TEST_S.get(f, 0.0) for f in k.files) / 2
    return [Job("kernel_tests", "kernel_tests",
                cost.dev.job_start_s + cost.dev.kernel_tests_s + extra,
                "the kernels' and the code parts' pytest suites, xdist workers")]  # fmt: skip


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
