"""Optimizer-state sharding: two gloo processes step like one unsharded optimizer.

AdamW with weight decay, two parameter groups with their own hyperparameters, a third group
added after construction, and a learning-rate change between steps; SGD with momentum as a
second optimizer class. Each rank holds the state of its shard only.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_forked_ranks
from torch import nn

from cs336_systems import adapters
from cs336_systems.parallel.ddp import DDPFlat
from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

WORLD = 2
STEPS = 5


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    ).double()


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(STEPS, 8, 6, generator=g, dtype=torch.float64), torch.randn(
        STEPS, 8, 3, generator=g, dtype=torch.float64
    )


def groups(model: nn.Sequential) -> list[dict]:
    return [
        {"params": model[0].parameters(), "lr": 1e-2, "weight_decay": 0.1},
        {"params": model[2].parameters(), "lr": 3e-3, "weight_decay": 0.0},
    ]


def train(model, opt, rank: int | None, ddp=None) -> None:
    """STEPS steps; the last layer joins as a third group after step 1; lr changes at step 3."""
    xs, ys = batches()
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if rank is not None:
            x, y = x[rank * 4 : (rank + 1) * 4], y[rank * 4 : (rank + 1) * 4]
        net = ddp if ddp is not None else model
        ((net(x) - y) ** 2).mean().backward()
        if ddp is not None:
            ddp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 1:
            opt.add_param_group({"params": model[4].parameters(), "lr": 5e-3})
        if i == 3:
            opt.param_groups[0]["lr"] = 2e-2


def reference(optimizer_cls, **kwargs) -> dict[str, torch.Tensor]:
    model = make_model()
    train(model, optimizer_cls(groups(model), **kwargs), rank=None)
    return model.state_dict()


CASES = {
    "adamw": (torch.optim.AdamW, {"betas": (0.9, 0.95), "weight_decay": 0.05}),
    "sgd": (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
}


def _worker(rank: int, store: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    out = {}
    for name, (cls, kwargs) in CASES.items():
        model = make_model()
        ddp = DDPFlat(model)
        make = adapters.get_sharded_optimizer if name == "adamw" else ShardedOptimizer
        opt = make(groups(model), cls, **kwargs)
        train(model, opt, rank, ddp)
        owned = {i for i, p in enumerate(model.parameters()) if opt.owner[id(p)] == rank}
        with_state = {i for i, p in enumerate(model.parameters()) if p in opt.local_optimizer.state}
        out[name] = {
            "state": model.state_dict(),
            "owned": owned,
            "with_state": with_state,
            "shard_numel": list(opt.shard_numel),
            "n_groups": len(opt.param_groups),
            "lr0": opt.local_optimizer.param_groups[0]["lr"],
            "outer_has_defaults": all("lr" in g for g in opt.param_groups),
        }
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, torch.Tensor]]:
    return {name: reference(cls, **kwargs) for name, (cls, kwargs) in CASES.items()}


@pytest.fixture(scope="module")
def shards(references) -> list[dict]:
    # after the references: the forked children inherit what the first optimizer step imported
    return run_forked_ranks(_worker, WORLD)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_sharded_matches_unsharded(shards, references, name):
    expected = references[name]
    for rank, result in enumerate(shards):
        for key, value in expected.items():
            torch.testing.assert_close(
                result[name]["state"][key], value, rtol=1e-10, atol=1e-12, msg=f"rank {rank}: {key}"
            )
    assert not torch.allclose(expected["0.weight"], make_model().state_dict()["0.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_state_is_sharded(shards, name):
    owned = [r[name]["owned"] for r in shards]
    n_params = len(list(make_model().parameters()))
    assert owned[0].isdisjoint(owned[1])
    assert owned[0] | owned[1] == set(range(n_params))
    for r in shards:
        assert r[name]["with_state"] == r[name]["owned"]  # state only for the own shard
        assert r[name]["n_groups"] == 3
        assert r[name]["outer_has_defaults"]
    # balanced by elements: the greedy assignment keeps shards within one tensor's size
    numel = shards[0][name]["shard_numel"]
    largest = max(p.numel() for p in make_model().parameters())
    assert abs(numel[0] - numel[1]) <= largest
    assert shards[0][name]["lr0"] == pytest.approx(2e-2)  # the lr change reached the shard
