"""The flash stage on its own: caps, a Triton point on the CPU, rows written as it goes and
resumed, the reference, the fixed-cost target and its paired rounds (its rows gated by the
kernel tests, its analysis and section: tests/stages/attention/test_attention.py)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from flash_utils import COMMON, flash_sweep
from pipeline_utils import block

from cs336_systems.stages.flash import analysis as flash_analysis
from cs336_systems.stages.flash import jobs as flash_jobs
from cs336_systems.stages.flash import measure as flash_benchmark
from cs336_systems.stages.flash import plan as flash_plan
from cs336_systems.stages.flash import rows as flash_rows


def test_flash_caps_per_implementation_or_per_dtype():
    """max_seq_len caps an implementation at every dtype ({impl: n}) or at some ({impl: {dtype:
    n}}); the job's block carries both forms, and the skip row names which."""
    caps = {"flash_pytorch": 16384, "flash_triton": {"fp32": 4096}}
    knobs = block("flash", part=flash_plan.SWEEP_KNOBS, max_seq_len=caps)
    args = flash_benchmark.parse_args(["sweep", *COMMON, "--dtype", "fp32", *knobs, "--out", "x"])
    assert flash_jobs.job_of(args).max_seq_len == caps
    assert flash_plan.seq_cap(caps, "flash_triton", "fp32") == 4096
    assert flash_plan.seq_cap(caps, "flash_triton", "bf16") == math.inf
    assert flash_plan.seq_cap(caps, "flash_pytorch", "bf16") == 16384
    cpu = torch.device("cpu")
    why = flash_jobs.skip_reason("flash_triton", 8192, "fp32", cpu, caps, None)
    assert why == "skipped: n above this preset's max_seq_len 4096 for flash_triton in fp32"
    assert flash_jobs.skip_reason("flash_triton", 4096, "fp32", cpu, caps, None) == ""
    assert flash_jobs.skip_reason("flash_triton", 8192, "fp16", cpu, caps, None) == ""
    why = flash_jobs.skip_reason("flash_pytorch", 32768, "fp16", cpu, caps, None)
    assert why == "skipped: n above this preset's max_seq_len 16384 for flash_pytorch"


def test_flash_triton_point_on_cpu(tmp_path):
    """Our Triton kernel through the benchmark (interpreter): checked, timed, tiles recorded."""
    out = tmp_path / "f.csv"
    flash_benchmark.main(flash_sweep(out, ["flash_triton"], [16]))
    row = pd.read_csv(out).iloc[0]
    assert row["status"] == "ok" and row["fwd_bwd_ms_median"] > 0
    assert row["triton_fwd_config"] == "16x16" and row["grid"] == "sweep"


