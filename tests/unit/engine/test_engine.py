"""The engine's step against the plain model's: same loss, same parameters after one AdamW step.

Tolerances: fp32 (CPU): loss to 1e-5 relative, every parameter to 1e-6 absolute after a step of
lr 1e-3 (1e-3 of the step each element takes; AdamW's first step moves each element by about
lr). bf16 autocast: loss to 2e-2 relative; the parameters' updates differ where bf16 rounding
flips the sign of a near-zero gradient (AdamW's first step is about lr * sign(g)), so all but
1% of the elements of every parameter (2 where 1% is fewer) within lr/10 of the plain update,
and all within 2.1 lr.
Master weights (bf16 Linear weights, fp32 masters, engine/master_adamw.py) against the same
engine without them, bf16: the Linear weight grads are the same bf16 matmul outputs either way
(autocast's cast of an fp32 weight is the bf16 working copy, bit for bit), so losses to 1e-6
relative and every fp32 master to 1e-6 absolute after 1 and 3 steps (measured on CPU: losses
equal, 3e-8 at most: fp32 ulps of the kernel's arithmetic against torch's foreach AdamW). Against
the plain model: one step as the bf16 case above; three steps (the plain model's naive attention
and unfused loss drift further from the engine's): loss 2e-2, every element within 6.3 lr, and
at most 5% of all elements beyond lr/10 (measured 3.0%).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.core.device import autocast
from cs336_systems.engine import memory_model
from cs336_systems.engine.step import Engine, EngineOptions
from cs336_systems.model import TransformerLM

LR = 1e-3
# AdamW's first step moves each weight by lr * g / (|g| + eps): where |g| is near eps, the last
# bit of g (the summation order differs between CPUs' kernels) moves the update by a fraction of
# lr (1.2e-6 at lr 1e-3 seen on an AVX-512 EPYC). A wrong gradient moves it by about lr.
ADAM_ATOL = LR * 1e-2
TINY = {
    "vocab_size": 97,
    "context_length": 16,
    "d_model": 32,
    "num_layers": 4,
    "num_heads": 4,
    "d_ff": 64,
}


def _setup(device="cpu", spec=TINY, batch=3, seq=16):
    torch.manual_seed(0)
    with torch.device(device):
        lm = TransformerLM(**spec)
    tokens = torch.randint(0, spec["vocab_size"], (batch, seq), device=device)
    targets = torch.randint(0, spec["vocab_size"], (batch, seq), device=device)
    return lm, tokens, targets


def _plain_step(lm, tokens, targets, precision):
    dev = tokens.device
    opt = torch.optim.AdamW(lm.parameters(), lr=LR, weight_decay=0.01)
    with autocast(precision, dev):
        logits = lm(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    loss.backward()
    opt.step()
    return loss.detach(), {n: p.detach() for n, p in lm.named_parameters()}


def _both(precision, checkpoint, device="cpu", **kw):
    lm, tokens, targets = _setup(device, **kw)
    before = {n: p.detach().clone() for n, p in lm.named_parameters()}
    plain_loss, plain = _plain_step(copy.deepcopy(lm), tokens, targets, precision)
    opts = EngineOptions(precision=precision, checkpoint=checkpoint, lr=LR, loss_chunk=7)
    engine = Engine.build(lm, tokens, targets, opts)
    loss = engine.step()
    return loss, plain_loss, engine.full_parameters(), plain, before, engine


@pytest.mark.parametrize("checkpoint", ["none", "every_2", "halving", "ffn", "mixed_p1_f2"])
def test_fp32_step_matches_the_plain_model(checkpoint):
    loss, plain_loss, params, plain, before, engine = _both("fp32", checkpoint)
    assert engine.plan["strategy"] == checkpoint
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=0)
    assert params.keys() == plain.keys()
    for name, p in plain.items():
        assert not torch.equal(p, before[name]) or name.startswith("token"), name
        torch.testing.assert_close(params[name], p, rtol=0, atol=ADAM_ATOL, msg=name)


def _assert_bf16_close(params, plain, before):
    for name, p in plain.items():
        step_plain, step_engine = p - before[name], params[name] - before[name]
        diff = (step_plain - step_engine).abs()
        assert diff.max() <= 2.1 * LR, name
        assert (diff > LR / 10).sum() <= max(2, 0.01 * diff.numel()), name


def test_bf16_step_matches_the_plain_model():
    loss, plain_loss, params, plain, before, _ = _both("bf16", "every_1")
    torch.testing.assert_close(loss, plain_loss, rtol=2e-2, atol=0)
    _assert_bf16_close(params, plain, before)


def _run(lm, tokens, targets, steps, **opts):
    opts = {"precision": "bf16", "checkpoint": "every_1", "lr": LR, "loss_chunk": 7, **opts}
    engine = Engine.build(copy.deepcopy(lm), tokens, targets, EngineOptions(**opts))
    out = []
    for _ in range(steps):
        loss = engine.step()
        out.append((loss, {n: t.clone() for n, t in engine.full_parameters().items()}))
    return engine, out


def test_master_weights_match_the_engine_without_them_after_1_and_3_steps():
    lm, tokens, targets = _setup()
    engine, with_mw = _run(lm, tokens, targets, 3, master_weights=True)
    plain_engine, without = _run(lm, tokens, targets, 3, master_weights=False)
    assert engine.plan["master_weights"] and not plain_engine.plan["master_weights"]
    linear = {n for n, p in engine.train.named_parameters() if p.dtype == torch.bfloat16}
    assert len(linear) == 7 * TINY["num_layers"] + 1  # 4 projections + 3 SwiGLU + the head
    assert "lm.lm_head.weight" in linear
    for (loss, params), (loss0, params0) in zip(with_mw, without, strict=True):
        torch.testing.assert_close(loss, loss0, rtol=1e-6, atol=0)
        assert params.keys() == params0.keys()
        for name, p in params0.items():
            assert params[name].dtype == torch.float32, name
            torch.testing.assert_close(params[name], p, rtol=0, atol=ADAM_ATOL, msg=name)


def test_master_weights_step_matches_the_plain_model_after_1_and_3_steps():
    lm, tokens, targets = _setup()
    before = {n: p.detach().clone() for n, p in lm.named_parameters()}
    _, runs = _run(lm, tokens, targets, 3, master_weights=True)
    plain_lm = copy.deepcopy(lm)
    opt = torch.optim.AdamW(plain_lm.parameters(), lr=LR, weight_decay=0.01)
    for step, (loss, params) in enumerate(runs, start=1):
        opt.zero_grad(set_to_none=True)
        with autocast("bf16", tokens.device):
            logits = plain_lm(tokens)
            plain_loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        plain_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, plain_loss.detach(), rtol=2e-2, atol=0)
        plain = {n: p.detach() for n, p in plain_lm.named_parameters()}
        if step == 1:
            _assert_bf16_close(params, plain, before)
    far, total = 0, 0
    for name, p in plain.items():
        diff = (params[name] - p).abs()
        assert diff.max() <= 3 * 2.1 * LR, name
        far, total = far + (diff > LR / 10).sum().item(), total + diff.numel()
    assert far <= 0.05 * total


def test_master_weights_default_and_refusals():
    lm, tokens, targets = _setup()
    engine = Engine.build(copy.deepcopy(lm), tokens, targets, EngineOptions(precision="bf16"))
    assert not engine.plan["master_weights"]  # auto: on for CUDA only
    assert isinstance(engine.optimizer, torch.optim.AdamW)
    with pytest.raises(ValueError, match="master_weights needs precision bf16"):
        Engine.build(lm, tokens, targets, EngineOptions(precision="fp32", master_weights=True))


def test_master_weights_memory_model_drops_the_autocast_copies():
    shape = memory_model.StepShape(97, 32, 64, 4, 4, 3, 16, "bf16", "sdpa", "cpu")
    mw = memory_model.StepShape(97, 32, 64, 4, 4, 3, 16, "bf16", "sdpa", "cpu", master_weights=True)
    assert memory_model.state_bytes(mw) == memory_model.state_bytes(shape)  # 4 + 2 + 2 + 8 = 16 B
    casts = 2 * 4 * (4 * 32 * 32 + 3 * 32 * 64)
    got = (
        memory_model.step_bytes(shape, "none", 7)["total"]
        - memory_model.step_bytes(mw, "none", 7)["total"]
    )
    assert got == casts + 2 * 32 * 97  # blocks' weight casts + the head weight's cast


def test_a_different_batch_is_caught():
    """The comparison can fail: the engine on other targets ends elsewhere."""
    lm, tokens, targets = _setup()
    _, plain = _plain_step(copy.deepcopy(lm), tokens, targets, "fp32")
    engine = Engine.build(lm, tokens, targets.roll(1, dims=1), EngineOptions(precision="fp32"))
    engine.step()
    diffs = [(engine.full_parameters()[n] - p).abs().max() for n, p in plain.items()]
    assert max(diffs) > 1e-5


def test_auto_checkpointing_follows_free_memory():
    lm, tokens, targets = _setup()
    opts = EngineOptions(precision="fp32", free_bytes=1e12)
    assert Engine.build(copy.deepcopy(lm), tokens, targets, opts).plan["strategy"] == "none"
    shape = memory_model.StepShape(97, 32, 64, 4, 4, 3, 16, "fp32", "sdpa", "cpu")
    none = memory_model.step_bytes(shape, "none", 7)["total"]
    tight = EngineOptions(precision="fp32", free_bytes=none / (1 - memory_model.MARGIN) - 1)
    plan = Engine.build(copy.deepcopy(lm), tokens, targets, tight).plan
    assert plan["strategy"] != "none" and plan["fits"]
    tiny = EngineOptions(precision="fp32", free_bytes=1.0)
    plan = Engine.build(lm, tokens, targets, tiny).plan
    assert not plan["fits"]
    assert memory_model.shortfall(plan, 1).startswith("skipped: needs ")


def test_the_2026_leaderboard_model_needs_checkpointing_and_sharding():
    """By the memory model: 8B on one 141 GB GPU does not fit; on two (FSDP, batch 1 each) it
    fits only with checkpointing."""
    big = dict(vocab_size=151_936, d_model=4096, d_ff=11_008, num_layers=34, num_heads=32)
    one = memory_model.StepShape(**big, batch=2, seq=32_768, world=1, scheme="single")
    assert not memory_model.choose_checkpointing(one, 141e9, 1024)["fits"]
    two = memory_model.StepShape(**big, batch=1, seq=32_768, world=2, scheme="fsdp")
    choice = memory_model.choose_checkpointing(two, 141e9, 1024)
    assert choice["fits"] and choice["strategy"] != "none"


# the reduced configuration the GPU-marked engine tests run (a CUDA-sized tiny model)
GPU_SPEC = {
    "vocab_size": 1000,
    "context_length": 256,
    "d_model": 256,
    "num_layers": 4,
    "num_heads": 4,
    "d_ff": 1024,
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_reduced_config_matches_the_plain_model():
    spec = GPU_SPEC
    loss, plain_loss, params, plain, before, engine = _both(
        "bf16", "auto", "cuda", spec=spec, batch=2, seq=256
    )
    torch.testing.assert_close(loss, plain_loss, rtol=2e-2, atol=0)
    _assert_bf16_close(params, plain, before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_master_weights_match_the_engine_without_them_and_the_plain_model():
    """On CUDA master weights are the default; one step against the engine without them
    (fused torch AdamW): loss to 1e-6, every master to 1e-6; against the plain model as the
    bf16 case above."""
    spec = GPU_SPEC
    lm, tokens, targets = _setup("cuda", spec=spec, batch=2, seq=256)
    before = {n: p.detach().clone() for n, p in lm.named_parameters()}
    engine, runs = _run(lm, tokens, targets, 1, checkpoint="none")
    assert engine.plan["master_weights"]
    _, without = _run(lm, tokens, targets, 1, checkpoint="none", master_weights=False)
    torch.testing.assert_close(runs[0][0], without[0][0], rtol=1e-6, atol=0)
    for name, p in without[0][1].items():
        torch.testing.assert_close(runs[0][1][name], p, rtol=0, atol=ADAM_ATOL, msg=name)
    plain_loss, plain = _plain_step(copy.deepcopy(lm), tokens, targets, "bf16")
    torch.testing.assert_close(runs[0][0], plain_loss, rtol=2e-2, atol=0)
    _assert_bf16_close(runs[0][1], plain, before)


# each a change of the engine's options on two ranks (fp32): FSDP by block and by layer, with
# whole-block and selective checkpointing, no prefetch, the plain loss; DDP + sharded AdamW
SCHEMES = {
    "fsdp": {"parallel": "fsdp", "checkpoint": "every_2"},
    "fsdp_ffn": {"parallel": "fsdp", "checkpoint": "ffn"},
    "fsdp_mixed": {"parallel": "fsdp", "checkpoint": "mixed_p1_f2"},
    "fsdp_layer": {"parallel": "fsdp", "checkpoint": "every_2", "fsdp_units": "layer"},
    "fsdp_no_prefetch_plain_loss": {
        "parallel": "fsdp",
        "checkpoint": "every_1",
        "prefetch": False,
        "loss": "plain",
    },
    "ddp_sharded": {"parallel": "ddp_sharded", "checkpoint": "every_2"},
}


def _rank_worker(rank: int, store_path: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    out = {}
    try:
        for scheme, kw in SCHEMES.items():
            lm, tokens, targets = _setup(batch=4)
            half = slice(2 * rank, 2 * rank + 2)  # each rank its half of the batch
            opts = EngineOptions(precision="fp32", lr=LR, **kw)
            engine = Engine.build(lm, tokens[half], targets[half], opts)
            loss = engine.step()
            dist.all_reduce(loss)
            full = {n: t.clone() for n, t in engine.full_parameters().items()}
            out[scheme] = {
                "loss": loss / 2,
                "params": full,
                "window": engine.net.__dict__.get("window"),
            }
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_the_plain_model_on_the_whole_batch():
    """fp32, FSDP (by block, by layer, each checkpointing kind, without prefetch, the plain
    loss) and DDP + sharded AdamW, two ranks of half the batch each: loss to 1e-5, parameters to
    1e-6 (as one rank)."""
    from dist_utils import run_forked_ranks

    ranks = run_forked_ranks(_rank_worker, 2)
    # a checkpointed pair is recomputed whole: FSDP holds it and prefetches the next unit
    assert ranks[0]["fsdp"]["window"] == 3 and ranks[0]["fsdp_mixed"]["window"] == 2
    assert ranks[0]["fsdp_no_prefetch_plain_loss"]["window"] == 1
    lm, tokens, targets = _setup(batch=4)
    plain_loss, plain = _plain_step(lm, tokens, targets, "fp32")
    for out in (r[scheme] for r in ranks for scheme in SCHEMES):
        torch.testing.assert_close(out["loss"], plain_loss, rtol=1e-5, atol=0)
        for name, p in plain.items():
            torch.testing.assert_close(out["params"][name], p, rtol=0, atol=ADAM_ATOL, msg=name)


@pytest.mark.gpu
def test_gpu_auto_measures_attention_and_checkpointing():
    """On CUDA `auto` times our FlashAttention-2 against SDPA's cuDNN at the step's shape (both
    checked against each other) and the first step measures what a block saves to choose the
    checkpointing again; the step still trains like the plain model (bf16 tolerances)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    spec = {**TINY, "context_length": 256, "num_layers": 6, "d_model": 256, "num_heads": 4}
    lm, tokens, targets = _setup("cuda", spec=spec, batch=2, seq=256)
    before = {n: p.detach().clone() for n, p in lm.named_parameters()}
    plain_loss, plain = _plain_step(copy.deepcopy(lm), tokens, targets, "bf16")
    engine = Engine.build(lm, tokens, targets, EngineOptions(precision="bf16", lr=LR))
    att = engine.plan["attention"]
    assert att["chosen"] in ("flash_triton", "sdpa_cudnn")
    assert att["ms"]["flash_triton"] > 0, att
    assert engine.calibration == {}  # pending: the first step measures
    loss = engine.step()
    cal = engine.calibration
    assert cal["block_plain_bytes"] > cal["block_ffn_bytes"] > cal["block_input_bytes"] > 0
    assert cal["choice"] == engine.plan["strategy"]
    # a small model on a large GPU: nothing needs recomputing
    assert cal["choice"] == "none", cal
    # the measuring step trains: the loss as the plain model's, every update within AdamW's
    # first step of it (about lr * sign(g); the attention kernels differ from naive's)
    torch.testing.assert_close(loss, plain_loss, rtol=2e-2, atol=0)
    for name, p in engine.full_parameters().items():
        assert (p.float() - plain[name].float()).abs().max() <= 2.1 * LR, name
        assert not torch.equal(p.float(), before[name].float()), name
