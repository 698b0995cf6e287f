"""planning/tee.py: a job's output to its log and the console, the marked lines to the log alone."""

from __future__ import annotations

import os
import subprocess
import sys

from cs336_systems.planning.log import LOG_ONLY, LOG_ONLY_ENV

STAGE = """
import warnings
from cs336_systems.planning import log
from cs336_systems.core.harness import run_point
log.configure("demo")
with log.point("p"):
    for _ in range(10):
        warnings.warn("said ten times", UserWarning)
    run_point(lambda: 1 / 0)
log.get_logger("x").info("done")
"""


def test_a_jobs_warnings_and_tracebacks_reach_its_log_alone(tmp_path):
    """A stage as the workflow runs it ($CS336_LOG_ONLY, `2>&1 | tee`): the console keeps the
    failed point, the last line and one summary; the log has every line, unmarked."""
    log = tmp_path / "job.log"
    env = {**os.environ, LOG_ONLY_ENV: "1"}
    stage = subprocess.Popen(
        [sys.executable, "-c", STAGE], stderr=subprocess.STDOUT, stdout=subprocess.PIPE, env=env
    )
    tee = subprocess.run(
        [sys.executable, "-m", "cs336_systems.planning.tee", str(log)],
        stdin=stage.stdout,
        capture_output=True,
        timeout=60,
    )
    stage.stdout.close()
    assert stage.wait(timeout=60) == 0 and tee.returncode == 0
    console = tee.stdout.decode().splitlines()
    assert [line.split(" ", 3)[3] for line in console] == [
        "[p] WARNING point failed with error: ZeroDivisionError: division by zero",
        "INFO  done",
        "INFO  10 Python warnings (1 distinct) in 1 points, each listed once in the job's log",
    ]
    text = log.read_text()
    assert LOG_ONLY not in text
    assert text.count("said ten times") == 1 and "10x UserWarning: said ten times" in text
    assert "Traceback (most recent call last):" in text
    assert len(text.splitlines()) > len(console) + 3
