"""The benchmark's cost guard: a point whose FLOPs at this machine's measured matmul rate (the
ceilings stage) would take longer than the preset's max_point_s is a `skipped:` row."""

from __future__ import annotations

import pandas as pd
import torch

from cs336_systems.stages.benchmark import mfu
from cs336_systems.stages.benchmark.measure import run_grid, step_flops

# a CPU without bf16 units, as the ceilings stage measured one: TFLOP/s per path
CEILINGS = pd.DataFrame(
    [
        {"kind": "matmul", "dtype": "fp32", "path": "matmul", "status": "ok", "tflops": 0.018},
        {"kind": "matmul", "dtype": "bf16", "path": "matmul", "status": "ok", "tflops": 0.5},
        {"kind": "matmul", "dtype": "bf16", "path": "autocast_linear", "status": "ok",
         "tflops": 0.00087},
        {"kind": "copy", "dtype": "fp32", "path": "copy_", "status": "ok", "tflops": None},
    ]
)  # fmt: skip


def test_rates_are_those_of_the_models_paths():
    rates = mfu.model_rates(CEILINGS)
    # bf16 through autocast F.linear, not the plain bf16 matmul's much higher rate
    assert rates == {"fp32": (0.018, "matmul"), "bf16": (0.00087, "autocast_linear")}
    assert mfu.model_rates(None) == {}


def test_small_bf16_is_skipped_with_the_measured_rate_and_fp32_runs():
    rates = mfu.model_rates(CEILINGS)
    flops = step_flops("small", 64, 4, "train_step")
    why = mfu.too_costly(flops, 4, "bf16", rates, 60)
    seconds = 4 * flops / 0.00087e12
    assert why.startswith(f"skipped: at least {seconds:.0f} s (4 steps of {flops / 1e9:.1f} GFLOP")
    assert "0.00087 TFLOP/s through autocast F.linear" in why and "max_point_s of 60 s" in why
    # the same point in fp32 takes 4 x 98 GFLOP / 18 GFLOP/s, about 22 s: it runs
    assert mfu.too_costly(flops, 4, "fp32", rates, 60) == ""
    assert mfu.too_costly(flops, 4, "fp32", rates, 10) != ""
    # no limit or no measured rate: the point runs
    assert mfu.too_costly(flops, 4, "bf16", rates, None) == ""
    assert mfu.too_costly(flops, 4, "bf16", {}, 60) == ""


def test_run_grid_rows_for_skipped_points_and_measures_the_rest():
    rates = {"fp32": (1e3, "matmul"), "bf16": (1e-9, "autocast_linear")}
    kw = dict(
        size="tiny", context_length=8, modes=["forward"], compiles=["eager"], attention="naive",
        batch_size=1, warmup=0, steps=1, device=torch.device("cpu"), base={}, rates=rates,
        max_point_s=1.0,
    )  # fmt: skip
    rows = run_grid(precisions=["fp32", "bf16"], **kw)
    by = {r["precision"]: r for r in rows}
    assert by["fp32"]["status"] == "ok" and by["fp32"]["step_ms_mean"] > 0
    assert by["bf16"]["status"].startswith("skipped: at least ")
    assert "step_ms_mean" not in by["bf16"]
    # every point skipped: rows without building the model
    only = run_grid(precisions=["bf16"], **kw)
    assert [r["status"][:8] for r in only] == ["skipped:"] and only[0]["size"] == "tiny"
