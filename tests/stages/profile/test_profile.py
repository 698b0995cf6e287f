"""The profile stage: annotated attention, kernel attribution, nsys parsing, torch.profiler."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sqlite3
import stat
from pathlib import Path

import pandas as pd
import pytest
import torch
from pipeline_utils import ROOT, block

from cs336_systems.model import ATTENTION_FUNCTIONS, build_model, naive_attention
from cs336_systems.profiling import nsys as nsys_tools
from cs336_systems.profiling.annotated_attention import annotated_naive_attention
from cs336_systems.stages.profile import measure as prof
from cs336_systems.stages.profile.plan import JOB_KNOBS as JOB
from cs336_systems.stages.profile.plan import Harness, Probe

FIXTURES = ROOT / "tests" / "fixtures"
PROVISIONAL = FIXTURES / "provisional"
GPU = FIXTURES / "gpu"  # real captures from scripts/gpu_capture_fixtures.py (absent until run)


# --- annotated attention ---------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_q", [7, 16])
def test_annotated_attention_equals_plain(causal, n_q):
    torch.manual_seed(0)
    q = torch.randn(2, 3, n_q, 8, requires_grad=True)
    k = torch.randn(2, 3, 16, 8, requires_grad=True)
    v = torch.randn(2, 3, 16, 8, requires_grad=True)
    ref = naive_attention(q, k, v, is_causal=causal)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    out = annotated_naive_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert torch.equal(out, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.equal(g, r)


def test_annotated_attention_is_registered_and_swaps_in():
    assert ATTENTION_FUNCTIONS["naive_annotated"] is annotated_naive_attention
    torch.manual_seed(0)
    model = build_model("tiny", 16)
    tokens = torch.randint(0, 100, (1, 16))
    ref = model(tokens)
    model.set_attention("naive_annotated")
    assert torch.equal(model(tokens), ref)


def test_annotated_attention_emits_its_ranges():
    q = k = v = torch.randn(1, 1, 4, 4)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True
    ) as p:
        annotated_naive_attention(q, k, v)
    names = {e.name for e in p.events() if e.is_user_annotation}
    assert {"attention", "attention.qk_matmul", "attention.mask", "attention.softmax"} <= names
    assert "attention.pv_matmul" in names


# --- attribution of kernels to ranges (synthetic events) ------------------------------------


def _events():
    """Two measured steps of a training step, one warm-up, and kernels launched at known times
    (backward kernels from another thread: attribution goes by time, not thread)."""
    r = [
        ("point 128/train_step", 100, 1000),
        ("warmup 0", 0, 90),
        ("step 0", 100, 500),
        ("phase.forward", 110, 110),
        ("attention", 120, 200),
        ("attention.qk_matmul", 120, 140),
        ("attention.softmax", 150, 170),
        ("phase.backward", 300, 301),
        ("phase.optimizer", 400, 401),
        ("phase.optimizer_end", 450, 451),
        ("step 1", 500, 900),
        ("phase.forward", 510, 510),
        ("attention", 520, 600),
        ("attention.qk_matmul", 520, 540),
        ("attention.softmax", 550, 570),
        ("phase.backward", 700, 700),
        ("phase.optimizer", 800, 800),
        ("phase.optimizer_end", 850, 850),
    ]
    ranges = pd.DataFrame(r, columns=["name", "start_ns", "end_ns"])
    k = [
        ("warm_gemm", 1_000_000, 50),  # warm-up: dropped
        ("zero_fill", 1_000, 105),  # before the forward marker: phase `other`
        ("sgemm_qk", 2_000_000, 125),
        ("cunn_SoftMaxForward", 3_000_000, 155),
        ("sgemm_mlp", 4_000_000, 250),
        ("sgemm_dgrad", 8_000_000, 310),
        ("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 500_000, 410),
        ("after_opt", 1_000, 460),
        ("sgemm_qk", 2_000_000, 525),
        ("cunn_SoftMaxForward", 5_000_000, 555),
        ("sgemm_mlp", 4_000_000, 650),
        ("sgemm_dgrad", 8_000_000, 710),
        ("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 500_000, 810),
        ("stray_after_steps", 1_000, 950),  # inside the point, outside a step: dropped
    ]
    kernels = pd.DataFrame(k, columns=["name", "dur_ns", "launch_ns"])
    return kernels, ranges


def test_attribution_by_launch_time():
    kernels, ranges = _events()
    att = prof.attribute_kernels(kernels, ranges)
    assert set(att["name"]) >= {"sgemm_qk", "zero_fill"}
    assert "warm_gemm" not in set(att["name"]) and "stray_after_steps" not in set(att["name"])
    by = att.set_index(["name", "step"])
    assert by.loc[("zero_fill", 0), "phase"] == "other"
    assert by.loc[("sgemm_qk", 0), "phase"] == "forward"
    assert by.loc[("sgemm_qk", 0), "attention_part"] == "attention.qk_matmul"
    assert by.loc[("cunn_SoftMaxForward", 1), "attention_part"] == "attention.softmax"
    assert bool(by.loc[("sgemm_mlp", 0), "in_attention"]) is False
    assert by.loc[("sgemm_dgrad", 1), "phase"] == "backward"
    assert by.loc[("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 0), "phase"] == "optimizer"
    assert by.loc[("after_opt", 0), "phase"] == "other"
    assert set(att["point"]) == {"128/train_step"}


def test_kernel_and_point_summaries():
    kernels, ranges = _events()
    att = prof.attribute_kernels(kernels, ranges)
    summary = prof.summarize_kernels(att, steps=2)
    shares = summary.groupby(["point", "phase"])["share"].sum()
    assert shares.round(9).eq(1.0).all()
    fwd = summary[summary["phase"] == "forward"].set_index("kernel")
    assert fwd.loc["sgemm_qk", "calls"] == 2
    assert fwd.loc["sgemm_qk", "calls_per_step"] == 1
    assert fwd.loc["cunn_SoftMaxForward", "ms_per_step"] == pytest.approx(4.0)
    assert fwd.loc["cunn_SoftMaxForward", "min_ms"] == pytest.approx(3.0)
    assert fwd.loc["cunn_SoftMaxForward", "max_ms"] == pytest.approx(5.0)
    assert fwd.loc["cunn_SoftMaxForward", "kernel_class"] == "reduction"
    point = prof.summarize_point(att, ranges, steps=2)
    step0 = 0.001 + 2 + 3 + 4 + 8 + 0.5 + 0.001  # zero_fill ... after_opt
    step1 = 2 + 5 + 4 + 8 + 0.5
    assert point["step_kernel_ms_mean"] == pytest.approx((step0 + step1) / 2)
    assert point["forward_kernel_ms_mean"] == pytest.approx((2 + 3 + 4 + 2 + 5 + 4) / 2)
    assert point["attention_softmax_kernel_ms_mean"] == pytest.approx(4.0)
    assert point["attention_softmax_kernel_ms_std"] > 0
    assert point["backward_kernel_ms_mean"] == pytest.approx(8.0)
    assert point["optimizer_kernel_ms_mean"] == pytest.approx(0.5)
    assert point["step_range_ms_mean"] == pytest.approx(400e-6)


# --- nsys: finding it, its CSVs, its SQLite export ------------------------------------------


def _fake_nsys(tmp_path: Path, body: str = "exit 1") -> Path:
    path = tmp_path / "nsys"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_find_nsys(tmp_path, monkeypatch):
    fake = _fake_nsys(tmp_path)
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert nsys_tools.find_nsys(None) is None
    assert nsys_tools.find_nsys(str(fake)) == str(fake)
    monkeypatch.setenv("NSYS", str(fake))
    assert nsys_tools.find_nsys(None) == str(fake)
    monkeypatch.delenv("NSYS")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nsys_tools.find_nsys("") == str(fake)


def test_profile_command_captures_only_the_measured_range():
    cmd = nsys_tools.profile_command("nsys", "out/x", ["python", "-m", "m"])
    assert "--capture-range=cudaProfilerApi" in cmd and "--capture-range-end=stop" in cmd
    assert "--trace=cuda,nvtx" in cmd and "--sample=none" in cmd
    assert cmd[-3:] == ["python", "-m", "m"]


def _stats_dirs():
    dirs = [PROVISIONAL]
    if (GPU / "nsys_cuda_gpu_kern_sum.csv").exists():
        dirs.append(GPU)
    return dirs


@pytest.mark.parametrize("folder", _stats_dirs(), ids=lambda p: p.name)
def test_read_nsys_stats_csvs(folder):
    kern = nsys_tools.read_stats_csv(folder / "nsys_cuda_gpu_kern_sum.csv")
    assert {"time_pct", "total_ns", "instances", "avg_ns", "min_ns", "max_ns", "name"} <= set(
        kern.columns
    )
    assert len(kern) > 3 and kern["total_ns"].gt(0).all()
    assert kern["time_pct"].sum() == pytest.approx(100, abs=1.5)
    nvtx = nsys_tools.read_stats_csv(folder / "nsys_nvtx_sum.csv")
    assert {"range", "total_ns", "instances", "style"} <= set(nvtx.columns)
    assert any(r.startswith("step ") for r in nvtx["range"])  # ':' domain prefix removed
    proj = folder / "nsys_nvtx_gpu_proj_sum.csv"
    if proj.exists():
        p = nsys_tools.read_stats_csv(proj)
        assert {"range", "proj_total_ns", "range_total_ns", "range_instances"} <= set(p.columns)


def test_read_stats_csv_units_and_text():
    text = "NOTICE: x\nTime (%),Total Time (us),Instances,Avg (us),Name\n50.0,1.5,3,0.5,k\n"
    df = nsys_tools.read_stats_csv(text)
    assert df.loc[0, "total_ns"] == pytest.approx(1500)
    assert df.loc[0, "avg_ns"] == pytest.approx(500)
    assert nsys_tools.read_stats_csv("no table here").empty


def test_stats_and_attributed_summaries_share_a_schema():
    kern = nsys_tools.read_stats_csv(PROVISIONAL / "nsys_cuda_gpu_kern_sum.csv")
    from_stats = prof.summary_from_kern_sum(kern, steps=1, point="all")
    kernels, ranges = _events()
    from_events = prof.summarize_kernels(prof.attribute_kernels(kernels, ranges), steps=2)
    assert set(from_stats.columns) == set(from_events.columns)
    assert from_stats["share"].sum() == pytest.approx(1.0)
    assert from_stats.iloc[0]["kernel_class"] == "gemm"


def _synthetic_export(path: Path) -> Path:
    """The four tables `events_from_sqlite` reads, with the columns nsys writes."""
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT,
            correlationId INT, globalPid INT, demangledName INT, shortName INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT,
            globalTid INT, correlationId INT, nameId INT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, rangeId INT,
            category INT, color INT, text TEXT, globalTid INT, endGlobalTid INT,
            textId INT, domainId INT);
        """
    )
    pid = 4242 << 24
    main, autograd = pid | 1, pid | 2
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(1, "sgemm_fwd"), (2, "sgemm_bwd"), (3, "step 0"), (4, "cudaLaunchKernel")],
    )
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) VALUES (?,?,?,?,?,?)",
        [
            (900, 2000, 59, "point 64/forward_backward", main, None),
            (1000, 2000, 59, None, main, 3),  # registered string: text through StringIds
            (1010, 1010, 59, "phase.forward", main, None),
            (1500, 1500, 59, "phase.backward", autograd, None),
            (1600, 1600, 34, "a mark, not a range", main, None),
        ],
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?)",
        [(1100, 1110, 0, main, 7, 4), (1600, 1610, 0, autograd, 8, 4)],
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?)",
        [(1200, 1700, 0, 7, pid, 1, 1), (1800, 1950, 0, 8, pid, 2, 2)],
    )
    con.commit()
    con.close()
    return path