def test_flash_sweep_writes_rows_as_it_goes_and_resumes(tmp_path, monkeypatch):
    """Interrupted after two points, the partial CSV holds their rows; the rerun measures only
    the rest (an error row is measured again), then writes the output and drops the partial."""
    out, partial = tmp_path / "f.csv", tmp_path / "partial.csv"
    argv = flash_sweep(out, ["naive_eager", "flash_pytorch"], [16, 32], "--partial", str(partial))
    real = flash_benchmark.measure
    measured, first_run = [], [True]

    def interrupted(impl, *args, **kwargs):
        if first_run[0] and len(measured) == 3:
            raise KeyboardInterrupt  # the job is stopped in its fourth point
        measured.append((impl, args[3]))
        if first_run[0] and len(measured) == 2:
            return {"status": "error: injected"}
        return real(impl, *args, **kwargs)

    monkeypatch.setattr(flash_benchmark, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        flash_benchmark.main(argv)
    assert not out.exists()
    first = pd.read_csv(partial)
    assert list(first["status"]) == ["ok", "error: injected", "ok"]
    assert list(zip(first["impl"], first["seq_len"])) == measured

    measured.clear()
    first_run[0] = False
    flash_benchmark.main(argv)
    # the two ok rows were kept, the error row and the fourth point measured
    assert measured == [("flash_pytorch", 16), ("flash_pytorch", 32)]
    df = pd.read_csv(out)
    assert list(zip(df["impl"], df["seq_len"])) == [
        ("naive_eager", 16), ("flash_pytorch", 16), ("naive_eager", 32), ("flash_pytorch", 32)
    ]  # fmt: skip
    assert set(df["status"]) == {"ok"}
    kept = df[df["impl"] == "naive_eager"].reset_index(drop=True)
    assert (
        kept["fwd_bwd_ms_median"].tolist()
        == first.loc[first["impl"] == "naive_eager", "fwd_bwd_ms_median"].tolist()
    )
    assert not partial.exists()


def test_flash_resume_ignores_rows_timed_differently(tmp_path, monkeypatch):
    """A partial row of another timing (or commit, kernel verdict, ...) is not reused."""
    out, partial = tmp_path / "f.csv", tmp_path / "partial.csv"
    argv = ["--partial", str(partial)]
    flash_benchmark.main(flash_sweep(out, ["naive_eager"], [16], *argv, steps=1))
    pd.read_csv(out).to_csv(partial, index=False)  # as if interrupted before the final write
    assert len(flash_jobs.finished_rows(partial)) == 1
    real, calls = flash_benchmark.measure, []
    monkeypatch.setattr(
        flash_benchmark, "measure", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )
    flash_benchmark.main(flash_sweep(out, ["naive_eager"], [16], *argv, steps=2))
    assert calls == ["naive_eager"]
    assert pd.read_csv(out)["timing"].str.endswith(" steps=2").all()


def test_flash_reference_is_top_left_causal():
    q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
    ref = flash_benchmark.reference_output(q, k, v, chunk=16)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5)


def test_flash_rejects_unknown_impl(tmp_path):
    with pytest.raises(SystemExit):
        flash_benchmark.main(flash_sweep(tmp_path / "x.csv", ["naive_eager", "mystery"], [16]))


def _target_rows(ours: dict, cudnn: dict, status: str = "ok") -> pd.DataFrame:
    rows = []
    for impl, times in (("flash_triton", ours), ("sdpa_cudnn", cudnn)):
        for (d, n), ms in times.items():
            rows.append({"grid": "target", "impl": impl, "dtype": "bf16", "batch_size": 1,
                         "heads": 16, "d_head": d, "seq_len": n, "status": status,
                         "fwd_bwd_ms_median": ms})  # fmt: skip
    return pd.DataFrame(rows)


def test_fixed_cost_target_verdicts_follow_each_length_bound():
    """At most cuDNN from n = 4096 on, at most 1.5x at n = 1024; the table and the sentence
    count exactly the points that miss (ratios on both sides of each bound)."""
    ours = {(64, 1024): 0.30, (64, 4096): 0.40, (64, 16384): 4.0, (128, 1024): 0.36,
            (128, 4096): 0.59, (128, 2048): 9.0}  # fmt: skip
    cudnn = {(64, 1024): 0.20, (64, 4096): 0.39, (64, 16384): 4.2, (128, 1024): 0.25,
             (128, 4096): 0.60, (128, 2048): 1.0}  # fmt: skip
    got = flash_analysis.fixed_cost(_target_rows(ours, cudnn))
    assert got["available"] and "16 heads" in got["config"]
    # 1.50 at 1024 is within its bound; 1.44 too; 4096: 1.03 misses, 0.98 holds; 2048 has none
    assert got["sentences"] == ["The target holds at 4 of 5 points; not at d=64 n=4096 (1.03×)."]
    assert got["table"].count("not met") == 1 and got["table"].count("| met") == 4
    assert flash_rows.target_bound(2048) is None


def test_fixed_cost_without_cudnn_rows_says_why():
    rows = _target_rows({(64, 1024): 0.3}, {(64, 1024): float("nan")}, status="ok")
    rows.loc[rows["impl"] == "sdpa_cudnn", "status"] = "error: no cuDNN attention"
    got = flash_analysis.fixed_cost(rows)
    assert got["table"] == ""
    assert got["sentences"] == [
        "No comparison: no successful points of SDPA cuDNN (error: no cuDNN attention)."
    ]
    assert flash_analysis.fixed_cost(rows.assign(grid="sweep")) == {"available": False}


