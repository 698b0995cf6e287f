"""The 2026 grids of the memory and profile stages, on a CPU, tiny model."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pandas as pd
import pytest
import torch
from pipeline_utils import block as stage_block

from cs336_systems.core import costs
from cs336_systems.model import run_in_order, size_spec
from cs336_systems.profiling.saved_tensors import SavedTensorLog
from cs336_systems.stages.memory import analytic, blocks
from cs336_systems.stages.memory import measure as mem
from cs336_systems.stages.memory.plan import MemoryCheckpoint
from cs336_systems.stages.profile import plan as profile_plan
from cs336_systems.stages.profile import probe

B, N = 2, 32  # tiny: d 128, d_ff 512, 4 heads


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_saved_by_op_matches_the_log_and_the_model(precision):
    spec = size_spec("tiny")
    d, f, h = spec["d_model"], spec["d_ff"], spec["num_heads"]
    torch.manual_seed(0)
    block = blocks.build_block("tiny", N, "cpu")
    x = torch.randn(B, N, d, requires_grad=True)
    by_op, totals, _ = blocks.block_saved_by_op(block, x, precision)
    # every distinct activation storage lands in exactly one group
    assert sum(by_op.values()) == totals["activation_bytes_unique"]
    model = costs.block_saved_bytes(B, N, d, h, f, precision, "cpu")
    assert sum(by_op.values()) + totals["input_bytes"] == model["total"]
    assert totals["input_bytes"] == 4 * B * N * d
    # hand-checkable groups: silu saves w1 x (b n f), softmax its probabilities (b h n^2)
    width = 4 if precision == "fp32" else 2
    assert by_op["SiluBackward0.self"] == width * B * N * f
    assert by_op["SoftmaxBackward0.result"] == width * B * h * N * N
    top = blocks.top_ops(by_op)
    assert [r["rank"] for r in top] == [1, 2, 3, 4, 5]
    assert [r["bytes"] for r in top] == sorted(by_op.values(), reverse=True)[:5]
    for r in top:
        assert r["share"] == pytest.approx(r["bytes"] / sum(by_op.values()))


def test_block_saved_by_op_against_an_independent_log():
    """The grouping is SavedTensorLog's own op attribution, summed per op over first saves."""
    torch.manual_seed(0)
    block = blocks.build_block("tiny", N, "cpu")
    x = torch.randn(B, N, 128, requires_grad=True)
    by_op, _, _ = blocks.block_saved_by_op(block, x, "fp32")
    log = SavedTensorLog()
    with log.recording(block, inputs=[x]):
        out = block(x)
    log.attribute(out)
    act = [s for s in log.saved if s.kind == "activation" and s.first]
    assert set(by_op) == {s.op for s in act}
    for op, b in by_op.items():
        assert b == sum(s.storage_bytes for s in act if s.op == op)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_gradient_bytes_are_four_per_parameter(precision):
    rows = blocks.block_rows("tiny", N, B, precision, "cpu")
    total = rows[-1]
    assert total["part"] == "block_total"
    spec = size_spec("tiny")
    d, f = spec["d_model"], spec["d_ff"]
    params = 4 * d * d + 3 * d * f + 2 * d  # attention, SwiGLU, two RMSNorm gains
    assert total["block_params"] == params
    assert total["grad_bytes"] == 4 * params
    assert [r["part"] for r in rows[:-1]] == ["saved_by_op"] * 5
    assert total["top_share"] == pytest.approx(sum(r["share"] for r in rows[:-1]))