def _sqlite_sources(tmp_path):
    sources = [_synthetic_export(tmp_path / "synthetic.sqlite")]
    if (GPU / "nsys_events.sqlite").exists():
        sources.append(GPU / "nsys_events.sqlite")
    return sources


def test_events_from_sqlite(tmp_path):
    db = _synthetic_export(tmp_path / "x.sqlite")
    kernels, ranges = nsys_tools.events_from_sqlite(db)
    assert list(kernels["name"]) == ["sgemm_fwd", "sgemm_bwd"]
    assert list(kernels["launch_ns"]) == [1100, 1600]
    assert kernels["matched"].astype(bool).all()
    assert "step 0" in set(ranges["name"]) and "a mark, not a range" not in set(ranges["name"])
    att = prof.attribute_kernels(prof.kernels_from_nsys_events(kernels), ranges)
    assert dict(zip(att["name"], att["phase"], strict=True)) == {
        "sgemm_fwd": "forward",
        "sgemm_bwd": "backward",  # launched from the autograd thread
    }
    assert set(att["point"]) == {"64/forward_backward"}
    assert list(att["dur_ns"]) == [500, 150]


def test_trimmed_export_keeps_what_is_read(tmp_path):
    src = _synthetic_export(tmp_path / "full.sqlite")
    dst = nsys_tools.trim_sqlite(src, tmp_path / "small.sqlite")
    a, b = nsys_tools.events_from_sqlite(src), nsys_tools.events_from_sqlite(dst)
    pd.testing.assert_frame_equal(a[0], b[0])
    pd.testing.assert_frame_equal(a[1], b[1])


