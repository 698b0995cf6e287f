"""Stage `kernel_tests`: run the kernels' pytest suites, keep a JUnit XML and a tidy CSV.

    python -m cs336_systems.stages.kernel_tests --machine M --preset P --block '{"files":
        ["tests/unit/kernels/test_flash_attention.py"], "kernels": {"flash_triton": "^test_triton_",
        "flash_pytorch": "^test_pytorch_"}, "select": "not fp16", "marker": "", "timeout_s": 900,
        "workers": "auto"}' --junit X.xml --out X.csv [--files other test files]

One row per test: test, kernel (the first `kernels` pattern its name matches, else `other`),
outcome (passed / failed / error / skipped), duration_ms, message. Failing tests do not fail
the job; they are rows, and `verdicts()` turns them into a per-kernel verdict that the
benchmark stages read: a kernel with a failed test is not benchmarked. On a machine without
CUDA the Triton tests run in Triton's interpreter (tests/conftest.py) and GPU tests skip.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from cs336_systems.core.harness import Stopwatch
from cs336_systems.core.results import provenance, verdicts, write_csv
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.stages.kernel_tests.plan import (  # noqa: F401 (MAX_AUTO_WORKERS)
    MAX_AUTO_WORKERS,
    KernelTestsKnobs,
    expression_problem,
    worker_count,
)

log = get_logger(__name__)

OUTCOMES = ("passed", "failed", "error", "skipped")


def parse_junit(path: str | os.PathLike) -> list[dict]:
    """Test cases of a pytest JUnit XML as rows (test, outcome, duration_ms, message)."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (child.get("message") or (child.text or "")).strip()
                break
        rows.append(
            {
                "test": f"{case.get('classname', '')}::{case.get('name', '')}",
                "name": case.get("name", ""),
                "outcome": outcome,
                "duration_ms": float(case.get("time") or 0.0) * 1e3,
                "message": " ".join(message.split())[:200],
            }
        )
    return rows


def assign_kernel(name: str, patterns: dict[str, str]) -> str:
    for kernel, pattern in patterns.items():
        if re.search(pattern, name):
            return kernel
    return "other"


def status_of(outcome: str, message: str) -> str:
    reason = message.replace(",", ";")[:120]
    if outcome == "passed":
        return "ok"
    if outcome == "skipped":
        return f"skipped: {reason or 'skipped'}"
    return f"error: test {outcome}: {reason}"


def xdist_args(workers: int) -> list[str]:
    """`-n N` where it helps and pytest-xdist is installed; [] runs the tests in one process."""
    if workers < 2:
        return []
    if importlib.util.find_spec("xdist") is None:
        log.warning("pytest-xdist is not installed: the tests run in one process, not %d", workers)
        return []
    # worksteal: a worker that runs out takes tests queued on another, so one slow test left
    # late on a busy worker does not keep the others idle
    return ["-n", str(workers), "--dist", "worksteal"]


def run_pytest(
    files: list[str],
    junit: Path,
    select: str,
    marker: str,
    timeout_s: int,
    parallel: list[str] = (),
) -> tuple[int | None, float, str]:
    """(exit code or None on timeout, wall seconds, last lines of output); `parallel`: the
    xdist options (xdist_args)."""
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", *parallel]
    cmd += [f"--junitxml={junit}", "-o", "junit_family=xunit2"]
    if select:
        cmd += ["-k", select]
    if marker:
        cmd += ["-m", marker]
    log.info("%s", " ".join(cmd))
    watch = Stopwatch()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        seconds = watch.stop()
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.error("pytest timed out after %.0f s; its output:\n%s", seconds, out[-6000:])
        return None, seconds, out[-2000:]
    seconds = watch.stop()
    log.info("pytest exited with %s after %.1f s; its output:", proc.returncode, seconds)
    out = [proc.stdout[-20000:].rstrip(), proc.stderr[-4000:].rstrip()]
    log.info("%s", "\n".join(x for x in out if x))
    return proc.returncode, seconds, (proc.stdout + proc.stderr)[-8000:]


def first_error(output: str, width: int = 200) -> str:
    """The line that says why pytest failed: its first `E   ` line (the exception, whatever the
    paths around it), else the output's last words."""
    for line in output.splitlines():
        if line.startswith("E "):
            return " ".join(line[1:].split())[:width]
    return " ".join(output.split())[-width:]