def test_fixed_cost_judges_on_the_paired_rounds_median_ratio():
    """With paired rounds the verdict is the median of the rounds' ratios, not the single
    windows' ratio: a host drift that made one window slow does not fail a point; the table
    shows both, and a point whose rounds do not pair is judged on its single windows."""
    ours = {(32, 1024): 0.36, (32, 4096): 0.40, (64, 4096): 0.40}
    cudnn = {(32, 1024): 0.22, (32, 4096): 0.41, (64, 4096): 0.38}
    rows = _target_rows(ours, cudnn)
    rounds = {
        ("flash_triton", 32, 1024): "0.3 0.2 0.36",  # ratios 1.2, 1.0, 1.8: median 1.2
        ("sdpa_cudnn", 32, 1024): "0.25 0.2 0.2",
        ("flash_triton", 32, 4096): "0.5 0.42 0.44",  # ratios 1.25, 1.05, 1.1: median 1.1
        ("sdpa_cudnn", 32, 4096): "0.4 0.4 0.4",
        ("flash_triton", 64, 4096): "0.4 0.4",  # two rounds against three: not paired
        ("sdpa_cudnn", 64, 4096): "0.4 0.4 0.4",
    }
    rows["fwd_bwd_rounds_ms"] = [
        rounds[k] for k in zip(rows["impl"], rows["d_head"], rows["seq_len"])
    ]
    got = flash_analysis.fixed_cost(rows)
    assert got["sentences"][0] == (
        "The target holds at 1 of 3 points; not at d=32 n=4096 (1.10×), d=64 n=4096 (1.05×)."
    )
    assert "median of 3 rounds" in got["sentences"][1]
    cells = {
        tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
        for line in got["table"].splitlines()[2:]
    }
    # the rounds' medians as times, the median ratio, the rounds' span, the single windows' 1.64
    assert cells[("32", "1024")] == ["0.300", "0.200", "1.20", "1.00-1.80", "1.64", "<= 1.5", "met"]
    assert cells[("64", "4096")] == ["0.400", "0.380", "1.05", "", "1.05", "<= 1", "not met"]
    assert "(1 of 3 points without paired rounds, judged on those)." in got["sentences"][1]
    # without rounds the table has no rounds columns
    assert (
        "rounds" not in flash_analysis.fixed_cost(rows.drop(columns=["fwd_bwd_rounds_ms"]))["table"]
    )


