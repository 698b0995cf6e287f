"""The 2026 communication arithmetic (core/costs.py): hand-computed cases, the bounds' defining
equalities, and the volumes against bytes counted in real DDP and FSDP steps on 2 gloo ranks."""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_utils import run_forked_ranks
from torch import nn

from cs336_systems.core import costs
from cs336_systems.parallel import collectives
from cs336_systems.parallel.ddp import wrap
from cs336_systems.parallel.fsdp import FSDP

# a small case worked by hand: B=8, D=2, D_FF=3, N=4 devices, C=10 FLOP/s, W=5 B/s
B, D, DFF, N, C, W = 8, 2, 3, 4, 10.0, 5.0


def values(qs: dict) -> dict[str, float]:
    return {k: q.value for k, q in qs.items()}


def test_alternate_ring_all_reduce_by_hand():
    q = values(costs.alternate_ring_all_reduce(6.0, 4, 2.0))
    # 3 steps, each sending a whole 6-byte tensor at 2 B/s; the two-phase ring sends 2*3 chunks
    assert q == pytest.approx({"time": 9.0, "ring_time": 4.5, "slowdown": 2.0})


def test_data_parallel_by_hand():
    q = values(costs.data_parallel(B, D, DFF, N, C, W))
    # 12*8*2*3/4 FLOPs; all-reduce of 3*2*3*2 = 36 bytes: 2*(3/4)*36/5 s; N <= 1 + 8*5/10
    assert q == pytest.approx(
        {
            "backward_flops": 144.0,
            "backward_compute_time": 14.4,
            "backward_comm_time": 10.8,
            "max_devices": 5.0,
            "max_devices_large_n": 4.0,
        }
    )


def test_fsdp_by_hand():
    q = values(costs.fsdp(B, D, DFF, N, C, W))
    assert q["forward_flops"] == pytest.approx(72.0)
    assert q["backward_flops"] == pytest.approx(144.0)
    # forward: all-gather of 36 bytes, (3/4)*36/5; backward: all-gather + reduce-scatter
    assert q["forward_comm_time"] == pytest.approx(5.4)
    assert q["backward_comm_time"] == pytest.approx(10.8)
    assert q["forward_max_devices"] == q["backward_max_devices"] == pytest.approx(5.0)


def test_tensor_parallel_by_hand():
    q = values(costs.tensor_parallel(B, D, DFF, N, C, W))
    # all-reduce of a (8, 2) fp16 tensor = 32 bytes: 2*(3/4)*32/5 = 9.6 s per pass
    assert q["forward_comm_time"] == pytest.approx(9.6)
    assert q["backward_comm_time"] == pytest.approx(9.6)
    assert q["forward_flops"] == pytest.approx(72.0)
    # 1 + 1.5*3*5/10, 1 + 3*3*5/10
    assert q["forward_max_devices"] == pytest.approx(3.25)
    assert q["backward_max_devices"] == pytest.approx(5.5)


@pytest.mark.parametrize("fn", [costs.data_parallel, costs.fsdp, costs.tensor_parallel])
def test_each_bound_is_where_communication_equals_compute(fn):
    """At N equal to the bound, communication time equals compute time (any pass): the bound
    is the crossing, not a formula that merely looks like it."""
    b, d, dff, c, w = 4096, 1024, 4096, 1e15, 4e11
    q = fn(b, d, dff, 2, c, w)
    for p in ("forward", "backward"):
        key = f"{p}_max_devices" if f"{p}_max_devices" in q else "max_devices"
        if f"{p}_comm_time" not in q:
            continue
        n = q[key].value
        at = fn(b, d, dff, n, c, w)
        assert at[f"{p}_comm_time"].value == pytest.approx(at[f"{p}_compute_time"].value)
        below = fn(b, d, dff, n * 0.9, c, w)
        assert below[f"{p}_comm_time"].value < below[f"{p}_compute_time"].value


def test_fsdp_tp_reduces_to_each_axis_and_its_bounds():
    b, d, dff, c, w = 4096, 1024, 4096, 1e15, 4e11
    only_fsdp = costs.fsdp_tp(b, d, dff, 8, 1, c, w)
    only_tp = costs.fsdp_tp(b, d, dff, 1, 8, c, w)
    assert only_fsdp["comm_time_overlapped"].value == pytest.approx(
        costs.fsdp(b, d, dff, 8, c, w)["forward_comm_time"].value
    )
    assert only_tp["comm_time_overlapped"].value == pytest.approx(
        costs.tensor_parallel(b, d, dff, 8, c, w)["forward_comm_time"].value
    )
    q = costs.fsdp_tp(b, d, dff, 2, 2, c, w)
    nf, nt = q["best_n_fsdp"].value, q["best_n_tp"].value
    at = values(costs.fsdp_tp(b, d, dff, nf, nt, c, w))
    # at the best split both axes take exactly the compute time
    assert at["fsdp_comm_time"] == pytest.approx(at["forward_compute_time"])
    assert at["tp_comm_time"] == pytest.approx(at["forward_compute_time"])
    assert q["max_devices"].value == pytest.approx(nf * nt)