def selection(select: str, marker: str) -> str:
    parts = [f"-k {select!r}" if select else "", f"-m {marker!r}" if marker else ""]
    return " ".join(p for p in parts if p) or "the files themselves"


def argument_problem(files: list[str], select: str, marker: str, timeout_s: int) -> str:
    """Why pytest cannot run with these arguments ('' when it can). Whether -k/-m select any
    test is pytest's own collection's answer (exit code 5, before any test runs): a separate
    collection pass would import torch and the kernels a second time."""
    missing = [f for f in files if not Path(f).is_file()]
    if not files or missing:
        return f"no test file {','.join(missing) or '(none given)'}"
    for flag, text in (("-k", select), ("-m", marker)):
        if problem := expression_problem(text):
            return f"pytest {flag} {text!r}: {problem}"
    if timeout_s < 1:
        return f"timeout {timeout_s} s: at least 1 s"
    return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (its JUnit file, where its rows go and what they say they come
    from; other test files than the block's) and the stage's knobs as one value (`--block`: its
    preset block, `KernelTestsKnobs`)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_arguments(ap)
    add_block_argument(ap, KernelTestsKnobs)
    ap.add_argument("--junit", required=True, help="the JUnit XML pytest writes")
    ap.add_argument(
        "--files",
        help="comma-separated test files run instead of the block's (a test's own suite)",
    )
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def run_rows(base: dict, patterns: dict, outcome: str, message: str, seconds: float) -> list:
    """One row per kernel for a pytest run that reported no test of its own (nothing
    selected, or pytest failed or could not start): `outcome` and `message` say which."""
    status = "skipped" if outcome == "skipped" else "error"
    return [
        {
            **base,
            "test": "<pytest run>",
            "name": "<pytest run>",
            "outcome": outcome,
            "duration_ms": seconds * 1e3,
            "message": message,
            "kernel": kernel,
            "status": f"{status}: {message.replace(',', ';')[:150]}",
        }
        for kernel in (patterns or {"other": ""})
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("kernel_tests")
    k: KernelTestsKnobs = args.block
    patterns = dict(k.kernels)
    # the test files: `--files` (comma-separated on the command line), else the block's
    files = [f for f in args.files.split(",") if f] if args.files else list(k.files)
    junit = Path(args.junit)
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    # what cannot run is said before anything runs: a status row per kernel, no pytest
    parallel = xdist_args(worker_count(1 if k.workers is None else k.workers))
    why = argument_problem(files, k.select, k.marker, k.timeout_s)
    if why:
        code, seconds, tail = None, 0.0, why
    else:
        code, seconds, tail = run_pytest(files, junit, k.select, k.marker, k.timeout_s, parallel)

    import torch

    base = {**provenance(args.machine, args.preset, args.edition), "files": ",".join(files)}
    base["cuda_available"] = torch.cuda.is_available()
    base.update(select=k.select, marker=k.marker, pytest_exit_code=code, suite_s=seconds)
    base["pytest_workers"] = int(parallel[1]) if parallel else 1
    if code == 5:
        # pytest collected the files and selected nothing: no kernel is tested
        message = f"no test of {','.join(files)} selected by {selection(k.select, k.marker)}"
        rows = run_rows(base, patterns, "skipped", message, seconds)
    elif junit.exists() and code in (0, 1):
        cases = parse_junit(junit)
        rows = [
            {
                **base,
                **case,
                "kernel": assign_kernel(case["name"], patterns),
                "status": status_of(case["outcome"], case["message"]),
            }
            for case in cases
        ]
    else:
        # pytest itself failed (collection error, crash, timeout) or could not start: every
        # kernel fails its tests
        if why:
            message = why
        else:
            what = "timed out" if code is None else f"exited with code {code}"
            message = f"pytest {what}: {first_error(tail)}"
        rows = run_rows(base, patterns, "error", message, seconds)
    write_csv(rows, args.out)
    df = pd.DataFrame(rows)
    counts = df["outcome"].value_counts().to_dict() if len(df) else {}
    log.info("wrote %s: %d tests %s; verdicts %s", args.out, len(rows), counts, verdicts(args.out))


if __name__ == "__main__":
    main()
