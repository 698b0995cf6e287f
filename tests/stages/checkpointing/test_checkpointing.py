"""Activation checkpointing: plans, gradients, saved-tensor accounting, the memory model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from pipeline_utils import block, copy_workflow, snakemake

from cs336_systems.core import checkpoint_plans as ck
from cs336_systems.core import costs
from cs336_systems.core.device import autocast
from cs336_systems.model import RMSNorm, RotaryEmbedding, TransformerBlock, TransformerLM
from cs336_systems.planning import config as config_check
from cs336_systems.planning import edition as edition_sizes
from cs336_systems.profiling.saved_tensors import LiveTensorBytes, SavedTensorLog
from cs336_systems.stages.checkpointing import plan as ckpt_plan

pytestmark = pytest.mark.usefixtures("one_thread")


STRATEGIES = ["none", "every_1", "every_2", "every_4", "every_8", "sqrt", "halving", "chain"]


def tiny_lm(layers: int = 8, vocab: int = 64, ctx: int = 16, d: int = 32, f: int = 128):
    torch.manual_seed(0)
    return TransformerLM(vocab, ctx, d_model=d, num_layers=layers, num_heads=4, d_ff=f)


# ---- plans ------------------------------------------------------------------------------------


def test_plans_of_four_blocks():
    assert ck.plan_for("none", 4) == (0, 1, 2, 3)
    assert ck.plan_for("every_2", 4) == ((0, 1), (2, 3))
    assert ck.plan_for("every_4", 4) == ((0, 1, 2, 3),)
    assert ck.plan_for("halving", 4) == (((0,), (1,)), ((2,), (3,)))
    assert ck.plan_for("chain", 4) == ((((0,), 1), 2), 3)
    assert ck.plan_for("sqrt", 5) == ((0, 1, 2), (3, 4))
    for name in STRATEGIES:
        assert ck.blocks_of(ck.plan_for(name, 8)) == list(range(8)), name
    with pytest.raises(ValueError, match="does not divide"):
        ck.plan_for("every_3", 8)
    with pytest.raises(ValueError, match="unknown strategy"):
        ck.plan_for("random", 8)


def loss_and_grads(model, precision: str, strategy: str):
    """One step's loss and every parameter's gradient with the blocks under `strategy`."""
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    ck.apply(model, strategy)
    model.zero_grad(set_to_none=True)
    with autocast(precision, torch.device("cpu")):
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_strategies_give_the_gradients_of_no_checkpointing(precision):
    model = tiny_lm(layers=4)
    ref_loss, ref = loss_and_grads(model, precision, "none")
    for name in ["every_1", "every_2", "every_4", "sqrt", "halving", "chain"]:
        loss, got = loss_and_grads(model, precision, name)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=0, msg=f"{name}: {n}")


# ---- saved-tensor accounting ------------------------------------------------------------------


def test_rmsnorm_saves_its_input_rsqrt_and_normalized_input():
    b, n, d = 2, 3, 8
    ln = RMSNorm(d)
    x = torch.randn(b, n, d, requires_grad=True)
    log = SavedTensorLog()
    with log.recording(ln, [x]):
        y = ln(x)
    log.attribute(y)
    got = [(s.shape, s.kind, s.first, s.op) for s in log.saved]
    # x.pow(2) saves x; rsqrt saves its result; x * rsqrt saves both; (.) * weight saves both
    assert got == [
        ((b, n, d), "input", True, "PowBackward0.self"),
        ((b, n, 1), "activation", True, "RsqrtBackward0.result"),
        ((b, n, 1), "activation", False, "MulBackward0.other"),
        ((b, n, d), "input", False, "MulBackward0.self"),
        ((d,), "parameter", True, "MulBackward0.other"),
        ((b, n, d), "activation", True, "MulBackward0.self"),
    ]
    t = log.totals()
    assert t["activation_bytes_unique"] == 4 * (b * n + b * n * d)
    assert t["activation_bytes_all_saves"] == 4 * (2 * b * n + b * n * d)
    assert t["input_bytes"] == 4 * b * n * d


def test_linear_saves_its_input_and_its_weight_as_a_parameter():
    lin = torch.nn.Linear(8, 5, bias=False)
    x = torch.randn(4, 8, requires_grad=True)
    h = torch.tanh(x)  # an activation, not the recorded call's input
    log = SavedTensorLog()
    with log.recording(lin):
        y = lin(h)
    log.attribute(y)
    kinds = {s.op: (s.kind, s.shape) for s in log.saved}
    assert kinds == {
        "MmBackward0.self": ("activation", (4, 8)),
        "MmBackward0.mat2": ("parameter", (8, 5)),
    }
    assert log.totals()["activation_bytes_unique"] == 4 * 4 * 8


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_block_saves_what_the_analytic_model_says(precision):
    b, n, d, h, f = 2, 16, 32, 4, 64
    torch.manual_seed(0)
    block = TransformerBlock(d, h, f, RotaryEmbedding(d // h, n))
    x = torch.randn(b, n, d, requires_grad=True)
    log = SavedTensorLog()
    with log.recording(block, [x]), autocast(precision, torch.device("cpu")):
        y = block(x)
    log.attribute(y)
    t = log.totals()
    model = costs.block_saved_bytes(b, n, d, h, f, precision, "cpu")
    assert t["activation_bytes_unique"] == model["inner"]
    assert t["input_bytes"] == model["input"]
    assert all(s.op != "?" for s in log.saved), [s for s in log.saved if s.op == "?"]
    softmax = [s for s in log.saved if s.op.startswith("SoftmaxBackward0")]
    assert softmax and softmax[0].module == "attn" and softmax[0].shape == (b, h, n, n)


# ---- the memory model -------------------------------------------------------------------------


def test_checkpoint_memory_by_hand():
    # a = 1 (a block's input), B = 10 (all it saves), head 5; four blocks
    every2 = costs.checkpoint_memory(ck.plan_for("every_2", 4), 10, 1, 5)
    assert (every2["forward_bytes"], every2["backward_bytes"]) == (2 + 5, 1 + 2 * 10)
    assert every2["recomputed_blocks"] == 4
    halving = costs.checkpoint_memory(ck.plan_for("halving", 4), 10, 1, 5)
    assert halving["backward_bytes"] == 2 * 1 + 10  # log2(4) inputs + one block
    assert halving["recomputed_blocks"] == 4 * 2  # N log2 N
    chain = costs.checkpoint_memory(ck.plan_for("chain", 4), 10, 1, 5)
    assert chain["backward_bytes"] == 1 + 10  # the stack's input + one block
    assert chain["forward_bytes"] == 1 + 10 + 5
    assert chain["recomputed_blocks"] == 4 * 3 // 2  # N (N - 1) / 2
    none = costs.checkpoint_memory(ck.plan_for("none", 4), 10, 1, 5)
    assert none["peak_bytes"] == 4 * 10 + 5 and none["compute_factor"] == 1
    # autocast keeps every checkpointed block's weight casts until the forward ends
    cached = costs.checkpoint_memory(ck.plan_for("every_2", 4), 10, 1, 5, cached_bytes=3)
    assert cached["forward_bytes"] == 2 + 5 + 4 * 3


def measured_peaks(model, tokens, strategies, precision="fp32"):
    """Peak bytes the step creates (LiveTensorBytes), and the forward's saved bytes."""
    out = {}
    for name in strategies:
        ck.apply(model, name)

        def loss():
            with autocast(precision, torch.device("cpu")):
                logits = model(tokens)
                return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())

        loss().backward()  # gradients allocated: the step adds activations only
        live = LiveTensorBytes()
        with live:
            loss().backward()
        log = SavedTensorLog()
        with log.recording(model, [tokens]):
            loss()
        out[name] = (live.peak, log.totals()["activation_bytes_unique"])
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_memory_model_against_measured_bytes(precision):
    b, n, d, h, f, vocab, layers = 2, 16, 32, 4, 128, 64, 8
    model = tiny_lm(layers, vocab, n, d, f)
    tokens = torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(2))
    blk = costs.block_saved_bytes(b, n, d, h, f, precision, "cpu")
    head = costs.head_saved_bytes(b, n, d, vocab, precision)
    measured = measured_peaks(model, tokens, STRATEGIES, precision)
    offsets = {}
    for name, (peak, forward_saved) in measured.items():
        m = costs.checkpoint_memory(
            ck.plan_for(name, layers), blk["total"], blk["input"], head, blk["weight_casts"]
        )
        # the forward leaves saved exactly the model's forward term (without autocast's
        # cache, which is freed when the forward's autocast region ends)
        cache = blk["weight_casts"] * (
            layers - sum(isinstance(i, int) for i in ck.plan_for(name, layers))
        )
        assert forward_saved == m["forward_bytes"] - cache, name
        # the peak: the model plus what backward allocates beyond saved tensors (< one block)
        offsets[name] = peak - m["peak_bytes"]
        assert 0 <= offsets[name] < blk["total"], (name, offsets[name])
    if precision == "fp32":
        # the peak is in backward, in one block's backward: the same transient for every
        # one-level plan (under autocast some peaks are in the forward, with the cached casts)
        one_level = [offsets[f"every_{k}"] for k in (2, 4, 8)]
        assert max(one_level) - min(one_level) <= 0.02 * blk["total"], offsets