@pytest.mark.skipif(not (GPU / "nsys_events.sqlite").exists(), reason="no captured export yet")
def test_captured_export_attributes_phases():
    kernels, ranges = nsys_tools.events_from_sqlite(GPU / "nsys_events.sqlite")
    att = prof.attribute_kernels(prof.kernels_from_nsys_events(kernels), ranges)
    assert not att.empty
    train = att[att["point"].str.endswith("/train_step")]
    assert {"forward", "backward", "optimizer"} <= set(train["phase"])
    assert (att["attention_part"] == "attention.softmax").any()
    summary = prof.summarize_kernels(att, steps=int(att["step"].nunique()))
    assert (summary["kernel_class"] == "gemm").any()
    # every kernel's launching API call (runtime or driver) is found: phases go by host time
    assert kernels["matched"].astype(bool).mean() > 0.99


# --- the stage on a CPU: torch.profiler into the same schema, and the nsys fallback ---------


def _args(tmp_path: Path, **over) -> argparse.Namespace:
    """A job's arguments: its block (the knobs `over` names changed) and the rest of `over`."""
    knobs = dict(
        context_lengths=[16],
        modes=["forward", "train_step"],
        precision="fp32",
        batch_size=1,
        warmup_steps=1,
        measure_steps=1,
        harness=Harness(warmup_steps=1, measure_steps=2),
        profiler="auto",
        nsys="",
        timeout_s=60,
    )
    names = {f.name for f in dataclasses.fields(JOB)}
    knobs.update({k: v for k, v in over.items() if k in names})
    cpu = JOB.from_block(json.loads(block("profile", part=JOB)[1]))
    a = dict(
        size="tiny",
        edition=2026,
        device="cpu",
        machine="test",
        preset="cpu",
        raw_dir=str(tmp_path / "raw"),
        keep_raw=True,
        block=dataclasses.replace(cpu, **knobs),
    )
    a.update({k: v for k, v in over.items() if k not in names})
    return argparse.Namespace(**a)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    points, kernels = prof.run(_args(tmp))
    return tmp, points, kernels


