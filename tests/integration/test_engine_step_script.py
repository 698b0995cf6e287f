"""benchmarks/engine_step.py, the GPU step timings, in its CPU smoke mode: every variant of our
model is a row that ran, timed by both timers, with MFU against the ceilings' peak of its path."""

from __future__ import annotations

import importlib.util
import math

from fixture_rows import ceilings_rows
from pipeline_utils import ROOT

from cs336_systems.core.results import read_csv

SCRIPT = ROOT / "benchmarks" / "engine_step.py"


def script():
    spec = importlib.util.spec_from_file_location("engine_step_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_writes_one_ok_row_per_variant_with_phases_and_mfu(tmp_path, monkeypatch):
    # as the script runs outside pytest: master weights through torch ops, not the interpreter
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    peak = tmp_path / "ceilings.csv"
    ceilings_rows(bf16=0.1, autocast=1.0).to_csv(peak, index=False)
    variants = ["plain", "engine", "engine_mw"]
    args = ["--smoke", "--context", "32", "--variants", ",".join(variants), "--profile"]
    script().main([str(tmp_path / "out"), *args, "--peak-csv", str(peak)])
    df = read_csv(tmp_path / "out" / "engine_step.csv").set_index("variant")
    assert list(df.index) == variants and set(df["status"]) == {"ok"}
    for col in ("step_ms_median", "fwd_ms_median", "bwd_ms_median", "opt_ms_median"):
        assert (df[col] > 0).all(), col
    assert (df["bench_step_ms_median"] > 0).all() and (df["breakdown_optimizer_ms"] > 0).all()
    assert df.loc["engine_mw", "master_weights"] and not df.loc["engine", "master_weights"]
    assert dict(df["matmul_path"]) == {
        "plain": "autocast_linear",
        "engine": "autocast_linear",
        "engine_mw": "matmul",
    }
    assert dict(df["peak_tflops"]) == {"plain": 1.0, "engine": 1.0, "engine_mw": 0.1}
    for v in variants:
        assert math.isclose(df.loc[v, "mfu"] * df.loc[v, "peak_tflops"], df.loc[v, "tflops"])


def test_points_past_the_budget_are_skipped_rows(tmp_path):
    """Without --peak-csv the ceilings stage measures the peak first (its CSV beside the rows);
    a budget already spent skips every point instead of running it."""
    out = tmp_path / "out"
    script().main([str(out), "--smoke", "--variants", "plain,engine", "--budget-s", "1e-9"])
    df = read_csv(out / "engine_step.csv")
    assert len(df) == 2 and df["status"].str.startswith("skipped: ").all()
    ceilings = read_csv(out / "ceilings.csv")
    assert set(ceilings.loc[ceilings["kind"] == "matmul", "path"]) == {"matmul", "autocast_linear"}