def test_best_block_size_is_the_analytic_minimum():
    n = size_spec("xl")["num_layers"]
    k = blocks.best_block_size("xl", 2048, 4, "fp32", "cuda")
    assert n % k == 0
    peaks = {
        j: blocks.checkpoint_peak(f"every_{j}", "xl", 2048, 4, "fp32", "cuda")
        for j in range(1, n + 1)
        if n % j == 0
    }
    assert peaks[k] == min(peaks.values())
    # no checkpointing does not fit 80 GB: state and activations far above it
    act = analytic.activation_memory_for("xl", 2048, 4, "fp32", "cuda")["total"]
    need = blocks.step_need_bytes("xl", 2048, 4, "train_step", "fp32", "cuda", "none", act)
    assert need > 1.5 * 80e9
    params = costs.param_count(10_000, 2560, 32, 10240)
    assert need == 16 * params + act
    ck = blocks.step_need_bytes("xl", 2048, 4, "train_step", "fp32", "cuda", f"every_{k}", act)
    assert ck == 16 * params + peaks[k] < 80e9


def _args(tmp_path, **kw) -> argparse.Namespace:
    """A job's arguments: its block (the knobs `kw` names changed) and the rest of `kw`."""
    knobs = dict(
        context_lengths=[16, 32],
        modes=["forward", "train_step"],
        precisions=["fp32"],
        batch_size=2,
        warmup_steps=0,
        max_entries=1000,
        checkpoint=MemoryCheckpoint(contexts=[32], modes=["train_step"], strategy="best"),
        skip_factor=1.5,
        nsys_contexts=[32],
        nsys="",
    )
    names = {f.name for f in dataclasses.fields(mem.JOB_KNOBS)}
    knobs.update({k: v for k, v in kw.items() if k in names})
    cpu = mem.JOB_KNOBS.from_block(json.loads(stage_block("memory", part=mem.JOB_KNOBS)[1]))
    base = dict(
        size="tiny",
        edition=2026,
        device="cpu",
        machine="test",
        preset="cpu",
        raw_dir=str(tmp_path / "raw"),
        timeline_dir=str(tmp_path / "timelines"),
        keep_raw=True,
        nsys_timeout=60,
        block=dataclasses.replace(cpu, **knobs),
    )
    return argparse.Namespace(**{**base, **{k: v for k, v in kw.items() if k not in names}})


def test_no_checkpoint_point_is_an_oom_row_beside_the_checkpointed_one(tmp_path, monkeypatch):
    """A step that runs out of memory without checkpointing is an `oom` row; the same point
    with the analytic best every_<k> runs beside it (the run goes on)."""
    real = mem._measure_point

    def tight(work, mode, *a, **kw):
        if (
            mode == "train_step"
            and work.tokens.shape[1] == 32
            and work.model.run_blocks is run_in_order
        ):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(work, mode, *a, **kw)

    monkeypatch.setattr(mem, "_measure_point", tight)
    rows, allocs = mem.run(_args(tmp_path))
    r = rows.set_index(["context_length", "mode", "checkpoint"])
    k = blocks.best_block_size("tiny", 32, 2, "fp32", "cpu")
    assert r.loc[(32, "train_step", "none"), "status"] == "oom"
    ck = r.loc[(32, "train_step", f"every_{k}")]
    assert ck["status"] == "ok" and ck["checkpoint_choice"] == "best"
    assert ck["analytic_checkpoint_peak_mb"] == pytest.approx(
        blocks.checkpoint_peak(f"every_{k}", "tiny", 32, 2, "fp32", "cpu") / mem.MiB
    )
    assert (rows["status"] == "ok").sum() == len(rows) - 1
    # checkpointed points exist only where asked
    assert set(rows.loc[rows["checkpoint"] != "none", "context_length"]) == {32}
    assert "oom" in set(allocs["status"])


def test_block_grid_rows_and_nsys_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(blocks.nsys_tools, "find_nsys", lambda setting=None: None)
    rows = pd.DataFrame(blocks.block_grid(_args(tmp_path, edition=2025), torch.device("cpu")))
    assert set(rows["part"]) == {"saved_by_op", "block_total", "nsys_capture"}
    # every row records the run's edition (they once said 2026 in a 2025 run)
    assert set(rows["edition"].astype(str)) == {"2025"}
    cap = rows[rows["part"] == "nsys_capture"]
    assert list(cap["status"]) == ["skipped: nsys absent"]
    assert (rows.loc[rows["part"] != "nsys_capture", "status"] == "ok").all()