def test_paired_rounds_alternate_the_order_and_record_each_round():
    from cs336_systems.stages.flash import rounds

    calls = []

    def fake_timer(fn, prefix, grads):
        fn()  # the call runs: forward, then backward into the leaves
        assert all(g.grad is not None for g in grads)
        calls.append(current[0])
        return {f"{prefix}_ms_median": {"a": 1.0, "b": 2.0}[current[0]] + len(calls) / 100}

    current = ["?"]

    def impl(name):
        def fn(q, k, v):
            current[0] = name
            return (q * k + v).sum(-1, keepdim=True) * q

        return fn

    fns = {"a": impl("a"), "b": impl("b")}
    shape = (1, 2, 8, 4)
    got = rounds.time_rounds(fns, shape, torch.float32, torch.device("cpu"), fake_timer, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert got == {"a": [1.01, 1.04, 1.05], "b": [2.02, 2.03, 2.06]}
    rows = [{"impl": "a", "status": "ok"}, {"impl": "b", "status": "ok"}]
    assert rounds.needs_rounds(rows)
    calls.clear()
    rounds.add_rounds(rows, fns, shape, torch.float32, torch.device("cpu"), fake_timer, 3)
    assert rows[0]["fwd_bwd_rounds_ms"] == "1.01 1.04 1.05" and rows[0]["rounds_status"] == "ok"
    assert rows[1]["fwd_bwd_rounds_ms_median"] == 2.03
    assert rounds.parse_rounds(rows[1]["fwd_bwd_rounds_ms"]) == [2.02, 2.03, 2.06]
    assert rounds.parse_rounds(2.5) == [2.5] and rounds.parse_rounds(float("nan")) == []
    # kept rows that have their rounds, or a point with a failed implementation: no rounds
    assert not rounds.needs_rounds(rows)
    assert not rounds.needs_rounds([{"impl": "a", "status": "ok"}, {"impl": "b", "status": "oom"}])

    def broken(q, k, v):
        raise RuntimeError("no kernel for this shape")

    rows = [{"impl": "a", "status": "ok"}, {"impl": "b", "status": "ok"}]
    rounds.add_rounds(rows, {"a": fns["a"], "b": broken}, shape, torch.float32,
                      torch.device("cpu"), fake_timer, 3)  # fmt: skip
    assert {r["rounds_status"] for r in rows} == {"error: RuntimeError: no kernel for this shape"}
    assert not any("fwd_bwd_rounds_ms" in r for r in rows)


def test_flash_target_grid_rows(tmp_path):
    """The `target` job writes rows named for the target set, with its head count and its own
    do_bench windows; the leaderboard job reads its point (the gpu preset's parts)."""
    out = tmp_path / "t.csv"
    target = {
        "impls": ["naive_eager"],
        "dtype": "fp32",
        "batch_size": 1,
        "heads": 2,
        "head_dims": [16],
        "seq_lens": [16],
        "warmup_ms": 25,
        "rep_ms": 100,
        "rounds": 2,
    }
    timing = {**json.loads(block("flash")[1])["timing"], "warmup_steps": 0, "steps": 1}
    knobs = block("flash", part=flash_plan.TARGET_KNOBS, target=target, timing=timing)
    args = flash_benchmark.parse_args(["target", *COMMON, *knobs, "--out", str(out)])
    job, timer = flash_jobs.job_of(args), flash_jobs.timer_of(args, torch.device("cpu"))
    assert (job.grid, job.dtype, job.heads, timer.warmup_ms, timer.rep_ms) == (
        "target",
        "fp32",
        2,
        25.0,
        100.0,
    )
    flash_benchmark.main(["target", *COMMON, *knobs, "--out", str(out)])
    row = pd.read_csv(out).iloc[0]
    assert row["grid"] == "target" and row["heads"] == 2 and row["status"] == "ok"
    # its paired rounds: two timed forward+backward calls, their median beside them
    assert row["rounds_status"] == "ok" and job.rounds == 2
    each = [float(x) for x in row["fwd_bwd_rounds_ms"].split()]
    assert len(each) == 2 and all(x > 0 for x in each)
    assert row["fwd_bwd_rounds_ms_median"] == pytest.approx(sum(each) / 2, rel=1e-4)
    gpu_target = block("flash", "gpu", part=flash_plan.TARGET_KNOBS)
    gpu_args = flash_benchmark.parse_args(["target", *COMMON, *gpu_target, "--out", "x"])
    assert flash_jobs.job_of(gpu_args).rounds == 5
    board = block("flash", "gpu", part=flash_plan.LEADERBOARD_KNOBS)
    args = flash_benchmark.parse_args(["leaderboard", *COMMON, *board, "--out", "x"])
    job, timer = flash_jobs.job_of(args), flash_jobs.timer_of(args, torch.device("cpu"))
    assert (job.impls, job.dtype, job.heads) == (
        ["flash_triton", "sdpa_flash", "sdpa_cudnn"],
        "bf16",
        16,
    )
    assert (job.head_dims, job.seq_lens, job.grid) == ([64], [16384], "leaderboard")
    assert (timer.warmup_ms, timer.rep_ms, timer.steps, job.flash_tiles) == (
        250.0,
        1000.0,
        3,
        (64, 64),
    )
    # a sweep's job reads the sweep's part: its dtypes and the other jobs' blocks are not in it
    sweep = flash_jobs.job_of(flash_benchmark.parse_args(flash_sweep("x", ["naive_eager"], [16])))
    assert (sweep.heads, sweep.batch_size, sweep.grid, sweep.flash_tiles) == (
        1,
        1,
        "sweep",
        (32, 32),
    )
    with pytest.raises(SystemExit):
        flash_benchmark.parse_args(
            ["sweep", *COMMON, "--dtype", "fp32", *block("flash"), "--out", "x"]
        )
