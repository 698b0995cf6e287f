"""The precision stage: accumulation values, autocast dtypes, LayerNorm sensitivity."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest
import torch
from pipeline_utils import block

from cs336_systems.stages.precision import measure as prec
from cs336_systems.stages.precision.plan import PrecisionKnobs


@pytest.fixture(scope="module")
def accumulation():
    return {r["variant"]: r for r in prec.accumulation_rows("cpu")}


def test_fp32_accumulation_is_close(accumulation):
    assert abs(accumulation["fp32 += fp32"]["value"] - 10.0) < 1e-3


def test_fp16_accumulation_is_not_ten(accumulation):
    fp16 = accumulation["fp16 += fp16"]
    assert fp16["value"] != 10.0
    assert fp16["abs_error"] > 1e-2
    # the fp16 sum loses because its spacing near 10 (2^-7) is comparable to the addend
    assert fp16["accumulator_ulp_at_target"] == 2**-7


def test_mixed_accumulation_error_is_the_addend_rounding(accumulation):
    implicit, explicit = accumulation["fp32 += fp16"], accumulation["fp32 += fp16.to(fp32)"]
    assert implicit["value"] == explicit["value"]
    # an fp32 accumulator adds the stored fp16 value of 0.01 almost exactly 1000 times
    assert implicit["value"] == pytest.approx(implicit["addend_sum_exact"], abs=1e-4)
    assert implicit["addend_stored"] == 0.01000213623046875


def test_bf16_accumulation_stalls(accumulation):
    # bf16 keeps 8 significant bits: past 4 the spacing (2^-5) exceeds twice the addend
    assert accumulation["bf16 += bf16"]["value"] == 4.0
    assert accumulation["fp32 += bf16"]["value"] == pytest.approx(10.009765625, abs=1e-4)
    assert abs(accumulation["fp64 += fp64"]["error"]) < 1e-12


def test_ulp():
    assert prec.ulp(10.0, torch.float16) == 2**-7
    assert prec.ulp(10.0, torch.bfloat16) == 2**-4
    assert prec.ulp(1.0, torch.float32) == 2**-23


def test_autocast_dtype_table_cpu():
    rows = {(r["autocast"], r["tensor"]): r for r in prec.dtype_rows("cpu")}
    for dtype, low in (("fp16", "float16"), ("bf16", "bfloat16")):
        if rows.get((dtype, "fc1.weight"), {}).get("status") != "ok":
            pytest.skip(f"CPU autocast has no {dtype} here")
        assert rows[(dtype, "fc1.weight")]["dtype"] == "float32"  # parameters stay fp32
        assert rows[(dtype, "fc1 output")]["dtype"] == low  # matmuls run in low precision
        assert rows[(dtype, "logits (fc2 output)")]["dtype"] == low
        assert rows[(dtype, "loss")]["dtype"] == "float32"  # cross-entropy autocasts to fp32
        assert rows[(dtype, "fc1.weight.grad")]["dtype"] == "float32"  # grads match params


def test_layernorm_sensitivity():
    rows = prec.layernorm_rows("cpu")
    get = {(r["dtype"], r["offset"], r["spread"], r["quantity"]): r for r in rows}
    # squares of values ~300 exceed fp16's range (65504): the variance overflows to inf
    assert get[("fp16", 0.0, 300.0, "variance")]["nonfinite_fraction"] == 1.0
    assert get[("bf16", 0.0, 300.0, "variance")]["nonfinite_fraction"] == 0.0
    # ...and the output silently collapses (x * rsqrt(inf) = 0), an O(1) error
    assert get[("fp16", 0.0, 300.0, "output")]["max_error"] > 1
    # E[x^2] - E[x]^2 cancels catastrophically for a large mean, even in fp32
    assert get[("fp32", 1000.0, 1.0, "variance_naive")]["max_error"] > 1e-2
    assert get[("fp32", 1000.0, 1.0, "variance")]["max_error"] < 1e-4
    # bf16 cannot even hold a feature of mean 1000 and spread 1: the output is wrong by O(1)
    assert get[("bf16", 1000.0, 1.0, "output")]["max_error"] > 1
    assert get[("fp32", 0.0, 1.0, "output")]["max_error"] < 1e-5


def test_stage_run_analysis_and_section(tmp_path):
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.precision import analysis as analysis

    knobs = PrecisionKnobs(devices=["cpu", "cuda"])
    args = argparse.Namespace(machine="test", preset="cpu", edition=2026, block=knobs)
    acc, dtypes, ln = prec.run(args)
    assert {"machine", "git_commit", "variant", "value", "status"} <= set(acc.columns)
    ran = acc[acc["status"] == "ok"]
    assert len(ran) == len(prec.ACCUMULATION_VARIANTS) * len(prec.devices())
    if not torch.cuda.is_available():
        assert (acc["status"] == "skipped: no CUDA device").sum() == 1
    assert {"fp16", "bf16"} <= set(dtypes["autocast"].dropna())
    assert {"quantity", "max_error", "nonfinite_fraction"} <= set(ln.columns)
    acc.to_csv(tmp_path / "precision.csv", index=False)
    dtypes.to_csv(tmp_path / "precision_dtypes.csv", index=False)
    ln.to_csv(tmp_path / "precision_layernorm.csv", index=False)
    figs = analysis.plot(tmp_path, tmp_path / "figures")
    assert [f.name for f in figs] == ["precision_accumulation.png", "precision_layernorm.png"]
    s = analysis.context(tmp_path)
    assert any("stalls at `4.0`" in line for line in s["accumulation"]["sentences"])
    assert any("overflows in fp16" in line for line in s["layernorm"]["sentences"])
    text = render(tmp_path, ["precision"])
    assert "Q10." in text and "`9.953125`" in text and "Q12." in text


def test_precision_memory_ratio_ignores_checkpointed_memory_rows(tmp_path):
    """The 2026 memory grid repeats (size, context, mode) with checkpointing strategies: the
    bf16/fp32 ratio compares the rows without checkpointing (it crashed on the repeated keys)."""
    import pandas as pd

    from cs336_systems.stages.precision import analysis

    rows = []
    for dtype, base in (("fp32", 100.0), ("bf16", 60.0)):
        for ckpt, scale in (("none", 1.0), ("every_1", 0.5)):
            rows.append({"size": "xl", "context_length": 2048, "mode": "train_step",
                         "precision": dtype, "checkpoint": ckpt, "status": "ok",
                         "peak_allocated_mb": base * scale})  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "memory.csv", index=False)
    s = analysis._speed_and_memory(tmp_path)
    assert "per mode: train step 0.60× (xl, context 2048) (each point" in s["memory_sentence"]


def test_precision_memory_ratio_per_mode_not_one_median_over_modes():
    """Four H200s: the forward with autograd on keeps 1.29× fp32's peak under bf16 autocast,
    the inference forwards and the training step about 1.00×; one median over the four points
    (1.02×) hid the 1.29×."""
    from cs336_systems.stages.precision import answers

    points = [("xl", 128, "inference", 1.003), ("xl", 2048, "inference", 1.042),
              ("xl", 128, "forward", 1.291), ("xl", 128, "train_step", 0.996)]  # fmt: skip
    ratio = pd.Series(
        [p[3] for p in points],
        index=pd.MultiIndex.from_tuples(
            [p[:3] for p in points], names=["size", "context_length", "mode"]
        ),
    )
    text = answers.memory_sentence(ratio, True)
    assert "1.02×" not in text and "median" not in text
    assert "inference forward 1.00× (xl, context 128) to 1.04× (xl, context 2048)" in text
    assert "forward (autograd on) 1.29× (xl, context 128); train step 1.00×" in text


def test_the_cli_reads_its_devices_from_the_block(tmp_path):
    """The rule's command: the preset block as one checked value, three CSVs."""
    outs = [tmp_path / f"{name}.csv" for name in ("acc", "dtypes", "ln")]
    run = ["run", "--machine", "m", "--preset", "cpu", *block("precision", devices=["cpu"])]
    prec.main([*run, "--out", str(outs[0]), "--dtypes-out", str(outs[1]),
               "--layernorm-out", str(outs[2])])  # fmt: skip
    assert set(pd.read_csv(outs[0])["device"]) == {"cpu"}
    with pytest.raises(SystemExit):
        prec.main([*run[:5], *block("precision", devices=["tpu"]), "--out", "x",
                   "--dtypes-out", "y", "--layernorm-out", "z"])  # fmt: skip


def test_bf16_speed_leaves_host_bound_pairs_out_by_the_one_rule():
    """small's forward: bf16 0.62x of fp32 for a 12.7x faster matmul is host-bound (the rule
    of reporting/host_bound.py, the benchmark's): named, and out of the median."""
    import pandas as pd

    from cs336_systems.stages.precision import answers as pans
    from cs336_systems.stages.precision import rows as prows

    bench = pd.DataFrame([
        {"size": s, "context_length": 512, "mode": "forward", "precision": p, "compile": "eager",
         "attention": "naive", "status": "ok", "step_ms_mean": t, "peak_tflops": peak}
        for s, p, t, peak in (("small", "fp32", 20.95, 54.0), ("small", "bf16", 33.91, 685.0),
                              ("xl", "fp32", 326.0, 54.0), ("xl", "bf16", 67.32, 685.0))
    ])  # fmt: skip
    sp = prows.speedups(bench)
    assert list(sp["host_bound"]) == [True, False]
    text = pans.speed_sentence(sp)
    assert "median speedup 4.84× over 1 points" in text
    assert "left out, host-bound by the benchmark's rule: `small` ctx 512 forward (0.62×)" in text
