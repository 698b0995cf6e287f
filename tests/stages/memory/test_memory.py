"""The memory stage: the analytic activation model, snapshot timelines, largest allocations."""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from pipeline_utils import ROOT, block

from cs336_systems.core.device import autocast
from cs336_systems.core.workload import Workload
from cs336_systems.profiling import memory_snapshot as snapshots
from cs336_systems.reporting.analysis import load
from cs336_systems.stages.memory import analytic, blocks
from cs336_systems.stages.memory import measure as mem
from cs336_systems.stages.memory.plan import JOB_KNOBS as JOB

GPU = ROOT / "tests" / "fixtures" / "gpu"
SNAPSHOT_FIXTURE = GPU / "memory_snapshot.pickle"  # from scripts/gpu_capture_fixtures.py


# --- analytic activation model ---------------------------------------------------------------


def test_residual_stream_of_2p7b():
    # one (batch 4, context 128, d_model 2560) fp32 tensor: 4*128*2560*4 bytes = 5 MiB
    a = analytic.activation_memory_for("xl", 128, 4, "fp32", "cuda")
    assert a["residual_stream"] == 5_242_880
    assert a["residual_stream"] / mem.MiB == 5.0


def test_activation_model_hand_computed_fp32():
    # b=1, n=2, d=4, h=2, f=8, L=1, V=10: bnd=8, bnf=16, b h n^2=8, n^2=4, bn=2
    # per layer: norms 2*(4*2*8 + 4*2)=144; matmul inputs 4*(8+3*8+8+8)=192; scores 4*8=32;
    #            SwiGLU 4*4*16=256; mask 4                                  -> 628
    # final: norm 4*2*8 + 4*2 = 72, head input 4*8 = 32                     -> 104
    # loss: log-softmax 4*1*2*10 + total weight 4                            -> 84
    a = analytic.activation_memory(1, 2, 4, 1, 2, 8, vocab_size=10, precision="fp32")
    assert a["per_layer"] == 628
    assert a["final_norm_and_head"] == 104
    assert a["loss"] == 84
    assert a["weight_casts"] == 0
    assert a["total"] == 816


