"""core/graphs.py: a training step's forward and backward replayed as CUDA graphs gives the same
losses and parameters as the eager step, on one GPU and under DDP and FSDP on two (NCCL
collectives inside the graphs)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.core.graphs import GraphedStep

STEPS = 4
LR = 1e-2  # large enough that a replay on stale gradients or inputs moves the losses apart


def _batch(device, seed=0, batch=2, context=24):
    from cs336_systems.model import VOCAB_SIZE

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (batch, context + 1), generator=gen).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def _train(model_fn, device, graphed: bool, x, y, bf16=False, finish=None):
    """Losses of STEPS AdamW steps and the final parameters, eager or graphed."""
    torch.manual_seed(0)
    model, params = model_fn()
    opt = torch.optim.AdamW(params, lr=LR)

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def backward(loss):
        loss.backward()
        if finish is not None:
            finish(model)

    losses = []
    if graphed:
        step = GraphedStep(forward, backward, lambda: opt.zero_grad(set_to_none=True))
        step.capture()
        for _ in range(STEPS):
            loss = step.forward()
            step.backward()
            opt.step()
            losses.append(loss.item())
    else:
        for _ in range(STEPS):
            loss = forward()
            backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    return losses, [p.detach().clone() for p in params]


def test_graphed_step_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the message a machine without CUDA gets")
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        GraphedStep(lambda: torch.zeros(()), lambda loss: None, lambda: None)


@pytest.mark.gpu
def test_graphed_step_matches_the_eager_step_on_one_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from cs336_systems.model import build_model

    device = torch.device("cuda")
    x, y = _batch(device)

    def model_fn():
        model = build_model("tiny", 32).to(device)
        return model, list(model.parameters())

    eager, p_eager = _train(model_fn, device, False, x, y)
    graphed, p_graphed = _train(model_fn, device, True, x, y)
    assert eager[0] > eager[-1] + 0.05  # the steps move the loss: stale replays would show
    assert graphed == pytest.approx(eager, rel=1e-5)
    for a, b in zip(p_eager, p_graphed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _wrapped_worker(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    from cs336_systems.model import build_model
    from cs336_systems.parallel.ddp import DDPOverlapIndividual
    from cs336_systems.parallel.fsdp import FSDP

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
    device = torch.device("cuda", rank)
    x, y = _batch(device, seed=rank)
    results = {}
    for name in ("ddp", "fsdp", "fsdp_bf16"):

        def model_fn(name=name):
            model = build_model("tiny", 32).to(device)
            if name == "ddp":
                return DDPOverlapIndividual(model), list(model.parameters())
            dtype = torch.bfloat16 if name.endswith("bf16") else None
            wrapper = FSDP(model, compute_dtype=dtype)
            return wrapper, list(wrapper.parameters())

        finish = lambda w: w.finish_gradient_synchronization()  # noqa: E731
        results[name] = [
            _train(model_fn, device, graphed, x, y, finish=finish) for graphed in (False, True)
        ]
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.gpu
def test_graphed_ddp_and_fsdp_steps_match_their_eager_steps_on_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    from dist_utils import run_forked_ranks

    for results in run_forked_ranks(_wrapped_worker, 2, start_method="spawn"):
        for name, ((eager, p_eager), (graphed, p_graphed)) in results.items():
            assert eager[0] > eager[-1] + 0.05, name
            rel = 2e-2 if name.endswith("bf16") else 1e-5
            assert graphed == pytest.approx(eager, rel=rel), name
            for a, b in zip(p_eager, p_graphed, strict=True):
                torch.testing.assert_close(a, b, rtol=rel, atol=rel * LR)