def test_memory_report_section_from_fixture_rows(tmp_path, monkeypatch):
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.memory import analysis

    monkeypatch.setattr(blocks.nsys_tools, "find_nsys", lambda setting=None: None)
    args = _args(tmp_path, modes=["train_step"], context_lengths=[16, 32])
    real = mem._measure_point

    def tight(work, mode, *a, **kw):
        if work.tokens.shape[1] == 32 and work.model.run_blocks is run_in_order:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(work, mode, *a, **kw)

    monkeypatch.setattr(mem, "_measure_point", tight)
    rows, allocs = mem.run(args)
    results = tmp_path / "results"
    results.mkdir()
    rows.to_csv(results / "memory.csv", index=False)
    allocs.to_csv(results / "memory_allocations.csv", index=False)
    pd.DataFrame(blocks.block_grid(args, torch.device("cpu"))).to_csv(
        results / "memory_blocks.csv", index=False
    )
    s = analysis.context(results)["y2026"]
    (sentence,) = s["checkpoint_sentences"]
    assert "context 32, training step, fp32: without checkpointing oom; with every_" in sentence
    (block,) = [b for b in s["block_sentences"] if b.startswith("Context 32, fp32")]
    assert "4 bytes × 262,400 parameters exactly" in block
    text = render(results, ["memory"])
    assert "The grid with its checkpointed points" in text
    # part (f) is an answer of its own: its heading, renumbered in the handout's order
    assert "One TransformerBlock: what it saves for backward, and its gradients" in text
    assert not re.search(r"#### \(f\)", text)
    assert "without checkpointing oom" in text and "skipped: nsys absent" in text


# ---- the profile stage's probe -------------------------------------------------------------


def test_probe_stops_at_the_first_oom(monkeypatch):
    tried = []

    def fake(size, context, batch, precision, mode, device, edition=None):
        tried.append(context)
        if context >= 1024:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return {"peak_allocated_mb": float(context)}

    monkeypatch.setattr(probe, "try_context", fake)
    rows, largest = probe.probe("tiny", 2, "fp32", "forward_backward", 256, 16384, "cpu")
    assert tried == [256, 512, 1024]
    assert [r["status"] for r in rows] == ["ok", "ok", "oom"]
    assert largest == 512 and rows[0]["stopped_by"] == "failure"
    assert profile_plan.grid_contexts(largest, 128) == [256, 512]
    assert profile_plan.grid_contexts(4096, 128) == [1024, 2048, 4096]


def test_probe_stops_at_the_cap_on_a_real_cpu_step():
    rows, largest = probe.probe("tiny", 2, "fp32", "forward_backward", 16, 64, torch.device("cpu"))
    assert [r["context_length"] for r in rows] == [16, 32, 64]
    assert largest == 64 and {r["stopped_by"] for r in rows} == {"cap"}
    assert profile_plan.grid_contexts(largest, 8) == [16, 32, 64]
    assert profile_plan.grid_contexts(None, 8) == []