def test_activation_model_hand_computed_bf16():
    # per layer: norms 144 (fp32); bf16 matmul inputs 2*(3*8 + 3*8 + 8 + 2*8)=144;
    # scores: fp32 probabilities + bf16 copy (4+2)*8=48 on CUDA, 2*8=16 on CPU; SwiGLU 2*4*16=128;
    # mask 4 -> 468 (CUDA) / 436 (CPU). final: 72 + bf16 head input 2*8 = 88. loss 84.
    # weight casts: 2 bytes * (L*(4 d^2 + 3 d f) + d V) = 2*(64 + 96 + 40) = 400
    cuda = analytic.activation_memory(1, 2, 4, 1, 2, 8, 10, "bf16", "cuda")
    cpu = analytic.activation_memory(1, 2, 4, 1, 2, 8, 10, "bf16", "cpu")
    assert (cuda["per_layer"], cpu["per_layer"]) == (468, 436)
    assert cuda["final_norm_and_head"] == 88 and cuda["weight_casts"] == 400
    assert (cuda["total"], cpu["total"]) == (1040, 1008)
    with pytest.raises(ValueError):
        analytic.activation_memory(1, 2, 4, 1, 2, 8, 10, "fp16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("context", [8, 16])
def test_activation_model_matches_saved_tensors_on_cpu(precision, context):
    """The formula counts exactly what autograd saves for backward (CPU autocast)."""
    torch.manual_seed(0)
    work = Workload.build("tiny", context, 2, "cpu")
    excluded = mem._storage_ptrs([*work.model.parameters(), *work.model.buffers()])
    excluded |= mem._storage_ptrs([work.tokens, work.targets])
    counter = mem.SavedTensorCounter(excluded)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        with autocast(precision, torch.device("cpu")):
            logits = work.model(work.tokens)
            F.cross_entropy(logits.flatten(0, 1).float(), work.targets.flatten())
    expected = analytic.activation_memory_for("tiny", context, 2, precision, "cpu")["total"]
    assert counter.bytes == expected


# --- snapshot -> timeline, phases, largest allocations ---------------------------------------


def _frame(name, filename="/work/main/src/cs336_systems/model.py", line=10):
    return {"filename": filename, "line": line, "name": name}


TORCH_FRAME = _frame("forward", "/x/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py")


def _snapshot() -> dict:
    """A trace of a tiny step: 1000 (4096 B) and 5000 (2048 B) were allocated before the trace
    (5000 is freed in it); 3000 is allocated in it and still active at the end."""
    marker = "/work/main/src/cs336_systems/memory.py"
    trace = [
        {
            "action": "alloc",
            "addr": 50,
            "size": 512,
            "frames": [_frame("_memory_mark_forward", marker)],
        },
        {"action": "free_completed", "addr": 50, "size": 512, "frames": []},
        {"action": "alloc", "addr": 3000, "size": 1024, "frames": [TORCH_FRAME, _frame("forward")]},
        {
            "action": "alloc",
            "addr": 4000,
            "size": 8192,
            "frames": [
                TORCH_FRAME,
                _frame("forward", line=42),
                _frame("loss", "/w/benchmark.py", 7),
            ],
        },
        {"action": "free_requested", "addr": 4000, "size": 8192, "frames": []},
        {"action": "free_completed", "addr": 4000, "size": 8192, "frames": []},
        {"action": "free_completed", "addr": 5000, "size": 2048, "frames": []},
        {
            "action": "alloc",
            "addr": 60,
            "size": 512,
            "frames": [_frame("_memory_mark_backward", marker)],
        },
        {"action": "free_completed", "addr": 60, "size": 512, "frames": []},
        {"action": "alloc", "addr": 6000, "size": 16384, "frames": []},
        {"action": "free_completed", "addr": 6000, "size": 16384, "frames": []},
    ]
    blocks = [
        {"address": 1000, "size": 4096, "state": "active_allocated"},
        {"address": 2000, "size": 512, "state": "inactive"},
        {"address": 3000, "size": 1024, "state": "active_allocated"},
    ]
    return {
        "segments": [{"device": 0, "address": 0, "total_size": 1 << 20, "blocks": blocks}],
        "device_traces": [trace],
    }


def test_active_timeline():
    tl = mem.active_timeline(_snapshot())
    assert tl.attrs["baseline_bytes"] == 4096 + 2048
    expected = [6656, 6144, 7168, 15360, 15360, 7168, 5120, 5632, 5120, 21504, 5120]
    assert list(tl["active_bytes"]) == expected
    assert tl["active_bytes"].iloc[-1] == 4096 + 1024  # = the snapshot's active blocks
    assert list(tl["phase"]) == ["forward"] * 7 + ["backward"] * 4
    assert snapshots.phase_spans(tl) == [("forward", 0, 6), ("backward", 7, 10)]


def test_largest_allocations_with_frames():
    top = mem.largest_allocations(_snapshot(), n=3)
    assert list(top["size_bytes"]) == [16384, 8192, 1024]
    assert list(top["phase"]) == ["backward", "forward", "forward"]
    assert top.loc[0, "frames"].startswith("(no Python frames")
    assert top.loc[1, "frames"] == "model.py:42 forward <- benchmark.py:7 loss"
    assert "_memory_mark" not in " ".join(top["frames"])


def test_user_frames_skip_torch_and_stdlib():
    frames = [
        TORCH_FRAME,
        _frame("_call_impl", "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py"),
        _frame("run_module", "<frozen runpy>"),
        _frame("forward", line=5),
    ]
    assert snapshots.user_frames(frames) == ["model.py:5 forward"]


def test_render_timeline(tmp_path):
    png = snapshots.render_active_memory(_snapshot(), tmp_path / "t.png", "tiny")
    assert png.exists() and png.stat().st_size > 2000
    assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF")  # for a write-up


@pytest.mark.skipif(not SNAPSHOT_FIXTURE.exists(), reason="no captured snapshot yet")
def test_a_kept_snapshot_has_its_offline_page_beside_it(tmp_path):
    """A kept snapshot (a real one, captured on a GPU) gets its page, `<point>.html`, titled as
    its figure and naming the `.pickle` beside it; a dropped one leaves neither."""
    import pickle
    import types

    snap = snapshots.load_snapshot(SNAPSHOT_FIXTURE)
    row = {"context_length": 128, "mode": "train_step", "precision": "fp32", "checkpoint": "none"}
    for keep in (True, False):
        args = argparse.Namespace(size="tiny", edition=2026, keep_raw=keep,
                                  timeline_dir=str(tmp_path / "timelines"),
                                  block=types.SimpleNamespace(batch_size=4))  # fmt: skip
        snap_path = tmp_path / f"keep_{keep}" / "tiny_128_train_step_fp32.pickle"
        snap_path.parent.mkdir()
        snap_path.write_bytes(pickle.dumps(snap))
        allocs = mem.snapshot_rows(args, dict(row), {"size": "tiny"}, snap, snap_path)
        assert len(allocs) == snapshots.TOP_ALLOCATIONS
        page = snap_path.with_suffix(".html")
        assert snap_path.exists() == page.exists() == keep
    page = (tmp_path / "keep_True" / "tiny_128_train_step_fp32.html").read_text()
    assert "<title>tiny, context 128, training step, fp32</title>" in page
    assert "<code>tiny_128_train_step_fp32.pickle</code>" in page and "<svg" in page


@pytest.mark.skipif(not SNAPSHOT_FIXTURE.exists(), reason="no captured snapshot yet")
def test_captured_snapshot(tmp_path):
    snap = snapshots.load_snapshot(SNAPSHOT_FIXTURE)
    tl = mem.active_timeline(snap)
    active_end = sum(
        b["size"]
        for seg in snap["segments"]
        for b in seg["blocks"]
        if b["state"] in ("active_allocated", "active_pending_free")
    )
    assert tl["active_bytes"].iloc[-1] == active_end
    assert tl["active_bytes"].min() >= 0
    assert {"forward", "backward", "optimizer"} <= set(tl["phase"])
    top = mem.largest_allocations(snap, n=5)
    assert len(top) == 5 and top["size_bytes"].is_monotonic_decreasing
    assert any("model.py" in f for f in top["frames"]) or any(
        "(no Python" in f for f in top["frames"]
    )
    assert snapshots.render_active_memory(snap, tmp_path / "real.png", "captured").exists()


# --- the stage on a CPU -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memory")
    knobs = JOB.from_block(json.loads(block("memory", part=JOB)[1]))
    knobs = dataclasses.replace(
        knobs,
        context_lengths=[16],
        modes=["inference", "forward", "train_step"],
        precisions=["fp32", "bf16"],
        batch_size=2,
        warmup_steps=1,
        max_entries=1000,
        checkpoint=None,
        skip_factor=1.5,
    )
    args = argparse.Namespace(
        size="tiny",
        edition=2026,
        device="cpu",
        machine="test",
        preset="cpu",
        raw_dir=str(tmp / "raw"),
        timeline_dir=str(tmp / "timelines"),
        keep_raw=True,
        block=knobs,
    )
    rows, allocs = mem.run(args)
    return rows, allocs


def test_the_cli_reads_its_knobs_from_one_checked_block(capsys):
    run = ["run", "--size", "tiny", "--machine", "m", "--preset", "gpu", "--out", "x"]
    run += ["--allocations-out", "a", "--raw-dir", "r", "--timeline-dir", "t", "--keep-raw", "no"]
    args = mem.parse_args([*run, *block("memory", "gpu", part=JOB)])
    k = args.block
    assert k.context_lengths == [128, 2048]
    assert k.modes == ["inference", "forward", "train_step"]
    assert (k.batch_size, k.warmup_steps, k.max_entries, k.skip_factor) == (4, 2, 200000, 1.5)
    assert (k.checkpoint.contexts, k.checkpoint.strategy) == ([2048], "best")
    assert k.nsys_contexts == [2048] and k.nsys == "" and not args.keep_raw
    assert (args.device, args.nsys_timeout) == ("auto", 600.0)
    # the 2025 edition's entry is merged into the block before it reaches the CLI
    args = mem.parse_args([*run, *block("memory", "gpu", edition=2025, part=JOB)])
    assert args.block.context_lengths == [128, 256, 512] and args.block.checkpoint.contexts == []
    # the knobs a block may leave out get what the rule once gave them
    required = JOB.block_schema()["required"]
    lean = {k: v for k, v in json.loads(block("memory", part=JOB)[1]).items() if k in required}
    args = mem.parse_args([*run, "--block", json.dumps(lean)])
    assert (mem.entries_of(args.block), mem.skip_factor_of(args.block)) == (200000, 1.5)
    assert [s for _, _, s in blocks.grid(args, 2048, "cuda")] == ["none"] * 6
    assert not args.block.nsys_contexts
    with pytest.raises(SystemExit):
        mem.parse_args([*run, *block("memory", modes=["sideways"], part=JOB)])
    # a job reads its part only: not the sweep's sizes
    with pytest.raises(SystemExit):
        mem.parse_args([*run, *block("memory")])
    assert "config: block.modes[0]: 'sideways' — " in capsys.readouterr().err


def test_memory_stage_on_cpu(cpu_run):
    rows, allocs = cpu_run
    assert list(rows["status"]) == ["ok"] * 6
    r = rows[rows["precision"] == "fp32"].set_index("mode")
    # an inference forward (torch.inference_mode) saves nothing; the same forward with
    # autograd on saves what the training step's forward saves
    assert r.loc["inference", "saved_activations_mb"] == 0
    assert r.loc["forward", "saved_activations_mb"] == r.loc["train_step", "saved_activations_mb"]
    assert r.loc["train_step", "saved_activations_mb"] == pytest.approx(
        r.loc["train_step", "analytic_activations_mb"]
    )
    params = r.loc["train_step", "params_mb"]
    assert r.loc["train_step", "grads_mb"] == pytest.approx(params)
    # AdamW: two moments per parameter, plus a scalar step count per parameter tensor
    assert r.loc["train_step", "optimizer_state_mb"] == pytest.approx(2 * params, rel=1e-3)
    assert r.loc["forward", "grads_mb"] == 0 and r.loc["forward", "optimizer_state_mb"] == 0
    assert r.loc["forward", "peak_rss_mb"] > 0
    assert r.loc["forward", "timeline_png"].startswith("skipped:")
    assert allocs["status"].str.startswith("skipped:").all() and len(allocs) == 6


def test_rss_peak_is_at_least_every_rss_read_in_the_window():
    # the kernel's approximate counters: VmHWM after the step below VmRSS read after the reset
    r = mem.rss_columns({"VmRSS": 700.0}, {"VmHWM": 697.5, "VmRSS": 690.0}, reset=True)
    assert r["peak_rss_mb"] == 700.0 and r["rss_growth_mb"] == 0.0
    r = mem.rss_columns({"VmRSS": 700.0}, {"VmHWM": 712.0, "VmRSS": 690.0}, reset=True)
    assert r["peak_rss_mb"] == 712.0 and r["rss_growth_mb"] == 12.0
    # no reset (clear_refs not writable): no peak of the window to report
    r = mem.rss_columns({"VmRSS": 700.0}, {"VmHWM": 900.0, "VmRSS": 690.0}, reset=False)
    assert np.isnan(r["peak_rss_mb"]) and np.isnan(r["rss_growth_mb"])
    assert r["rss_before_mb"] == 700.0


def test_memory_analysis_on_cpu(cpu_run, tmp_path):
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.memory import analysis as analysis

    rows, allocs = cpu_run
    rows.to_csv(tmp_path / "memory.csv", index=False)
    allocs.to_csv(tmp_path / "memory_allocations.csv", index=False)
    figs = analysis.plot(tmp_path, tmp_path / "figures")
    assert [f.name for f in figs] == [
        "memory_peak.png",
        "memory_activations.png",
        "memory_timelines.png",
        "memory_block_timeline.png",
    ]
    flags = load(tmp_path, "memory")["sanity"].fillna("")
    assert (flags == "").all(), list(flags)  # a flagged row drops out of the sentences below
    s = analysis.context(tmp_path)
    assert not s["cuda"] and "0.00%" in s["activation_sentence"]
    d_model = rows["analytic_residual_stream_mb"].iloc[0] * 2**20 / (2 * 16 * 4)
    assert f"= {round(2 * 16 * d_model * 4):,} bytes, " in s["residual_sentence"]
    assert s["residual_sentence"].endswith("MiB (MiB = 2^20 bytes).")
    assert "activation memory saved for backward" in s["precision_sentence"]
    text = render(tmp_path, ["memory"])
    assert "Q17." in text and "Skipped: CUDA memory snapshots need a CUDA device" in text


def test_memory_analysis_of_a_cuda_run(tmp_path):
    """The CUDA-only parts of the section, on rows shaped like a GPU run's."""
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.memory import analysis as analysis

    base = {"size": "xl", "batch_size": 4, "device": "cuda", "warmup_steps": 2}
    rows, allocs = [], []
    for ctx in (128, 2048):
        for mode in ("inference", "forward", "train_step"):
            for prec, scale in (("fp32", 1.0), ("bf16", 0.8)):
                a = analytic.activation_memory_for("xl", ctx, 4, prec, "cuda")
                train = mode == "train_step"
                if mode == "inference":  # nothing saved; bf16 holds autocast's weight copies
                    a = {**a, "total": 0}
                    scale = 1.0 if prec == "fp32" else 1.1
                name = mem.point_name("xl", ctx, mode, prec)
                rows.append(
                    {
                        **base,
                        "context_length": ctx,
                        "mode": mode,
                        "precision": prec,
                        "status": "ok",
                        "params_mb": 10_000.0,
                        "grads_mb": 10_000.0 if train else 0.0,
                        "optimizer_state_mb": 20_000.0 if train else 0.0,
                        "saved_activations_mb": a["total"] / mem.MiB,
                        "analytic_activations_mb": a["total"] / mem.MiB,
                        "analytic_residual_stream_mb": a["residual_stream"] / mem.MiB,
                        "analytic_weight_casts_mb": a["weight_casts"] / mem.MiB,
                        "forward_growth_mb": 1.01 * a["total"] / mem.MiB,
                        "peak_allocated_mb": (
                            scale * (45_000.0 if train else 15_000.0) + ctx
                            if mode != "inference"
                            else 10_000.0 * scale + ctx
                        ),
                        "peak_reserved_mb": 50_000.0,
                        "baseline_mb": 40_000.0 if train else 10_000.0,
                        "trace_peak_mb": 45_000.0,
                        "peak_phase": "backward" if train else "forward",
                        "forward_peak_mb": 14_000.0,
                        "forward_end_mb": 44_000.0,
                        "backward_end_mb": 50_000.0 if train else float("nan"),
                        "optimizer_end_mb": 50_000.0 if train else float("nan"),
                        "timeline_png": f"memory_timeline_{name}.png",
                    }
                )
                for rank, size in enumerate((320.0, 160.0), start=1):
                    allocs.append(
                        {
                            **base,
                            "context_length": ctx,
                            "mode": mode,
                            "precision": prec,
                            "status": "ok",
                            "rank": rank,
                            "size_mb": size,
                            "size_bytes": int(size * mem.MiB),
                            "phase": "forward",
                            "likely_tensor": "logits / log-softmax / their grad (b·n·V)",
                            "frames": "model.py:42 forward <- benchmark.py:97 loss",
                        }
                    )
    results = tmp_path / "results"
    results.mkdir()
    pd.DataFrame(rows).to_csv(results / "memory.csv", index=False)
    pd.DataFrame(allocs).to_csv(results / "memory_allocations.csv", index=False)
    timelines = results / "memory" / "timelines"
    for r in rows:
        snapshots.render_active_memory(_snapshot(), timelines / r["timeline_png"], "x")
    figs = analysis.plot(results, tmp_path / "figures")
    assert (tmp_path / "figures" / rows[0]["timeline_png"]).exists()
    assert [f.name for f in figs][-1] == "memory_block_timeline.png" and len(figs) == 4
    s = analysis.context(results)
    assert s["cuda"] and len(s["timelines"]) == 12
    # memory_profiling (a)'s images: each mode at each context the 2026 handout asks
    shown = [t["png"] for t in s["timeline_figures"]]
    assert shown == [
        f"memory_timeline_xl_{c}_{m}_fp32.png"
        for c in (128, 2048)
        for m in ("inference", "forward", "train_step")
    ]
    assert "train step: bf16 autocast peak allocated memory is 0.80×" in s["precision_sentence"]
    # the forward two ways, per context: both peaks and what autograd keeps between them
    fp, bf = s["inference_sentences"][:2]
    assert fp.startswith("xl, context 128, fp32: the inference forward (torch.inference_mode)")
    assert "peaks at 10,128 MiB, the forward with autograd on peaks at 15,128 MiB" in fp
    assert "(1.49×): the 5,000 MiB between them is what autograd keeps for backward" in fp
    assert "4,451 MiB of saved activations by our count (89% of it)" in fp
    assert "peaks at 11,128 MiB, the forward with autograd on peaks at 12,128 MiB" in bf
    # bf16's inference peak against autocast's cached weight copies (6,449 MiB for xl)
    assert "context 128: 11,128 against 10,128 MiB (1.10×, +1,000 MiB)" in s["precision_inference"]
    assert "not within 25% of them at any context" in s["precision_inference"]
    # (d) for the edition's model (xl, d_model 2560) by arithmetic
    assert (
        "context 2048: 4·2048·2560·4 = 83,886,080 bytes = 80.0 MiB"
        in (s["handout_residual_sentence"])
    )
    # the handout's question is about the forward pass's snapshot: its largest allocations
    assert s["alloc_point"] == "forward passes"
    assert s["alloc_sentence"].startswith("In the forward pass's snapshot of xl (fp32)")
    text = render(results, ["memory"])
    assert "falls in backward" in text and "model.py:42 forward" in text


def test_measure_point_frees_the_step_it_measured():
    """The saved-tensor counter must not keep a step's activations alive: after two points on
    the same model no tensor beyond the parameters and inputs survives (an identity pack hook
    made a C++ reference cycle that leaked every forward's activations)."""
    import gc

    from cs336_systems.core.workload import Workload
    from cs336_systems.stages.memory.measure import measure_point

    def live_bytes():
        gc.collect()
        return sum(
            o.numel() * o.element_size()
            for o in gc.get_objects()
            if torch.is_tensor(o) and not isinstance(o, torch.nn.Parameter)
        )

    work = Workload.build("tiny", 32, 2, torch.device("cpu"))
    before = live_bytes()
    for mode in ("forward", "train_step"):
        row, _ = measure_point(work, mode, "fp32", 1, None, 100)
        assert row["saved_activations_mb"] > 0
    assert live_bytes() == before


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_inference_forward_on_cuda_holds_less_than_one_with_autograd(tmp_path, precision):
    """On CUDA: the inference forward saves nothing and peaks below the forward with autograd
    on, by at least most of what that forward saved; its snapshot draws as memory_viz does."""
    from cs336_systems.stages.memory.measure import measure_point

    work = Workload.build("small", 512, 4, torch.device("cuda"))
    inf, snap = measure_point(work, "inference", precision, 1, tmp_path / "i.pickle", 100_000)
    fwd, _ = measure_point(work, "forward", precision, 1, None, 100_000)
    assert inf["saved_activations_mb"] == 0 and fwd["saved_activations_mb"] > 0
    gap = fwd["peak_allocated_mb"] - inf["peak_allocated_mb"]
    assert gap > 0.5 * fwd["saved_activations_mb"], (inf, fwd)
    tl = mem.active_timeline(snap)
    assert "forward" in set(tl["phase"]) and "backward" not in set(tl["phase"])
    png = snapshots.render_active_memory(snap, tmp_path / "inference.png", "small inference")
    assert png.exists() and png.with_suffix(".pdf").exists()