def _serial_search(b, d, dff, c, w):
    """(d) by search: for each N_FSDP >= 1 the largest N_TP >= 1 whose T_FSDP + T_TP (the exact
    ring times) stays within the forward's compute time."""
    best = (0.0, 0.0, 0.0)
    for i in range(0, 4000):
        nf = 1 + i * 0.02
        lo, hi = 1.0, 1e4

        def fits(nt, nf=nf):
            q = costs.fsdp_tp(b, d, dff, nf, nt, c, w)
            return q["comm_time_serial"].value <= q["forward_compute_time"].value * (1 + 1e-12)

        if not fits(1.0):
            continue
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        best = max(best, (nf * lo, nf, lo))
    return best


@pytest.mark.parametrize(
    "b, d, dff",
    [(65536, 4096, 11008), (2048, 2560, 10240)],
    ids=["8b-ctx32768", "xl-ctx512: the balanced split puts N_FSDP below 1"],
)
def test_fsdp_tp_serial_bound_by_search(b, d, dff):
    """(d): maximize N_FSDP N_TP subject to T_FSDP + T_TP <= the forward's compute time, each
    axis at least one device; the closed form must match a search over the exact ring times
    (the large-N form, a quarter of (c)'s, holds only where both axes are large)."""
    c, w = 2.5e15, 9e11
    q = costs.fsdp_tp(b, d, dff, 2, 2, c, w)
    n, nf, nt = _serial_search(b, d, dff, c, w)
    assert q["serial_max_devices"].value == pytest.approx(n, rel=1e-3)
    assert q["serial_best_n_fsdp"].value >= 1 and q["serial_best_n_tp"].value >= 1
    assert q["serial_best_n_fsdp"].value == pytest.approx(nf, abs=0.03)
    large = 3 * b * dff * w * w / (8 * c * c)
    assert q["serial_max_devices_large_n"].value == pytest.approx(large)
    if q["serial_best_n_fsdp"].value == 1:  # xl: TP alone, its forward bound
        assert n == pytest.approx(1 + 1.5 * dff * w / c, rel=1e-3) and large < 2


# ---- the volumes against real runs: 2 gloo ranks, one SwiGLU FFN -----------------------------

TD, TDFF, TB, WORLD = 8, 12, 6, 2


class FFN(nn.Module):
    """The handout's FFN: y = (silu(x W1) * (x W2)) W3, no biases."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w1 = nn.Linear(TD, TDFF, bias=False)
        self.w2 = nn.Linear(TD, TDFF, bias=False)
        self.w3 = nn.Linear(TDFF, TD, bias=False)

    def forward(self, x):
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    # each rank's batch shard; the input needs a gradient, as inside a model (dx is computed)
    x = torch.randn(TB // WORLD, TD, generator=torch.Generator().manual_seed(rank))
    out = {}
    for variant in ("naive", "flat"):
        ddp = wrap(FFN(), variant)
        loss = ddp(x.clone().requires_grad_()).sum()
        with collectives.counting() as counter:
            loss.backward()
            ddp.finish_gradient_synchronization()
        out[f"ddp_{variant}"] = counter.totals()
    for name, dtype in (("fsdp_fp32", None), ("fsdp_fp16", torch.float16)):
        fsdp = FSDP(FFN(), compute_dtype=dtype)
        fsdp(x.clone().requires_grad_()).float().sum().backward()  # records the layer order
        fsdp.finish_gradient_synchronization()
        with collectives.counting() as forward:
            y = fsdp(x.clone().requires_grad_())
        with collectives.counting() as backward:
            y.float().sum().backward()
            fsdp.finish_gradient_synchronization()
        out[f"{name}_forward"] = forward.totals()
        out[f"{name}_backward"] = backward.totals()
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def counted() -> list[dict]:
    return run_forked_ranks(functools.partial(_worker), WORLD)


KIND = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
}


def _check(totals: dict, volumes: dict[str, float]) -> None:
    """Every kind the formula names carries its size S and the ring's bytes on the wire
    ((N-1)/N S or 2 (N-1)/N S: the formula's time at W = 1 byte/s); every other kind none."""
    for kind, name in KIND.items():
        want = volumes.get(kind, 0.0)
        assert totals[name]["bytes"] == pytest.approx(want), kind
        wire = costs.comm_time({kind: want}, WORLD, 1.0) if want else 0.0
        assert totals[name]["wire_bytes"] == pytest.approx(wire), kind
    assert totals["broadcast"]["bytes"] == 0


@pytest.mark.parametrize("variant", ["naive", "flat"])
def test_ddp_counted_bytes_equal_the_data_parallel_volume(counted, variant):
    vol = costs.ffn_comm_volumes(TD, TDFF, WORLD, "dp", elem_bytes=4)
    for rank in counted:
        _check(rank[f"ddp_{variant}"], vol["backward"])


@pytest.mark.parametrize("name,elem", [("fsdp_fp32", 4), ("fsdp_fp16", 2)])
def test_fsdp_counted_bytes_equal_the_fsdp_volumes(counted, name, elem):
    vol = costs.ffn_comm_volumes(TD, TDFF, WORLD, "fsdp", elem_bytes=elem)
    for rank in counted:
        _check(rank[f"{name}_forward"], vol["forward"])
        _check(rank[f"{name}_backward"], vol["backward"])