def test_torch_profiler_run_on_cpu(cpu_run):
    tmp_path, points, kernels = cpu_run
    assert list(points["status"]) == ["ok", "ok"]
    assert set(points["profiler"]) == {prof.PROFILER_TORCH_CPU}
    assert {"machine", "git_commit", "step_ms_mean", "forward_kernel_ms_mean"} <= set(points)
    train = points.set_index("mode").loc["train_step"]
    for phase in ("forward", "backward", "optimizer"):
        assert train[f"{phase}_kernel_ms_mean"] > 0, phase
    assert points.set_index("mode").loc["forward", "backward_kernel_ms_mean"] == 0
    fwd = kernels[(kernels["mode"] == "forward") & (kernels["phase"] == "attention.softmax")]
    assert (fwd["kernel_class"] == "reduction").any()
    train = kernels[kernels["mode"] == "train_step"]
    assert (train.loc[train["phase"] == "step", "kernel_class"] == "gemm").any()
    # CPU AdamW runs per-tensor elementwise operators (no fused/foreach kernel on CPU)
    assert not train[train["phase"] == "optimizer"].empty
    assert set(kernels["context_length"]) == {16}
    assert list((tmp_path / "raw" / "tiny_traces").glob("*.trace.json"))


def test_analysis_and_section_from_a_cpu_run(cpu_run, tmp_path):
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.profile import analysis as analysis
    from cs336_systems.stages.profile import rows as profile_rows

    _, points, kernels = cpu_run
    points.to_csv(tmp_path / "profile.csv", index=False)
    kernels.to_csv(tmp_path / "profile_kernels.csv", index=False)
    figs = analysis.plot(tmp_path, tmp_path / "figures")
    assert [f.name for f in figs] == [
        "profile_kernel_share.png",
        "profile_gemm_share.png",
        "profile_attention.png",
    ]
    s = analysis.context(tmp_path)
    assert s["available"] and s["cpu_only"]
    assert "aten::" in s["top_table"]
    # Q8's sentences where a point has both a forward's and a training step's GEMM share (a
    # loaded 2-core machine's capture may miss one, or its sanity check doubt one: then no
    # sentence rests on it), from the rows as the section reads them
    g = analysis.gemm_shares(profile_rows.load_points(tmp_path))
    both = {"forward", "train_step"} <= set(g.columns) and len(
        g.dropna(subset=["forward", "train_step"])
    )
    assert bool(s.get("gemm_sentence")) == bool(both)
    if both:
        assert "forward → training step" in s["other_kernels_sentence"]
    # Q9's sentence where the capture timed softmax (a loaded 2-core machine's profile may
    # catch none of its calls, or its sanity check doubt the point: then no sentence rests on
    # it), from the rows as the section reads them
    seen = profile_rows.attention_split(
        profile_rows.load_points(tmp_path), profile_rows.load_kernels(tmp_path)
    )
    timed = bool(len(seen)) and bool(seen["softmax_ms"].notna().any())
    assert bool(s.get("attention_sentence")) == timed
    a = profile_rows.attention_split(points)
    # 5 FLOPs per score against 2 matmuls of 2*d_head each: 5 / (4 * 32) for tiny (d_head 32)
    assert a["softmax_over_matmul_flops"].iloc[0] == pytest.approx(5 / 128)
    text = render(tmp_path, ["profile"])
    assert "torch.profiler-cpu" in text and "Q9." in text