def test_chain_memory_does_not_grow_with_depth_and_every_block_does():
    peaks = {}
    for layers in (4, 8, 16):
        model = tiny_lm(layers)
        tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
        got = measured_peaks(model, tokens, ["chain", "every_1"])
        peaks[layers] = {k: v[0] for k, v in got.items()}
    boundary = 4 * 2 * 16 * 32
    assert peaks[16]["chain"] - peaks[4]["chain"] <= boundary  # O(1)
    assert peaks[16]["every_1"] - peaks[4]["every_1"] >= 11 * boundary  # O(N)


# ---- the config check -------------------------------------------------------------------------


def plan_problems(cfg: dict) -> list[str]:
    at = config_check.Checker(("checkpointing", "gpu"))
    ckpt_plan.check(cfg, at)
    return [str(p) for p in at.problems]


def test_plan_check_names_the_key_and_the_divisors():
    block = yaml.safe_load(open("config/stages/checkpointing.yaml"))["checkpointing"]
    assert plan_problems(block["gpu"]) == []
    block["gpu"]["block_sizes"] = [1, 3, 32]
    assert plan_problems(block["gpu"]) == [
        "config: checkpointing.gpu.block_sizes[1]: 3 — a divisor of the 32 layers of xl: "
        "1, 2, 4, 8, 16, 32"
    ]
    assert ckpt_plan.num_layers({"size": "tiny", "num_layers": 6}) == 6
    assert edition_sizes.size_table()["xl"]["num_layers"] == 32
    # 2025: xl has 48 layers (its 32-layer model is 2.7B), and no 10B
    assert edition_sizes.size_table(2025)["xl"]["num_layers"] == 48
    assert edition_sizes.size_table(2025)["2.7B"]["num_layers"] == 32
    assert "10B" not in edition_sizes.size_table(2025)


