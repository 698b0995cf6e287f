"""The ceilings stage measures each dtype at several sizes and repeats and keeps the best: every
measurement is a row and a report cell, the best is marked and is what MFU divides by."""

from __future__ import annotations

import pandas as pd
from fixture_rows import benchmark_rows, ceilings_rows, write_results
from pipeline_utils import block

from cs336_systems.core.costs import matmul_peaks
from cs336_systems.stages.ceilings import analysis, measure, plan


def test_every_size_and_repeat_is_a_row_and_the_best_is_marked(tmp_path):
    out = tmp_path / "ceilings.csv"
    knobs = block(
        "ceilings", matmul_size=32, matmul_size_of={"fp32": 48}, extra_sizes={"fp32": [64]},
        repeats=2, dtypes=["fp32", "bf16"], copy_mb=1, reps=2,
    )  # fmt: skip
    measure.main(["--machine", "m", "--preset", "cpu", *knobs, "--out", str(out)])
    df = pd.read_csv(out)
    mm = df[df["kind"] == "matmul"]
    # fp32 at 48 and 64, bf16 (both paths) at 32; each twice
    assert sorted(mm[mm["dtype"] == "fp32"]["size"]) == [48, 48, 64, 64]
    assert len(mm[mm["dtype"] == "bf16"]) == 4 and set(mm["repeat"]) == {1, 2}
    best = mm[mm["best"]]
    assert len(best) == 3  # one per (dtype, path)
    for _, g in mm.groupby(["dtype", "path"]):
        assert g.loc[g["best"], "tflops"].item() == g["tflops"].max()
    assert matmul_peaks(df)["fp32"] == mm[mm["dtype"] == "fp32"]["tflops"].max()


def knobs(block: dict):
    """A block as the stage's typed knobs (the copy and the reps, which the helpers do not
    read, filled in)."""
    return plan.CeilingsKnobs.from_block({"copy_mb": 1, "reps": 5, **block})


def test_the_config_helpers():
    cfg = {"matmul_size": 8192, "matmul_size_of": {"fp32": 1024},
           "extra_sizes": {"fp32": [2048], "bf16": [4096, 8192]}, "dtypes": ["bf16", "fp32"]}  # fmt: skip
    assert plan.sizes_of(knobs(cfg)) == {"bf16": [8192, 4096], "fp32": [1024, 2048]}
    assert plan.sizes_of(knobs({"matmul_size": 64, "dtypes": ["fp32"]})) == {"fp32": [64]}


def test_a_runs_rows_say_what_it_measured():
    """The time budget estimates a reference run's ceilings job from its rows (as_measured)."""
    rows = pd.DataFrame(
        {"kind": ["matmul"] * 3 + ["copy"], "dtype": ["fp32", "fp32", "bf16", "fp32"],
         "size": [1024, 2048, 512, 2**28], "repeat": [1, 2, 2, None], "warm_s": [2.0] * 4}
    )  # fmt: skip
    cfg = {"matmul_size": 8192, "dtypes": ["bf16", "fp32"], "copy_mb": 1, "reps": 5}
    plan.as_measured(cfg, rows)
    assert plan.sizes_of(knobs(cfg)) == {"bf16": [512], "fp32": [1024, 2048]}
    assert cfg["repeats"] == 2 and cfg["warm_s"] == 2.0


def test_the_report_lists_every_measurement_and_says_what_reads_each(tmp_path):
    rows = pd.concat([ceilings_rows(), ceilings_rows(fp32=0.7)], ignore_index=True)
    rows["repeat"] = [1] * (len(rows) // 2) + [2] * (len(rows) // 2)
    results = write_results(tmp_path / "r", ceilings=rows)
    ctx = analysis.context(results)
    assert "1024²: 0.500, 0.700" in ctx["table"] and "| 0.700 TFLOP/s" in ctx["table"]
    assert ctx["peaks"]["fp32"] == 0.7 and ctx["repeats"] == 2
    # no benchmark rows to tell: the model's points are named as users
    assert "MFU of the model's fp32 points   " in ctx["table"]  # a padded cell, no note
    bf16_only = benchmark_rows()
    bf16_only = bf16_only[bf16_only["precision"] == "bf16"]
    results = write_results(tmp_path / "r2", ceilings=rows, benchmark=bf16_only)
    assert "MFU of the model's fp32 points (none in this run)" in analysis.context(results)["table"]