def test_analysis_compares_with_the_harness(cpu_run, tmp_path):
    from cs336_systems.stages.profile import analysis as analysis
    from cs336_systems.stages.profile import answers as profile_answers
    from cs336_systems.stages.profile import rows as profile_rows

    _, points, _ = cpu_run
    bench = pd.DataFrame(
        [
            {
                "size": "tiny",
                "context_length": 16,
                "mode": "forward",
                "precision": "fp32",
                "compile": "eager",
                "attention": "naive",
                "batch_size": 1,
                "status": "ok",
                "step_ms_mean": 2.0,
            }
        ]
    )
    # the job timed its own forward as the harness does, before the capture: that time first
    fwd = points.set_index("mode").loc["forward"]
    assert fwd["harness_measure_steps"] == 2 and fwd["harness_ms_mean"] > 0
    assert "harness_ms_mean" not in points.set_index("mode").loc[["train_step"]].dropna(axis=1)
    h = profile_rows.harness_comparison(points, bench)
    assert h.loc[0, "harness_ms"] == fwd["harness_ms_mean"]
    assert h.loc[0, "harness_from"] == "this job"
    sentence, cov = profile_answers.harness_sentence(h, "operator")
    assert sentence.startswith("At every one of the 1 profiled forward point the harness's time")
    assert not cov
    # without it, the benchmark stage's same point
    h = profile_rows.harness_comparison(points.drop(columns=["harness_ms_mean"]), bench)
    assert h.loc[0, "harness_ms"] == 2.0 and h.loc[0, "harness_from"] == "benchmark"
    assert h.loc[0, "profiled_over_harness"] == pytest.approx(h.loc[0, "profiled_step_ms"] / 2.0)
    # neither: the coverage says the part is partly answered
    h = profile_rows.harness_comparison(points.drop(columns=["harness_ms_mean"]), bench.iloc[:0])
    sentence, cov = profile_answers.harness_sentence(h, "operator")
    assert cov["nsys_profile.a"]["status"] == "partly"
    # no forward point that passed the checks (a loaded host flagged every one): said, not a crash
    sentence, cov = profile_answers.harness_sentence(pd.DataFrame(), "operator")
    assert "passed the sanity checks" in sentence and cov["nsys_profile.a"]["status"] == "partly"


