"""Every stage's figures, drawn by its `analysis.plot` from committed runs' CSVs
(report/reference/<run>/csv): no text artist (a title, an axis or tick label, a legend entry, an
annotation) over another; and from the same CSVs with every row failed or skipped, each figure
still drawn, or a placeholder that says why (never a crash)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pandas as pd
import pytest
from figure_checks import collisions_while

from cs336_systems.reporting import report

ROOT = Path(__file__).resolve().parents[2]
RUNS = ["cpu", "h100-80gb-hbm3", "h200-x4"]
STAGES = report.all_stages()
# (stage, run): figures whose labels are known to collide (strict: a fixed one left here fails)
KNOWN_COLLISIONS: dict[tuple[str, str], str] = {}
# statuses a run's rows take when nothing measured: each run's CSVs get one of them
# (one run: the GPU one, which draws every single-GPU figure; the statuses' wording is the
# figures' own business, not the run's)
FAILED = {"h100-80gb-hbm3": "error: injected"}


def csv_dir(run: str) -> Path:
    path = ROOT / "report" / "reference" / run / "csv"
    if not path.is_dir():
        pytest.skip(f"no committed run {run}")
    return path


def plot(stage: str, results: Path, out: Path) -> dict[str, list]:
    """{PNG name: its colliding text pairs} of the stage's figures drawn into `out` (PNGs only:
    the pipeline and stage tests write the PDF copies), from a copy of `results`' CSVs (a plots
    job also keeps files beside its results: the ddp and fsdp HTA readings, which a committed
    run's folder must not gain)."""
    module = importlib.import_module(f"cs336_systems.stages.{stage}.analysis")
    copy = out.parent / f"{out.name}-results"
    copy.mkdir(parents=True, exist_ok=True)
    for csv in Path(results).glob("*.csv"):
        shutil.copy2(csv, copy / csv.name)
    with collisions_while(vector=False) as found:
        module.plot(copy, out)
    return found


def _cases():
    for run in RUNS:
        for stage in STAGES:
            known = KNOWN_COLLISIONS.get((stage, run))
            marks = [pytest.mark.xfail(reason=known, strict=True)] if known else []
            yield pytest.param(stage, run, marks=marks, id=f"{stage}-{run}")


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """(stage, run) -> the figures plot() drew from the run's CSVs, drawn once for both tests."""
    done: dict[tuple[str, str], dict[str, list]] = {}

    def draw(stage: str, run: str) -> dict[str, list]:
        if (stage, run) not in done:
            out = tmp_path_factory.mktemp(f"{stage}-{run}") / "figures"
            done[stage, run] = plot(stage, csv_dir(run), out)
        return done[stage, run]

    return draw


@pytest.mark.parametrize(("stage", "run"), list(_cases()))
def test_no_label_collides_with_another(stage, run, drawn):
    found = drawn(stage, run)
    assert {png: pairs for png, pairs in found.items() if pairs} == {}


def test_the_known_collisions_name_real_cases():
    assert {s for s, _ in KNOWN_COLLISIONS} <= set(STAGES)
    assert {r for _, r in KNOWN_COLLISIONS} <= set(RUNS)


def failed_copy(src: Path, dst: Path, status: str) -> Path:
    """`src`'s CSVs with every row's status `status` (a CSV without one as it is)."""
    dst.mkdir(parents=True, exist_ok=True)
    for csv in src.glob("*.csv"):
        df = pd.read_csv(csv, low_memory=False)
        if "status" in df:
            df["status"] = status
        df.to_csv(dst / csv.name, index=False)
    return dst


@pytest.mark.parametrize("run", sorted(FAILED))
@pytest.mark.parametrize("stage", STAGES)
def test_every_figure_is_drawn_or_explained_when_no_row_ran(stage, run, tmp_path, drawn):
    """The figure rule's outputs (the PNGs a run whose rows passed draws) exist when every row
    failed: a figure of what there is, or a placeholder naming why."""
    wanted = set(drawn(stage, run))
    failed = failed_copy(csv_dir(run), tmp_path / "csv", FAILED[run])
    drawn = set(plot(stage, failed, tmp_path / "failed"))
    assert wanted <= drawn
    for png in drawn:
        assert (tmp_path / "failed" / png).stat().st_size > 1000
    # and from CSVs with a header and no row at all
    empty = tmp_path / "empty"
    empty.mkdir()
    for csv in csv_dir(run).glob("*.csv"):
        pd.read_csv(csv, nrows=0).to_csv(empty / csv.name, index=False)
    assert wanted <= set(plot(stage, empty, tmp_path / "empty_figs"))
