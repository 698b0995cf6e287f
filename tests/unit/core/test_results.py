"""What the results files look like on disk: written atomically, with the mode a plain `open()`
would give them under the umask (a group's shared results folder stays readable)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fixture_rows import benchmark_rows, ceilings_rows, write_results

from cs336_systems.core import results
from cs336_systems.reporting import aggregate, report


@pytest.fixture
def umask():
    """Sets the process's umask for a test, and restores it."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_csvs_get_the_mode_the_umask_gives(tmp_path, umask, mask, expected):
    umask(mask)
    one = tmp_path / "a" / "one.csv"
    results.write_csv([{"x": 1, "status": "ok"}], one)
    assert mode(one) == expected
    # the aggregate rule's CLI (a concatenation) writes through the same function
    out = tmp_path / "stage.csv"
    aggregate.main(["--out", str(out), str(one)])
    assert mode(out) == expected
    # and no temp file is left behind
    assert sorted(p.name for p in tmp_path.rglob("*.tmp")) == []


def test_the_report_is_readable_by_the_group(tmp_path, umask):
    umask(0o022)
    run = write_results(
        tmp_path / "results" / "fixture-cpu", benchmark=benchmark_rows(), ceilings=ceilings_rows()
    )
    out = tmp_path / "report" / "fixture-cpu" / "report.md"
    report.main(["--results", str(run), "--out", str(out), "--stages", "ceilings,benchmark"])
    assert mode(out) == 0o644
