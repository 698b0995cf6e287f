"""The package's one log: one format with the stage and the point in every line, no bare prints."""

from __future__ import annotations

import ast
import logging
import re

import pytest
from pipeline_utils import ROOT

from cs336_systems.core.harness import run_point
from cs336_systems.planning import log as logs
from cs336_systems.planning.knobs import block_text

PKG = ROOT / "src" / "cs336_systems"
LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?P<stage>\S+)(?: rank(?P<rank>\d+))?"
    r"(?: \[(?P<point>[^\]]*)\])? (?P<level>DEBUG|INFO |WARNING|ERROR|CRITICAL) (?P<msg>.*)$"
)


@pytest.fixture
def logged(capsys):
    """Configure the log for a stage `demo`; returns a function reading the lines written."""
    logs.configure("demo", level="INFO")
    capsys.readouterr()

    def lines() -> list[re.Match]:
        err = capsys.readouterr().err
        out = [LINE.match(line) for line in err.splitlines()]
        assert all(out), err
        return out

    yield lines
    logs.configure("-", level="INFO")


def test_every_line_carries_stage_and_point(logged):
    log = logs.get_logger("cs336_systems.stages.demo.measure")
    log.info("no point yet")
    with logs.point("small", "ctx512", "naive"):
        log.info("outer")
        with logs.point("train_step bf16 compiled"):
            log.warning("inner %d", 3)
        log.info("outer again")
    a, b, c, d = logged()
    assert (a["stage"], a["point"], a["level"], a["msg"]) == ("demo", None, "INFO ", "no point yet")
    assert (b["point"], b["msg"]) == ("small ctx512 naive", "outer")
    assert (c["point"], c["level"], c["msg"]) == (
        "small ctx512 naive | train_step bf16 compiled",
        "WARNING",
        "inner 3",
    )
    assert d["point"] == "small ctx512 naive"


def test_a_worker_names_its_rank(logged):
    logs.set_rank(1)
    with logs.point("gloo n=2"):
        logs.get_logger("cs336_systems.parallel.launch").info("hello")
    (line,) = logged()
    assert (line["stage"], line["rank"], line["point"]) == ("demo", "1", "gloo n=2")


def test_every_line_of_a_multiline_message_and_traceback_has_the_prefix(logged):
    log = logs.get_logger("cs336_systems.core.x")
    with logs.point("p"):
        log.info("first\nsecond")
        try:
            raise ValueError("boom")
        except ValueError:
            log.error("failed", exc_info=True)
    lines = logged()
    assert [m["msg"] for m in lines[:3]] == ["first", "second", "failed"]
    assert all(m["point"] == "p" for m in lines)
    assert lines[-1]["msg"] == "ValueError: boom"


def test_a_failed_point_is_a_warning_with_its_traceback_and_point(logged):
    def bad():
        raise RuntimeError("kernel exploded")

    with logs.point("fp32 n=64"):
        assert run_point(bad).status.startswith("error: RuntimeError")
    lines = logged()
    assert lines[0]["level"] == "WARNING" and lines[0]["point"] == "fp32 n=64"
    assert lines[0]["msg"].startswith("point failed with error: RuntimeError: kernel exploded")
    assert any("Traceback" in m["msg"] for m in lines)
    assert lines[-1]["msg"] == "RuntimeError: kernel exploded"


def test_configuring_again_does_not_double_lines(logged):
    logs.configure("demo")
    logs.configure("demo")
    logs.get_logger("cs336_systems.core.x").info("once")
    assert len(logged()) == 1


def test_debug_lines_show_only_when_asked(logged, monkeypatch):
    log = logs.get_logger("cs336_systems.core.x")
    log.debug("hidden")
    assert logged() == []
    monkeypatch.setenv(logs.LEVEL_ENV, "debug")
    logs.configure("demo")
    log.debug("shown")
    assert [m["msg"] for m in logged()] == ["shown"]


def test_status_level():
    assert logs.status_level("ok") == logging.INFO
    assert logs.status_level("skipped: no GPU") == logging.INFO
    assert logs.status_level("oom") == logging.WARNING
    assert logs.status_level("error: ValueError: x") == logging.WARNING


def test_a_stage_entry_point_logs_in_the_format(tmp_path, capsys):
    """The ceilings CLI on a tiny matmul: its progress lines name the stage and the point."""
    from cs336_systems.stages.ceilings.measure import main

    out = tmp_path / "c.csv"
    knobs = {"matmul_size": 64, "dtypes": ["fp32"], "copy_mb": 1, "reps": 2}
    main(["--block", block_text(knobs), "--machine=t", "--preset=cpu", f"--out={out}"])
    lines = [LINE.match(line) for line in capsys.readouterr().err.splitlines()]
    assert lines and all(lines)
    assert {m["stage"] for m in lines} == {"ceilings"}
    points = [m["point"] for m in lines]
    assert "matmul fp32 n=64" in points and "copy 1 MiB" in points
    assert lines[-1]["msg"] == f"wrote {out}: 2 rows"