def test_the_cli_reads_its_knobs_and_hands_its_capture_the_same_block(tmp_path, capsys):
    run = ["run", "--size", "small", "--machine", "m", "--preset", "gpu", "--out", "x"]
    run += ["--kernels-out", "k", "--probe-out", "p", "--raw-dir", "r", "--keep-raw", "yes"]
    args = prof.parse_args([*run, *block("profile", "gpu", part=JOB)])
    k = args.block
    assert k.context_lengths == "probe" and (k.probe.start, k.probe.max) == (256, 16384)
    assert (k.probe.above, k.probe.count, k.probe.mode) == (128, 3, "forward_backward")
    assert k.harness == Harness(warmup_steps=5, measure_steps=10)
    assert prof.nsys_timeout(k) == 600.0 and args.device == "auto"
    assert (k.warmup_steps, k.measure_steps, k.profiler, k.nsys) == (1, 1, "auto", "")
    # the knobs a block may leave out get what the rule once gave them
    required = JOB.block_schema()["required"]
    lean = JOB.from_block({n: v for n, v in k.as_block().items() if n in required})
    assert prof.probe_of(lean) == Probe(start=256, max=16384, mode="forward_backward",
                                        above=128, count=3)  # fmt: skip
    assert prof.harness_of(lean).measure_steps == 0 and prof.nsys_timeout(lean) == 600.0
    # the 2025 edition lists its contexts; the nsys child gets them resolved, and the block
    args = prof.parse_args([*run, *block("profile", "gpu", edition=2025, part=JOB)])
    assert args.block.context_lengths == [128, 256, 512, 1024]
    cmd = prof._inner_command(args, tmp_path / "points.json")
    child = prof.parse_args(cmd[cmd.index("capture") :])
    assert child.block == args.block and child.contexts == args.block.context_lengths
    # what the parent measures, the child measures (a run's block may differ from its rule's)
    args.block = dataclasses.replace(args.block, batch_size=1)
    cmd = prof._inner_command(args, tmp_path / "points.json")
    assert prof.parse_args(cmd[cmd.index("capture") :]).block == args.block
    # `probe` needs somewhere to write the probe's rows; a list or `probe`, nothing else
    with pytest.raises(SystemExit):
        prof.parse_args(
            [a for a in run if a not in ("--probe-out", "p")] + block("profile", part=JOB)
        )
    with pytest.raises(SystemExit):
        prof.parse_args([*run, *block("profile", context_lengths="all", part=JOB)])
    assert "config: block.context_lengths: 'all' — " in capsys.readouterr().err


