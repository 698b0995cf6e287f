"""The 2026 edition's DDP and sharded-optimizer adapters, checked the way the course checks them.

Two forked gloo ranks. DDP (`get_ddp`, `ddp_on_after_backward`): ranks start from different
models (the wrapper must broadcast rank 0's), a frozen bias and a fixed no-grad parameter stay
put, a tied weight stays tied, and five SGD steps on each rank's half of the batch match
single-process training on the whole batch. Sharded optimizer (`get_sharded_optimizer(params,
optimizer_cls, **kwargs)`): ten AdamW steps match the unsharded optimizer. FSDP's adapters are
exercised by tests/unit/parallel/test_fsdp.py.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_forked_ranks
from torch import nn

from cs336_systems import adapters

WORLD = 2


class Frozen(nn.Module):
    """Linear layers, one with a frozen bias, and a parameter that never trains."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = nn.Linear(10, 50)
        self.fc2.bias.requires_grad_(False)
        self.fc3 = nn.Linear(50, 5, bias=False)
        self.fixed = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 10, bias=False)
        self.fc2 = nn.Linear(10, 50, bias=False)
        self.fc3 = nn.Linear(50, 10, bias=False)
        self.fc4 = nn.Linear(10, 50, bias=False)
        self.fc5 = nn.Linear(50, 5, bias=False)
        self.fc4.weight = self.fc2.weight

    def forward(self, x):
        for fc in (self.fc1, self.fc2, self.fc3, self.fc4):
            x = torch.relu(fc(x))
        return self.fc5(x)


def ddp_case(model_cls, rank: int) -> dict:
    torch.manual_seed(rank)  # a different model on every rank
    reference = model_cls()
    ddp = adapters.get_ddp(copy.deepcopy(reference))
    out = {"start_equal": [], "fixed_equal": True}
    for (name, p), q in zip(reference.named_parameters(), ddp.module.parameters(), strict=True):
        if name == "fixed":
            out["fixed_equal"] &= torch.equal(p, q)
        else:
            out["start_equal"].append(torch.equal(p, q))
    # every rank's reference starts from rank 0's model, as DDP does
    reference.load_state_dict(ddp.module.state_dict())
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loss = nn.MSELoss()
    per = 20 // WORLD
    for step in range(5):
        opt_ref.zero_grad()
        loss(reference(x), y).backward()
        opt_ref.step()
        opt.zero_grad()
        sl = slice(rank * per, (rank + 1) * per)
        loss(ddp(x[sl]), y[sl]).backward()
        adapters.ddp_on_after_backward(ddp, opt)
        opt.step()
        perm = torch.randperm(20, generator=torch.Generator().manual_seed(42 + step))
        x, y = x[perm], y[perm]
    out["final_close"] = all(
        torch.allclose(p, q, atol=1e-6)
        for p, q in zip(reference.parameters(), ddp.module.parameters(), strict=True)
    )
    out["frozen_bias_unchanged"] = (
        torch.equal(ddp.module.fc2.bias, reference.fc2.bias) if model_cls is Frozen else True
    )
    out["tied"] = ddp.module.fc4.weight is ddp.module.fc2.weight if model_cls is Tied else True
    return out


def sharded_case(model_cls) -> bool:
    torch.manual_seed(42)
    plain = model_cls()
    sharded = copy.deepcopy(plain)
    kwargs = {"lr": 0.1, "weight_decay": 0.1, "betas": (0.9, 0.999), "eps": 1e-8}
    opt_plain = torch.optim.AdamW(plain.parameters(), **kwargs)
    opt_sharded = adapters.get_sharded_optimizer(sharded.parameters(), torch.optim.AdamW, **kwargs)
    for _ in range(10):
        x, y = torch.rand(32, 10), torch.rand(32, 5)
        for model, opt in ((plain, opt_plain), (sharded, opt_sharded)):
            opt.zero_grad()
            ((y - model(x)) ** 2).sum().backward()
            opt.step()
    return all(
        torch.allclose(p, q, rtol=1e-6, atol=1e-7)
        for p, q in zip(plain.parameters(), sharded.parameters(), strict=True)
    )


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results = {}
    for cls in (Frozen, Tied):
        results[f"ddp_{cls.__name__}"] = ddp_case(cls, rank)
        results[f"sharded_{cls.__name__}"] = sharded_case(cls)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    # a first AdamW step imports much of torch (seconds on 2 cores): once, here, before forking
    p = nn.Parameter(torch.zeros(1))
    p.grad = torch.zeros(1)
    torch.optim.AdamW([p]).step()
    return run_forked_ranks(_worker, WORLD)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["Frozen", "Tied"])
def test_get_ddp_matches_single_process(ranks, model):
    for rank, res in enumerate(ranks):
        r = res[f"ddp_{model}"]
        # rank 0 keeps its model; the other rank's differs from its own initial one
        assert all(r["start_equal"]) if rank == 0 else not any(r["start_equal"])
        assert r["fixed_equal"] and r["frozen_bias_unchanged"] and r["tied"]
        assert r["final_close"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["Frozen", "Tied"])
def test_get_sharded_optimizer_matches_adamw(ranks, model):
    assert all(res[f"sharded_{model}"] for res in ranks)


def test_2026_adapter_signatures():
    import inspect

    sig = {name: list(inspect.signature(getattr(adapters, name)).parameters) for name in (
        "get_ddp", "ddp_on_after_backward", "get_fsdp", "fsdp_on_after_backward",
        "fsdp_gather_full_params", "get_sharded_optimizer",
    )}  # fmt: skip
    assert sig == {
        "get_ddp": ["module"],
        "ddp_on_after_backward": ["ddp_model", "optimizer"],
        "get_fsdp": ["module", "compute_dtype"],
        "fsdp_on_after_backward": ["fsdp_model", "optimizer"],
        "fsdp_gather_full_params": ["fsdp_model"],
        "get_sharded_optimizer": ["params", "optimizer_cls", "kwargs"],
    }
    assert inspect.signature(adapters.get_fsdp).parameters["compute_dtype"].default is None
    # the 2025 names stay
    for name in ("get_ddp_individual_parameters", "get_ddp_bucketed"):
        assert callable(getattr(adapters, name))