def _prints(path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]


def test_no_bare_print_outside_kernels():
    """Everything the package says goes through the log (kernels/ keeps its own tooling)."""
    found = {
        str(p.relative_to(PKG)): lines
        for p in sorted(PKG.rglob("*.py"))
        if "kernels" not in p.relative_to(PKG).parts and (lines := _prints(p))
    }
    assert not found, f"print() calls, use cs336_systems.planning.log instead: {found}"


def test_python_warnings_are_logged_in_the_format():
    """A library's warning (matplotlib's, say) lands in the job log as a line of the log (in a
    fresh process: pytest records warnings itself)."""
    import subprocess
    import sys

    code = (
        "import warnings\n"
        "from cs336_systems.planning import log\n"
        "log.configure('demo')\n"
        "with log.point('plots'):\n"
        "    warnings.warn('No artists with labels found', UserWarning)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = [LINE.match(line) for line in proc.stderr.splitlines()]
    assert lines and all(lines), proc.stderr
    assert lines[0]["level"] == "WARNING" and lines[0]["point"] == "plots"
    assert "UserWarning: No artists with labels found" in lines[0]["msg"]


def test_warnings_that_say_nothing_are_dropped():
    """A library warning is logged in our format, but for those of QUIET_WARNINGS (torch's
    profiler on a schedule of one cycle, whose events we all read): in a fresh process, as
    above."""
    import subprocess
    import sys

    code = (
        "import warnings\n"
        "from cs336_systems.planning import log\n"
        "log.configure('demo')\n"
        "warnings.warn('Warning: Profiler clears events at the end of each cycle.Only events "
        "from the current cycle will be reported.', UserWarning)\n"
        "warnings.warn('a warning worth reading', UserWarning)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "a warning worth reading" in proc.stderr
    assert "Profiler clears events" not in proc.stderr, proc.stderr


def test_a_points_warnings_are_caught_and_listed_once_with_counts(logged):
    """Warnings inside points are not shown as raised: at the end each distinct one is one line
    (its count, the point that first raised it), then one summary line."""
    import warnings

    for n in (64, 128):
        with logs.point(f"n={n}"):
            for _ in range(3):
                warnings.warn("no current CUDA context", UserWarning, stacklevel=1)
            warnings.warn("TF32 not enabled", UserWarning, stacklevel=1)
    assert logged() == []  # nothing yet
    logs.report_warnings()
    lines = logged()
    assert len(lines) == 3, [m.string for m in lines]
    first, second, summary = lines
    assert first["level"] == "WARNING" and first["point"] == "n=64"
    assert first["msg"].startswith("6x UserWarning: no current CUDA context (")
    assert "test_log.py:" in first["msg"]
    assert second["msg"].startswith("2x UserWarning: TF32 not enabled")
    assert summary["level"] == "INFO " and summary["point"] is None
    assert summary["msg"].startswith("8 Python warnings (2 distinct) in 1 points")
    logs.report_warnings()
    assert logged() == []  # listed once


def test_under_the_workflow_the_list_and_tracebacks_are_marked_for_the_log_alone(
    logged, monkeypatch, capsys
):
    import warnings

    monkeypatch.setenv(logs.LOG_ONLY_ENV, "1")
    with logs.point("p"):
        warnings.warn("said once", UserWarning, stacklevel=1)
        assert run_point(lambda: 1 / 0).status.startswith("error: ZeroDivisionError")
    logs.report_warnings()
    err = capsys.readouterr().err.splitlines()
    shown = [line for line in err if not line.startswith(logs.LOG_ONLY)]
    held = [line[1:] for line in err if line.startswith(logs.LOG_ONLY)]
    assert [LINE.match(line)["msg"] for line in shown] == [
        "point failed with error: ZeroDivisionError: division by zero",
        "1 Python warnings (1 distinct) in 1 points, each listed once in the job's log",
    ]
    assert any("Traceback" in line for line in held)
    assert any("1x UserWarning: said once" in line for line in held)
    assert all(LINE.match(line) for line in held)


def test_warning_lines_counts_a_logs_warning_lines():
    text = "\n".join(
        [
            "2026-11-28 14:52:27 memory [xl] WARNING point failed with oom",
            "2026-11-28 14:52:27 memory [xl] INFO  1 Python warnings ...",
            "rule memory:",
            "WARNING: a Snakemake warning",
            "NOWARNINGS here",
        ]
    )
    assert logs.warning_lines(text) == (2, 5)
