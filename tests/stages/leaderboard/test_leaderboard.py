"""The leaderboard's rules: the 10-minute budget, the breakdown's classes, the FLOP count."""

from __future__ import annotations

import shlex

import pytest
from pipeline_utils import block

from cs336_systems.core.costs import matmul_param_count, train_step_flops
from cs336_systems.engine.leaderboard_rules import (
    benchmark_seconds,
    breakdown,
    classify,
    fits_budget,
)


def test_budget_counts_setup_and_do_bench_phases():
    assert benchmark_seconds(100.0, 5.0) == pytest.approx(140.0)
    assert fits_budget(559.0, 4000.0)  # 559 + 10 + 30 = 599 s
    assert not fits_budget(561.0, 4000.0)


def test_a_step_longer_than_do_bench_phases_counts_whole_steps():
    # an 8B step of 40 s: do_bench still runs one warm-up and one measured step
    assert benchmark_seconds(0.0, 40_000.0) == pytest.approx(80.0)
    with pytest.raises(ValueError):
        benchmark_seconds(1.0, 0.0)


@pytest.mark.parametrize(
    "name, part",
    [
        ("aten::mm", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
        ("_attn_fwd_kernel", "attention"),
        ("aten::_softmax", "attention"),
        ("_LinearCrossEntropyBackward", "loss"),
        ("aten::logsumexp", "loss"),
        ("aten::_fused_adamw_", "optimizer"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16", "communication"),
        ("gloo:all_gather", "communication"),
        ("aten::add_", "other"),
    ],
)
def test_classify(name, part):
    assert classify(name) == part


def test_breakdown_sums_per_part():
    out = breakdown([("aten::mm", 2.0), ("aten::addmm", 1.0), ("aten::add", 0.5)])
    assert out["matmul"] == 3.0 and out["other"] == 0.5 and out["loss"] == 0.0


def test_the_8b_step_count():
    """7.5 B matmul parameters; 6 N x 65,536 tokens plus causal attention over 34 layers."""
    n = matmul_param_count(151_936, 4096, 34, 11_008)
    assert n == pytest.approx(7.5e9, rel=0.01)
    flops = train_step_flops(151_936, 4096, 34, 11_008, 2, 32_768)
    attention = 34 * 2 * 3.5 * 4 * 32_768**2 * 4096 / 2
    assert flops == pytest.approx(6 * n * 65_536 + attention)
    assert 4.9e15 < flops < 5.1e15


GPU_RUN = ["--machine", "m", "--preset", "gpu", "--out", "/tmp/never.csv"]


def test_a_missing_world_size_is_skipped_rows_with_the_command(monkeypatch):
    from cs336_systems.stages.leaderboard import measure

    monkeypatch.setattr("cs336_systems.core.device.gpu_count", lambda: 0)
    argv = [*GPU_RUN, "--plans", "full,reduced", *block("leaderboard", "gpu")]
    args = measure.parse_args(argv)
    rows = measure.run(args, argv)
    assert [(r["config"], r["variant"]) for r in rows] == [("full", "engine"), ("full", "plain")]
    for r in rows:
        assert r["status"].startswith("skipped:")
        assert r["command"].startswith("python3 -m cs336_systems.stages.leaderboard --machine")
        assert r["d_model"] == 4096 and r["num_layers"] == 34
    # the command runs the same block again
    rerun = measure.parse_args(shlex.split(rows[0]["command"])[3:])
    assert rerun.block == args.block and rerun.plans == ["full", "reduced"]


def test_one_gpu_runs_the_reduced_configuration_on_one_process(monkeypatch):
    from cs336_systems.parallel import launch as launcher
    from cs336_systems.stages.leaderboard import measure

    monkeypatch.setattr("cs336_systems.core.device.gpu_count", lambda: 1)
    monkeypatch.setattr(launcher, "gpu_count", lambda: 1)
    launched = []

    def fake_launch(module, argv, topology, **kw):
        launched.append((argv, topology))
        row = {"config": "reduced", "variant": "engine", "status": "ok"}
        return launcher.LaunchResult("ok", 0, 1.0, [row])

    monkeypatch.setattr(launcher, "launch", fake_launch)
    argv = [*GPU_RUN, "--plans", "full,reduced", *block("leaderboard", "gpu")]
    args = measure.parse_args(argv)
    rows = measure.run(args, argv)
    by = {(r["config"], r["variant"]): r for r in rows}
    assert by[("full", "engine")]["status"].startswith("skipped: needs 2 GPUs")
    assert by[("reduced", "engine")]["status"] == "ok"
    assert by[("reduced", "engine")]["world_size"] == 1
    assert by[("reduced", "plain")]["status"].startswith("error")  # no row from the workers
    assert [t for _, t in launched] == [launcher.Topology(1)]
    # the worker gets the same block (reduced_layers caps its layers) and its configuration
    worker = measure.parse_args(launched[0][0])
    assert worker.block == args.block and worker.config == "reduced" and worker.pinned == ""
    k = worker.block
    assert k.reduced_layers == 4 and k.compile and k.warmup_steps == 2


def test_the_memory_model_skips_before_allocating():
    from types import SimpleNamespace

    import torch

    from cs336_systems.stages.leaderboard import measure

    dims = dict(
        vocab=151_936,
        d_model=4096,
        d_ff=11_008,
        num_layers=34,
        num_heads=32,
        context_length=32_768,
        batch=2,
    )
    ctx = SimpleNamespace(device=torch.device("cpu"))
    for variant in ("engine", "plain"):
        reason, need = measure.memory_check(variant, dims, 34, ctx, 1)
        assert reason.startswith("skipped: needs ") and " GB per rank, have " in reason
        assert need["need_gb"] > need["free_gb"] * 0.85
    # a tiny model fits
    tiny = {**dims, "vocab": 100, "d_model": 32, "d_ff": 64, "num_heads": 4, "context_length": 16}
    assert measure.memory_check("engine", tiny, 2, ctx, 1)[0] is None


def _ceilings(path, matmul: float, autocast: float):
    """A ceilings CSV: bf16 through a plain matmul and through autocast F.linear, fp32 50."""
    import pandas as pd

    rows = [("bf16", "matmul", matmul), ("bf16", "autocast_linear", autocast)]
    rows.append(("fp32", "matmul", 50.0))
    pd.DataFrame(
        [
            {"kind": "matmul", "dtype": dt, "path": p, "status": "ok", "tflops": t}
            for dt, p, t in rows
        ]
    ).to_csv(path, index=False)
    return path


def test_peak_tflops_reads_the_bf16_matmul_row(tmp_path):
    from cs336_systems.stages.leaderboard.mfu import peak_tflops

    path = _ceilings(tmp_path / "ceilings.csv", 700.0, 650.0)
    assert peak_tflops(str(path)) == 700.0
    assert peak_tflops(str(path), "autocast_linear") == 650.0
    assert peak_tflops(str(tmp_path / "absent.csv")) != peak_tflops(str(tmp_path / "absent.csv"))


def test_mfu_is_against_the_peak_of_each_variants_matmul_path(tmp_path):
    """The plain model (fp32 weights, bf16 autocast) against autocast F.linear's peak; the
    engine on CUDA against the plain bf16 matmul's (one device: bf16 working weights, as
    engine/step.py resolve_master_weights decides; several: FSDP gathers bf16 weights), on the
    CPU against autocast's; rows from before the path was recorded get it inferred."""
    import pandas as pd
    import torch

    from cs336_systems.engine.step import EngineOptions, resolve_master_weights
    from cs336_systems.stages.leaderboard.mfu import matmul_path, with_path_mfu

    for dev, world in [("cuda", 1), ("cpu", 1), ("cpu", 2)]:
        master = resolve_master_weights(EngineOptions(precision="bf16"), torch.device(dev), world)
        assert (matmul_path("engine", dev, world) == "matmul") == master
        assert matmul_path("plain", dev, world) == "autocast_linear"
    assert matmul_path("engine", "cuda", 2) == "matmul"  # FSDP's bf16 gathers
    ceilings = _ceilings(tmp_path / "ceilings.csv", 800.0, 600.0)
    rows = pd.DataFrame(
        [
            {"variant": "engine", "backend": "nccl", "world_size": 1, "tflops": 400.0},
            {"variant": "plain", "backend": "nccl", "world_size": 1, "tflops": 300.0},
            {"variant": "engine", "backend": "gloo", "world_size": 2, "tflops": 0.6},
            {"variant": "engine", "backend": "nccl", "world_size": 2, "tflops": 800.0},
        ]
    )
    out = with_path_mfu(rows, ceilings)
    assert list(out["matmul_path"]) == ["matmul", "autocast_linear", "autocast_linear", "matmul"]
    assert list(out["mfu"]) == [0.5, 0.5, 0.6 / 1200, 0.5]
    assert list(out["peak_tflops"]) == [800.0, 600.0, 1200.0, 1600.0]
    # beside the measured ceiling, the datasheet's dense bf16 peak of the device (989.5 on an
    # H100 SXM), every rank's; a device the table does not list has none
    rows["device_name"] = ["NVIDIA H100 80GB HBM3"] * 2 + ["AMD EPYC"] + ["NVIDIA H200"]
    out = with_path_mfu(rows, ceilings)
    assert out["mfu_datasheet"].iloc[0] == 400.0 / 989.5
    assert out["mfu_datasheet"].iloc[3] == 800.0 / (2 * 989.5)
    assert pd.isna(out["mfu_datasheet"].iloc[2])


def test_a_cpu_step_splits_into_parts_that_add_up_and_finds_the_loss():
    """A step with a matmul, the fused cross-entropy (forward and backward) and an optimizer
    step, profiled on the CPU: the main thread's operator self time by part plus the rest
    (host) is the step's host time; the loss's operators (under `_LinearCrossEntropy` and its
    backward node) are the loss, the plain matmul a matmul, AdamW the optimizer."""
    import torch

    from cs336_systems.engine.fused_ce import linear_cross_entropy
    from cs336_systems.stages.leaderboard.measure import _profile

    torch.manual_seed(0)
    w1 = torch.randn(64, 64, requires_grad=True)
    head = torch.randn(500, 64, requires_grad=True)
    opt = torch.optim.AdamW([w1, head], foreach=True)
    x, targets = torch.randn(256, 64), torch.randint(0, 500, (256,))

    def step():
        h = x @ w1
        linear_cross_entropy(h, head, targets, chunk=64).backward()
        opt.step()
        opt.zero_grad()

    step()
    parts = _profile(step, torch.device("cpu"))
    window = parts.pop("window_ms")
    assert sum(parts.values()) == pytest.approx(window, rel=1e-6)
    assert parts["loss_ms"] > 0 and parts["matmul_ms"] > 0 and parts["optimizer_ms"] > 0
    assert parts["host_ms"] >= 0


def test_the_section_of_a_gloo_run_names_its_clock_and_path_peaks(tmp_path):
    """The CPU reference's rows (gloo, two ranks, fp32 weights under autocast for both
    variants): MFU against autocast F.linear's peak, and no do_bench claim without CUDA."""
    import shutil

    import pandas as pd
    from pipeline_utils import ROOT

    from cs336_systems.core.costs import matmul_peaks
    from cs336_systems.reporting import report
    from cs336_systems.stages.leaderboard import rows as report_rows

    ref = ROOT / "report" / "reference" / "cpu" / "csv"
    for name in ("leaderboard", "ceilings"):
        shutil.copy(ref / f"{name}.csv", tmp_path / f"{name}.csv")
    autocast = matmul_peaks(pd.read_csv(tmp_path / "ceilings.csv"), "autocast_linear")["bf16"]
    rows = report_rows.load_rows(tmp_path)
    engine = rows[rows["variant"] == "engine"].iloc[0]
    assert engine["matmul_path"] == "autocast_linear"
    assert engine["mfu"] == engine["tflops"] / (2 * autocast)
    text = " ".join(report.render(tmp_path, ["leaderboard"]).split())
    assert "which needs CUDA: this run timed its steps on the host clock" in text


def _committed_run(tmp_path, folder: str):
    """(the leaderboard section's context, its CSV, the full engine row) of a committed run's
    leaderboard and ceilings CSVs under `folder` (from the project root)."""
    import shutil

    import pandas as pd
    from pipeline_utils import ROOT

    from cs336_systems.stages.leaderboard import analysis

    for name in ("leaderboard", "ceilings"):
        shutil.copy(ROOT / folder / f"{name}.csv", tmp_path / f"{name}.csv")
    df = pd.read_csv(tmp_path / "leaderboard.csv")
    full = df[(df["config"] == "full") & (df["variant"] == "engine")].iloc[0]
    return analysis.context(tmp_path), df, full


def test_the_two_gpu_reference_section_withholds_a_halved_breakdown_and_flags_lost_rows(tmp_path):
    """The 2x H200 run kept as test data: its leaderboard rows: the engine's step and MFU against the bf16
    matmul path, the choices it measured, its breakdown withheld (recorded before the
    profiler's own ranges were left out), and the ablation rows after the first whose GPUs had
    less memory free than the first's flagged instead of read as the configuration's."""

    ctx, df, full = _committed_run(tmp_path, "tests/fixtures/h200-x2")
    assert f"takes {full.step_ms_median / 1e3:.3f} s on 2 ranks" in ctx["q37"]
    assert "`matmul`" in ctx["q37"]
    assert ctx["breakdown_unsound"] and not ctx["breakdown_table"]
    assert any("SDPA's cuDNN" in c for c in ctx["choices"])
    lost = [r for r in ctx["ablation_table"].splitlines() if "memory earlier rows kept" in r]
    abl = df[df["config"] == "ablation"]
    first = abl["free_gb"].iloc[0]
    assert len(lost) == int(((abl["free_gb"] < 0.9 * first) & (abl["status"] != "ok")).sum())
    assert len(lost) >= 1


def test_a_current_gpu_breakdown_is_shown_and_adds_up():
    """A row with breakdown_version 2: per rank, the parts add up to the step's window."""
    import pandas as pd

    from cs336_systems.stages.leaderboard import rows as report_rows

    parts = {"attention": 2000.0, "matmul": 2100.0, "loss": 350.0, "optimizer": 33.0,
             "other": 200.0, "communication_exposed": 20.0, "idle": 7.0}  # fmt: skip
    row = {"backend": "nccl", "breakdown_version": 2}
    for r in (0, 1):
        for p, v in parts.items():
            row[f"breakdown_r{r}_{p}_ms"] = v
        row[f"breakdown_r{r}_window_ms"] = sum(parts.values())
    r = pd.Series(row)
    assert not report_rows.breakdown_unsound(r)
    table, off = report_rows.breakdown_table(r)
    assert off == [] and len(table) == 2
    row["breakdown_r1_window_ms"] += 50  # a rank whose parts miss 50 ms is named
    assert report_rows.breakdown_table(pd.Series(row))[1] == ["rank 1: 4,710 of 4,760 ms"]


def test_ablation_rows_run_the_engines_checkpointing_and_differences_are_attributed_only_then(
    tmp_path,
):
    """Each ablation row changes one thing: it runs the checkpointing the engine row ran (read
    from the runs CSV), except the rows whose change is the checkpointing; a row that ran another
    plan, or whose steps overlap the engine's, is not read as what its optimization buys."""
    import pandas as pd

    from cs336_systems.stages.leaderboard import rows as report_rows
    from cs336_systems.stages.leaderboard.measure import engine_checkpointing
    from cs336_systems.stages.leaderboard.plan import pins_checkpointing

    assert pins_checkpointing("sdpa", "mixed_p3_f25")
    assert pins_checkpointing("no_prefetch", "ffn")
    assert not pins_checkpointing("whole_blocks", "mixed_p3_f25")  # its change is the plan
    assert not pins_checkpointing("every_2", "ffn")
    assert not pins_checkpointing("sdpa", "") and not pins_checkpointing("sdpa", "auto")

    base = {"backend": "nccl", "world_size": 2, "status": "ok", "free_gb": 149.0}
    rows = [
        {**base, "config": "full", "variant": "engine", "ablation": "",
         "checkpointing": "mixed_p3_f25", "step_ms_median": 5236.0, "step_ms_min": 5220.0,
         "step_ms_max": 5250.0},
        {**base, "config": "full", "variant": "plain", "ablation": "", "status": "skipped: x"},
        {**base, "config": "ablation", "variant": "engine", "ablation": "sdpa",
         "checkpointing": "ffn", "step_ms_median": 5079.0, "step_ms_min": 5070.0,
         "step_ms_max": 5090.0},
        {**base, "config": "ablation", "variant": "engine", "ablation": "fsdp_per_layer",
         "checkpointing": "mixed_p3_f25", "step_ms_median": 5521.0, "step_ms_min": 5510.0,
         "step_ms_max": 5530.0},
        {**base, "config": "ablation", "variant": "engine", "ablation": "no_prefetch",
         "checkpointing": "mixed_p3_f25", "step_ms_median": 5261.0, "step_ms_min": 5245.0,
         "step_ms_max": 5290.0},
        {**base, "config": "ablation", "variant": "engine", "ablation": "whole_blocks",
         "checkpointing": "every_2", "step_ms_median": 6033.0, "step_ms_min": 6020.0,
         "step_ms_max": 6040.0},
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    runs = tmp_path / "runs.csv"
    df[df["config"] == "full"].to_csv(runs, index=False)
    assert engine_checkpointing(str(runs)) == "mixed_p3_f25"
    assert engine_checkpointing(str(tmp_path / "absent.csv")) == ""

    table, buys = report_rows.ablation_table(df)
    by = dict(zip(table["turned off"], table["vs the engine"], strict=True))
    assert "⚠ checkpointing ffn, not mixed_p3_f25" in by[report_rows.ABLATION_WORDS["sdpa"]]
    assert "⚠" not in by[report_rows.ABLATION_WORDS["fsdp_per_layer"]]
    text = "; ".join(buys)
    assert f"{report_rows.ABLATION_WORDS['fsdp_per_layer']}: 0.28 s" in text
    assert f"{report_rows.ABLATION_WORDS['whole_blocks']}: 0.80 s" in text
    assert f"{report_rows.ABLATION_WORDS['sdpa']}: not attributed" in text
    assert "-0.16" not in text
    # 25 ms slower, inside the 75 ms its steps (5.245-5.290 s) and the engine's (5.220-5.250 s)
    # spread over together
    assert f"{report_rows.ABLATION_WORDS['no_prefetch']}: within the steps' spread" in text


def test_the_four_gpu_reference_shows_a_breakdown_that_adds_up_and_one_change_per_row(tmp_path):
    """The 4x H200 reference: the 8B step on 2 ranks, its breakdown shown and adding up to the
    step's window on every rank, and every ablation row but the checkpointing one at the
    engine's checkpointing."""
    ctx, df, full = _committed_run(tmp_path, "report/reference/h200-x4/csv")
    assert f"takes {full.step_ms_median / 1e3:.3f} s on 2 ranks" in ctx["q37"]
    assert not ctx["breakdown_unsound"] and ctx["breakdown_table"]
    parts = ("attention", "matmul", "loss", "optimizer", "other", "communication_exposed", "idle")
    for r in (0, 1):
        total = sum(full[f"breakdown_r{r}_{p}_ms"] for p in parts)
        assert abs(total - full[f"breakdown_r{r}_window_ms"]) < 0.01 * total
    abl = df[(df["config"] == "ablation") & (df["status"] == "ok")]
    pinned = abl[abl["ablation"] != "whole_blocks"]
    # the gpu preset's ablation rows that ran, but the one that changes the checkpointing
    from pipeline_utils import ROOT

    from cs336_systems.planning.schema import load_yaml

    gpu = load_yaml(ROOT / "config" / "stages" / "leaderboard.yaml")["leaderboard"]["gpu"]
    asked = set(gpu["ablations"]) - {"whole_blocks", "plain_loss"}
    assert set(pinned["ablation"]) == asked
    assert (pinned["checkpointing"] == full.checkpointing).all()
    assert "not attributed" not in " ".join(ctx["ablation_buys"])


def test_the_median_of_an_even_count_of_steps_is_the_mean_of_the_middle_two(monkeypatch):
    """The cpu preset measures 2 steps: their median is their mean, not the slower one (which
    made every row's median its slowest step)."""
    from types import SimpleNamespace

    import torch

    from cs336_systems.core import harness
    from cs336_systems.parallel import launch
    from cs336_systems.stages.leaderboard import measure

    monkeypatch.setattr(measure, "build", lambda *a, **kw: (lambda: None, None))
    monkeypatch.setattr(harness, "time_steps", lambda step, warm, n, device: ([9.0], [12.0, 10.0]))
    monkeypatch.setattr(launch, "slowest_rank", lambda values, ctx: list(values))
    dims = {"vocab": 100, "d_model": 8, "d_ff": 16, "num_layers": 1, "num_heads": 2,
            "context_length": 4, "batch": 2}  # fmt: skip
    args = SimpleNamespace(block=SimpleNamespace(warmup_steps=1, measure_steps=2, profile=False))
    ctx = SimpleNamespace(device=torch.device("cpu"), world_size=1, rank=0)
    row = measure.measure("plain", dims, 1, args, ctx, profile=False)
    assert row["step_ms_median"] == 11.0
    assert (row["step_ms_min"], row["step_ms_max"]) == (10.0, 12.0)
    assert row["tokens_per_s"] == pytest.approx(2 * 4 / 11e-3)


def _cpu_like_ablation():
    """The cpu reference's engine and ablation rows (ms; medians the mean of their two steps):
    the engine chose SDPA and no checkpointing, so forcing SDPA or whole blocks changed
    nothing."""
    import pandas as pd

    base = {"backend": "gloo", "world_size": 2, "num_layers": 2, "status": "ok", "free_gb": 23.6,
            "attention": "sdpa", "checkpointing": "none", "loss": "fused", "fsdp_units": "block",
            "prefetch": True, "compiled": False}  # fmt: skip
    steps = {"": (10.10, 11.33), "sdpa": (11.99, 22.70), "plain_loss": (11.43, 23.99),
             "fsdp_per_layer": (49.33, 67.13), "no_prefetch": (10.40, 14.81),
             "whole_blocks": (11.46, 28.38)}  # fmt: skip
    ran = {"plain_loss": {"loss": "plain"}, "fsdp_per_layer": {"fsdp_units": "layer"},
           "no_prefetch": {"prefetch": False}}  # fmt: skip
    rows = [
        {**base, **ran.get(a, {}), "config": "ablation" if a else "full", "variant": "engine",
         "ablation": a, "step_ms_min": lo, "step_ms_max": hi, "step_ms_median": (lo + hi) / 2}
        for a, (lo, hi) in steps.items()
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_an_ablation_that_ran_the_engines_own_setting_changed_nothing():
    """Forcing SDPA where the engine chose SDPA, or whole blocks where it checkpointed none,
    turned nothing off: no cost is read from their steps' noise."""
    from cs336_systems.stages.leaderboard import rows as report_rows

    table, buys = report_rows.ablation_table(_cpu_like_ablation())
    words = report_rows.ABLATION_WORDS
    text = "; ".join(buys)
    assert f"{words['sdpa']}: no change, the engine's attention was already sdpa" in text
    assert (
        f"{words['whole_blocks']}: no change, the engine's checkpointing was already none" in text
    )
    by = dict(zip(table["turned off"], table["vs the engine"], strict=True))
    assert "no change" in by[words["whole_blocks"]] and "no change" not in by[words["plain_loss"]]


def test_an_ablation_difference_within_the_rows_spread_is_not_a_cost():
    """The plain loss's median is 7.0 ms over the engine's and its steps do not overlap the
    engine's, but the two rows' steps spread over 12.6 + 1.2 ms: every step slower, within the
    spread, said both ways; no prefetch's steps overlap the engine's: within the spread; FSDP
    by Linear's 47.5 ms exceeds its 19 ms and is a cost."""
    from cs336_systems.stages.leaderboard import rows as report_rows

    buys = dict(b.split(": ", 1) for b in report_rows.ablation_table(_cpu_like_ablation())[1])
    words = report_rows.ABLATION_WORDS
    assert buys[words["plain_loss"]].startswith(
        "0.0070 s, every step slower than the engine's, though within the 0.014 s the two rows'"
    )
    assert buys[words["no_prefetch"]].startswith("within the steps' spread")
    assert (
        buys[words["fsdp_per_layer"]]
        == "0.048 s (beyond the 0.019 s the two rows' steps spread over)"
    )


def test_an_ablation_row_faster_than_the_engine_says_so_not_a_negative_cost():
    """The cpu run of a8a97e6: the plain loss's steps 14.8-15.6 ms against the engine's 22.9-
    24.5 (medians 8.4 ms apart, spreads 2.4 ms): the fused loss costs nothing there, its step
    is faster without it, not "-0.0084 s"."""
    from cs336_systems.stages.leaderboard import rows as report_rows

    df = _cpu_like_ablation()
    for a, (lo, hi) in {"": (22.9, 24.5), "plain_loss": (14.8, 15.6)}.items():
        df.loc[df["ablation"] == a, ["step_ms_min", "step_ms_max", "step_ms_median"]] = [
            lo, hi, (lo + hi) / 2
        ]  # fmt: skip
    buys = dict(b.split(": ", 1) for b in report_rows.ablation_table(df)[1])
    assert buys[report_rows.ABLATION_WORDS["plain_loss"]] == (
        "none: the step is 0.0085 s faster without it (beyond the 0.0024 s the two rows' steps "
        "spread over)"
    )


def test_an_ablation_rows_label_names_the_setting_it_ran():
    """`plain_loss` ran the plain loss and `no_prefetch` no prefetch: the engine *with* them."""
    from cs336_systems.stages.leaderboard import rows as report_rows

    df = _cpu_like_ablation()
    labels = dict(zip(df["ablation"], df.apply(report_rows.run_label, axis=1), strict=True))
    assert labels["plain_loss"] == "ablation / engine with plain_loss (W=2, L=2)"
    assert labels["no_prefetch"] == "ablation / engine with no_prefetch (W=2, L=2)"
    assert labels[""] == "full / engine (W=2, L=2)"


def test_the_cpu_reference_ablation_reads_no_cost_from_noise(tmp_path):
    """The committed cpu run: its SDPA and whole-blocks rows ran the engine's own setting, so
    they changed nothing whatever their steps (whether another row's difference is beyond its
    spread moves from run to run: the synthetic rows above test that)."""
    from cs336_systems.stages.leaderboard.rows import ABLATION_WORDS as words

    ctx, _, _ = _committed_run(tmp_path, "report/reference/cpu/csv")
    buys = dict(b.split(": ", 1) for b in ctx["ablation_buys"])
    assert buys[words["sdpa"]].startswith("no change")
    assert buys[words["whole_blocks"]].startswith("no change")
    assert "engine with plain_loss" in ctx["results_table"]