def test_nsys_failure_falls_back_to_torch_profiler(tmp_path, monkeypatch):
    fake = _fake_nsys(tmp_path, "echo 'importer: libdw.so.1 missing' >&2; exit 3")
    monkeypatch.setattr(prof, "choose_profiler", lambda *a: (prof.PROFILER_NSYS, str(fake)))
    points, kernels = prof.run(_args(tmp_path, modes=["forward"], keep_raw=False))
    assert list(points["status"]) == ["ok"]
    assert points.loc[0, "profiler"] == prof.PROFILER_TORCH_CPU
    assert "nsys failed" in points.loc[0, "profiler_note"]
    assert "exited with 3" in points.loc[0, "profiler_note"]
    assert not kernels.empty and set(kernels["profiler"]) == {prof.PROFILER_TORCH_CPU}
    assert not (tmp_path / "raw" / "tiny_traces").exists()  # keep_raw=False dropped them
    assert (tmp_path / "raw" / "tiny.nsys.log").exists()


def test_choose_profiler(tmp_path, monkeypatch):
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert prof.choose_profiler("auto", None, cuda=False) == (prof.PROFILER_TORCH_CPU, "")
    name, note = prof.choose_profiler("auto", None, cuda=True)
    assert name == prof.PROFILER_TORCH_CUDA and "not found" in note
    fake = _fake_nsys(tmp_path)
    assert prof.choose_profiler("auto", str(fake), cuda=True) == (prof.PROFILER_NSYS, str(fake))
    assert prof.choose_profiler("torch", str(fake), cuda=True)[0] == prof.PROFILER_TORCH_CUDA
    assert os.access(fake, os.X_OK)


SOFTMAX = "void softmax_warp_forward<float, float, float, {}, 0, 0>(float*, float const*, int)"


def test_q7_groups_a_kernels_variants_by_operation_before_its_share():
    """The H100 reference's Q7: softmax ran as `softmax_warp_forward<…, 9|10|11, …>` and
    `cunn_SoftMaxForwardReg`, one variant per context, so each variant's median share over the
    points read 0.0%. Grouped by operation, softmax's share is counted at every point."""
    from cs336_systems.profiling.kernel_classes import kernel_operation
    from cs336_systems.stages.profile import answers
    from cs336_systems.stages.profile import rows as prow

    variants = {128: SOFTMAX.format(9), 256: SOFTMAX.format(10), 512: SOFTMAX.format(11),
                1024: "void cunn_SoftMaxForwardReg<float, float, float>(float*, float const*)"}  # fmt: skip
    assert {kernel_operation(v) for v in variants.values()} == {"softmax"}
    assert kernel_operation("aten::_softmax") == "softmax"
    gemm = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_ffma_kernel"
    rows = []
    for ctx, soft in variants.items():
        for kernel, cls, ms in ((gemm, "gemm", 9.0), (soft, "reduction", 1.0)):
            rows.append({"size": "small", "context_length": ctx, "mode": "forward",
                         "phase": "forward", "kernel": kernel, "kernel_class": cls,
                         "calls_per_step": 12, "ms_per_step": ms, "share": ms / 10.0})  # fmt: skip
    k = pd.DataFrame(rows)
    k = k.assign(kernel_short=k["kernel"].map(prow.unique_labels(k["kernel"])))
    nt = prow.nontrivial_non_gemm(k)
    assert list(nt["operation"]) == ["softmax"]
    r = nt.iloc[0]
    assert (r["median_share"], r["points_at_or_above"], r["kernels"]) == (0.1, 4, 4)
    text = answers.nontrivial_sentence(nt, 0.1, "kernel", "2.0%", "GPU kernel time")
    assert "The largest is `softmax` (reduction, run by 4 kernels, median 10.0%" in text
    assert "softmax" in prow.nontrivial_table(nt, "2.0%")
    # Q9 states softmax's share the same way: all four variants, one operation
    share = prow.operation_share(k, "softmax")
    assert (share["median"], share["points"], share["kernels"]) == (0.1, 4, 4)
    assert "softmax takes a median 10.0% of forward time (10.0%–10.0% over 4 points)" in (
        answers.softmax_share_sentence(share, "kernel")
    )