def test_the_cli_reads_its_knobs_from_one_checked_block(capsys):
    from cs336_systems.stages.checkpointing import measure

    run = ["--machine", "m", "--preset", "cpu", "--out", "x"]
    args = measure.parse_args(["strategies", "--precision", "fp32", *run, *block("checkpointing")])
    k = args.block
    assert ckpt_plan.strategies(k) == [*STRATEGIES, *ck.SUB_BLOCK] and k.num_layers == 8
    assert measure.vocab_of(k) == 256 and args.precision == "fp32"
    assert (k.warmup_steps, k.measure_steps, k.skip_factor) == (1, 2, 1.5)
    # the accounting job reads its own part of the block, and only that
    part = ckpt_plan.ACCOUNTING_KNOBS
    args = measure.parse_args(["accounting", *run, *block("checkpointing", part=part)])
    acc = args.block.accounting
    assert (acc.size, acc.device, acc.compile_backend) == ("xl", "meta", "partition")
    with pytest.raises(SystemExit):
        measure.parse_args(["accounting", *run, *block("checkpointing")])
    # a block size that does not divide the layers, or one the schema refuses, stops the CLI
    with pytest.raises(SystemExit):
        measure.parse_args(
            ["strategies", "--precision", "fp32", *run, *block("checkpointing", block_sizes=[3])]
        )
    with pytest.raises(SystemExit):
        measure.parse_args(
            ["strategies", "--precision", "fp32", *run, *block("checkpointing", measure_steps=0)]
        )
    assert "config: block.measure_steps: 0 — " in capsys.readouterr().err