def test_profile_job_probes_then_profiles_the_grid(tmp_path, monkeypatch):
    from cs336_systems.stages.profile import measure as prof

    def fake(size, context, batch, precision, mode, device, edition=None):
        if context > 32:
            raise torch.OutOfMemoryError("out of memory")
        return {"peak_allocated_mb": float("nan")}

    monkeypatch.setattr(probe, "try_context", fake)
    seen = {}

    def fake_run(args):
        seen["contexts"] = list(args.block.context_lengths)
        return pd.DataFrame([{"status": "ok"}]), pd.DataFrame([{"kernel": "k"}])

    monkeypatch.setattr(prof, "run", fake_run)
    out = tmp_path / "probe.csv"
    probe_knobs = {"start": 8, "max": 64, "mode": "forward_backward", "above": 4, "count": 3}
    part = prof.JOB_KNOBS
    knobs = stage_block("profile", context_lengths="probe", probe=probe_knobs, part=part)
    prof.main(
        ["run", "--size=tiny", *knobs, "--machine=m", "--preset=cpu", "--keep-raw=true"]
        + [f"--raw-dir={tmp_path}", f"--out={tmp_path / 'p.csv'}"]
        + [f"--kernels-out={tmp_path / 'k.csv'}", f"--probe-out={out}", "--edition=2025"]
    )
    assert seen["contexts"] == [8, 16, 32]
    probe_rows = pd.read_csv(out)
    # the probe's rows record the run's edition (they once said 2026 in a 2025 run)
    assert set(probe_rows["edition"].astype(str)) == {"2025"}
    assert list(probe_rows["status"]) == ["ok", "ok", "ok", "oom"]
    assert set(probe_rows["grid_contexts"]) == {"8,16,32"}


def test_profile_report_states_the_probe(tmp_path):
    from cs336_systems.stages.profile.answers import probe_sentences

    rows = [
        {"size": "small", "context_length": c, "status": st, "probe_mode": "forward_backward"}
        for c, st in ((256, "ok"), (512, "ok"), (1024, "oom"))
    ]
    for r in rows:
        r.update(probe_start=256, probe_cap=16384, largest_fitting=512, stopped_by="failure")
        r["grid_contexts"] = "256,512"
    (sentence,) = probe_sentences(pd.DataFrame(rows))
    assert "(256 ok, 512 ok, 1024 oom); the largest that fits is 512" in sentence
    assert sentence.endswith("the profiled contexts are 256,512.")


@pytest.mark.parametrize(
    "override, expect",
    [
        (
            {
                "memory": {
                    "cpu": {"checkpoint": {"contexts": [48], "modes": [], "strategy": "best"}}
                }
            },
            "config: memory.cpu.checkpoint.contexts[0]: 48 — a value of memory.cpu.context_lengths",
        ),
        (
            {
                "memory": {
                    "gpu": {"checkpoint": {"contexts": [2048], "modes": [], "strategy": "every_5"}}
                }
            },
            "config: memory.gpu.checkpoint.strategy: 'every_5' — best, or every_<k> with k a divisor "
            "of the 32 layers of xl",
        ),
        (
            {
                "memory": {
                    "cpu": {
                        "checkpoint": {"contexts": [64], "modes": ["inference"], "strategy": "best"}
                    }
                }
            },
            'config: memory.cpu.checkpoint.modes: ["inference"] — modes without inference: an '
            "inference forward saves nothing to checkpoint",
        ),
        (
            {
                "profile": {
                    "cpu": {
                        "probe": {
                            "start": 128,
                            "max": 64,
                            "mode": "forward",
                            "above": 8,
                            "count": 3,
                        }
                    }
                }
            },
            "config: profile.cpu.probe.start: 128 — at most profile.cpu.probe.max (64)",
        ),
    ],
)
def test_bad_grid_settings_are_refused_before_any_job(override, expect):
    from config_checks import problems

    found = problems(override)
    assert len(found) == 1 and found[0].startswith(expect), found


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_rows_on_cuda_match_the_model(precision):
    """On CUDA (softmax in fp32 under autocast): the block's saved bytes plus its input are
    core.costs.block_saved_bytes for cuda; gradients 4 bytes per parameter."""
    spec = size_spec("small")
    rows = blocks.block_rows("small", 256, 4, precision, "cuda")
    total = rows[-1]
    model = costs.block_saved_bytes(
        4, 256, spec["d_model"], spec["num_heads"], spec["d_ff"], precision, "cuda"
    )
    assert total["bytes"] + total["input_bytes"] == model["total"]
    assert total["grad_bytes"] == 4 * total["block_params"]