def test_q5_sets_the_profiled_forward_beside_q1_and_explains_the_gap():
    """The 2025 H100 reference: `small` at 512 profiled 31.86 ms (kernels 17.13, the job's own
    timing 29.99) against Q1's 19.80 ms. The kernels fit in Q1's step, so the gap is host time
    (the job's own timing is as slow: its process, not the capture); the benchmark's bf16
    forward (24.02 ms for a 12.7x faster matmul) makes the point host-bound by the one rule. A
    point whose kernels alone exceed Q1's step is flagged."""
    from cs336_systems.stages.profile import answers
    from cs336_systems.stages.profile import rows as prow

    points = pd.DataFrame([
        {"size": s, "context_length": c, "mode": "forward", "status": "ok", "precision": "fp32",
         "batch_size": 4, "step_ms_mean": p, "step_range_ms_mean": p, "step_kernel_ms_mean": k,
         "harness_ms_mean": hm}
        for s, c, p, k, hm in (("small", 512, 31.86, 17.13, 29.99), ("xl", 512, 237.0, 228.0, 237.0),
                               ("large", 512, 118.0, 130.0, 119.0))
    ])  # fmt: skip
    bench = pd.DataFrame([
        {"size": s, "context_length": 512, "mode": "forward", "precision": prec,
         "compile": "eager", "attention": "naive", "batch_size": 4, "status": "ok",
         "step_ms_mean": t, "step_ms_std": 1.0, "peak_tflops": peak}
        for s, prec, t, peak in (("small", "fp32", 19.80, 54.0), ("small", "bf16", 24.02, 685.0),
                                 ("xl", "fp32", 236.0, 54.0), ("xl", "bf16", 64.19, 685.0),
                                 ("large", "fp32", 117.0, 54.0))
    ])  # fmt: skip
    h = prow.with_q1(prow.harness_comparison(points, bench), points, bench)
    assert list(h.set_index("size")["host_bound"].loc[["small", "xl", "large"]]) == [
        "yes", "no", "untested"]  # fmt: skip
    text = answers.q1_sentence(h, "kernel")
    assert "within ±10% at 2 of 3. Apart: `small` at 512" in text
    # one point: within or outside, not "at 0"
    one = answers.q1_sentence(h[h["size"] == "small"], "kernel")
    assert "takes 1.61× it, outside ±10%. Apart: `small` at 512" in one
    assert (
        "`small` at 512: 31.86 ms profiled against Q1's 19.80 ms (1.61×): its kernels take "
        "17.13 ms, which fit in Q1's step, so the 12.06 ms more is host time" in text
    )
    assert "took 29.99 ms too" in text and "host-bound by the rule" in text
    assert "`large` at 512" in text and "**suspect**: its kernels alone take 130.00 ms" in text
    assert "fires at 1 of the 2 points it can test" in text
    assert "Q1 (ms)" in prow.harness_table(h, "kernel")
