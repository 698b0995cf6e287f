"""The engine's step against the plain model's: same loss, same parameters after one AdamW step.

Tolerances: fp32 (CPU): loss to 1e-5 relative, every parameter to 1e-6 absolute after a step of
lr 1e-3 (1e-3 of the step each element takes; AdamW's first step moves each element by about
lr). bf16 autocast: loss to 2e-2 relative; the parameters' updates differ where bf16 rounding
flips the sign of a near-zero gradient (AdamW's first step is about lr * sign(g)), so all but
1% of the elements of every parameter (2 where 1% is fewer) within lr/10 of the plain update,
and all within 2.1 lr.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.core.device import autocast
from cs336_systems.engine import memory
from cs336_systems.engine.step import Engine, EngineOptions
from cs336_systems.model import TransformerLM

LR = 1e-3
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


@pytest.mark.parametrize("checkpoint", ["none", "every_2", "halving"])
def test_fp32_step_matches_the_plain_model(checkpoint):
    loss, plain_loss, params, plain, before, engine = _both("fp32", checkpoint)
    assert engine.plan["strategy"] == checkpoint
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=0)
    assert params.keys() == plain.keys()
    for name, p in plain.items():
        assert not torch.equal(p, before[name]) or name.startswith("token"), name
        torch.testing.assert_close(params[name], p, rtol=0, atol=1e-6, msg=name)


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
    shape = memory.StepShape(97, 32, 64, 4, 4, 3, 16, "fp32", "sdpa", "cpu")
    none = memory.step_bytes(shape, "none", 7)["total"]
    tight = EngineOptions(precision="fp32", free_bytes=none / (1 - memory.MARGIN) - 1)
    plan = Engine.build(copy.deepcopy(lm), tokens, targets, tight).plan
    assert plan["strategy"] != "none" and plan["fits"]
    tiny = EngineOptions(precision="fp32", free_bytes=1.0)
    plan = Engine.build(lm, tokens, targets, tiny).plan
    assert not plan["fits"]
    assert memory.shortfall(plan, 1).startswith("skipped: needs ")


def test_the_2026_leaderboard_model_needs_checkpointing_and_sharding():
    """By the memory model: 8B on one 141 GB GPU does not fit; on two (FSDP, batch 1 each) it
    fits only with checkpointing."""
    big = dict(vocab_size=151_936, d_model=4096, d_ff=11_008, num_layers=34, num_heads=32)
    one = memory.StepShape(**big, batch=2, seq=32_768, world=1, scheme="single")
    assert not memory.choose_checkpointing(one, 141e9, 1024)["fits"]
    two = memory.StepShape(**big, batch=1, seq=32_768, world=2, scheme="fsdp")
    choice = memory.choose_checkpointing(two, 141e9, 1024)
    assert choice["fits"] and choice["strategy"] != "none"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_reduced_config_matches_the_plain_model():
    spec = {
        "vocab_size": 1000,
        "context_length": 256,
        "d_model": 256,
        "num_layers": 4,
        "num_heads": 4,
        "d_ff": 1024,
    }
    loss, plain_loss, params, plain, before, engine = _both(
        "bf16", "auto", "cuda", spec=spec, batch=2, seq=256
    )
    torch.testing.assert_close(loss, plain_loss, rtol=2e-2, atol=0)
    _assert_bf16_close(params, plain, before)


SCHEMES = ("fsdp", "ddp_sharded")


def _rank_worker(rank: int, store_path: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    out = {}
    try:
        for scheme in SCHEMES:
            lm, tokens, targets = _setup(batch=4)
            half = slice(2 * rank, 2 * rank + 2)  # each rank its half of the batch
            opts = EngineOptions(precision="fp32", checkpoint="every_2", lr=LR, parallel=scheme)
            engine = Engine.build(lm, tokens[half], targets[half], opts)
            loss = engine.step()
            dist.all_reduce(loss)
            full = {n: t.clone() for n, t in engine.full_parameters().items()}
            out[scheme] = {"loss": loss / 2, "params": full}
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_the_plain_model_on_the_whole_batch():
    """fp32, FSDP and DDP + sharded AdamW, two ranks of half the batch each: loss to 1e-5,
    parameters to 1e-6 (as one rank)."""
    from dist_utils import run_forked_ranks

    ranks = run_forked_ranks(_rank_worker, 2)
    lm, tokens, targets = _setup(batch=4)
    plain_loss, plain = _plain_step(lm, tokens, targets, "fp32")
    for out in (r[scheme] for r in ranks for scheme in SCHEMES):
        torch.testing.assert_close(out["loss"], plain_loss, rtol=1e-5, atol=0)
        for name, p in plain.items():
            torch.testing.assert_close(out["params"][name], p, rtol=0, atol=1e-6, msg=name)