def test_plan_reads_the_size_table_without_torch():
    from cs336_systems.model import EXTRA_SIZES, MODEL_SIZES, SIZE_TABLES

    assert edition_sizes.size_table() == {**MODEL_SIZES, **EXTRA_SIZES}
    assert edition_sizes.size_table(2025) == {**SIZE_TABLES[2025], **EXTRA_SIZES}


def test_bad_block_size_stops_the_workflow_before_any_job(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"preset": "cpu", "checkpointing": {"cpu": {"block_sizes": [1, 3]}}})
    )
    proc = snakemake(work, "--dry-run", "--configfile", str(bad), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config: checkpointing.cpu.block_sizes[1]: 3 — a divisor of the 8 layers" in out
    assert not (work / "results").exists()


def test_the_peak_is_reconciled_with_the_memory_grid():
    """The same configuration measured by the memory stage: the difference stated and
    explained (this stage keeps the gradients allocated through the step), and a difference
    the gradients cannot explain said so."""
    import pandas as pd

    from cs336_systems.stages.checkpointing import answers as ck

    here = pd.DataFrame([{"size": "xl", "context_length": 2048, "precision": "fp32",
                          "strategy": "every_1", "batch_size": 4, "status": "ok",
                          "peak_allocated_mb": 66_445.0}])  # fmt: skip
    memory = pd.DataFrame([{"size": "xl", "context_length": 2048, "precision": "fp32",
                            "checkpoint": "every_1", "batch_size": 4, "status": "ok",
                            "mode": "train_step", "peak_allocated_mb": 60_863.0,
                            "grads_mb": 12_996.0}])  # fmt: skip
    (line,) = ck.reconcile(here, memory)
    assert "a difference of 5.45 GiB" in line and "below the gradients' size" in line
    memory["peak_allocated_mb"] = 40_000.0
    (line,) = ck.reconcile(here, memory)
    assert "not explained by that" in line
    assert ck.reconcile(here, memory.iloc[:0]) == []


# ---- inside a block: the attention half, the FFN half, both -----------------------------------


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sub_block_strategies_give_the_gradients_of_no_checkpointing(precision):
    model = tiny_lm(layers=2)
    _, ref = loss_and_grads(model, precision, "none")
    for name in ck.SUB_BLOCK:
        _, got = loss_and_grads(model, precision, name)
        assert [b.checkpoint_attn for b in model.layers] == [name != "ffn"] * 2
        assert [b.checkpoint_ffn for b in model.layers] == [name != "attn"] * 2
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=0, msg=f"{name}: {n}")
    ck.apply(model, "every_1")  # a whole-block strategy clears the halves' flags
    assert not any(b.checkpoint_attn or b.checkpoint_ffn for b in model.layers)


def test_sub_block_model_against_measured_bytes():
    """What the forward leaves saved is the model's forward term exactly, and the peak the
    model's plus less than one block (backward's own buffers), for each half and both."""
    from cs336_systems.stages.checkpointing.sub_block import step_shape, sub_block_memory

    b, n, d, h, f, vocab, layers = 2, 16, 32, 4, 128, 64, 8
    model = tiny_lm(layers, vocab, n, d, f)
    tokens = torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(2))
    blk = costs.block_saved_bytes(b, n, d, h, f, "fp32", "cpu")
    head = costs.head_saved_bytes(b, n, d, vocab, "fp32")
    spec = {"d_model": d, "d_ff": f, "num_layers": layers, "num_heads": h}
    shape = step_shape(spec, b, n, vocab, "fp32", "cpu")
    measured = measured_peaks(model, tokens, ["every_1", *ck.SUB_BLOCK])
    for name in ck.SUB_BLOCK:
        peak, forward_saved = measured[name]
        m = sub_block_memory(name, blk, head, shape)
        assert forward_saved == m["forward_bytes"], name
        assert 0 <= peak - m["peak_bytes"] < blk["total"], (name, peak - m["peak_bytes"])
    # both halves apart keep two residual-stream tensors a block where every_1 keeps one
    halves, every = measured["halves"][1], measured["every_1"][1]
    assert halves - every == layers * blk["input"]
