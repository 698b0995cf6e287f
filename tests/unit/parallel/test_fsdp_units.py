"""FSDP by block (parallel/fsdp.py, `units="block"`) on the project's TransformerLM, against one
process training on the whole batch, on forked gloo ranks (2 and 3: 3 divides no tensor).

The reference is test_fsdp.py's: the mean of the ranks' micro-batch gradients added in rank
order (reductions in rank order with 3 ranks), so fp32 training is bitwise; checkpointing
(every block, pairs, nested halving) recomputes the same values and stays bitwise. bf16 compute
is compared with one process whose units (each block: every parameter and its inputs; the
embedding and the head: their weight and inputs) are cast to bf16 around their forward, as FSDP
casts them, within a bf16 tolerance (FSDP reduces the gradients in bf16).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_utils import run_forked_ranks
from torch import nn
from torch.utils._pytree import tree_map_only

from cs336_systems.core import checkpoint_plans
from cs336_systems.model import TransformerLM
from cs336_systems.parallel import collectives
from cs336_systems.parallel.fsdp import FSDP

VOCAB, SEQ, PER_RANK, STEPS, LAYERS = 50, 8, 2, 3, 4


def make_lm(tied: bool = False, frozen: bool = False) -> TransformerLM:
    lm = TransformerLM(VOCAB, SEQ, d_model=16, num_layers=LAYERS, num_heads=2, d_ff=24)
    lm.set_attention("sdpa")
    if tied:
        lm.lm_head.weight = lm.token_embeddings.weight
    if frozen:
        lm.layers[1].ffn.w2.weight.requires_grad_(False)
    return lm


def batches(world: int):
    g = torch.Generator().manual_seed(7)
    n = PER_RANK * world
    return [
        (
            torch.randint(0, VOCAB, (n, SEQ), generator=g),
            torch.randint(0, VOCAB, (n, SEQ), generator=g),
        )
        for _ in range(STEPS)
    ]


def loss_fn(logits, y):
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def cast_units(lm: TransformerLM, dtype: torch.dtype) -> None:
    """One process, FSDP's bf16 casts: each block's parameters and floating inputs, and the
    embedding's and head's weight and inputs, in `dtype` during their forward (and the
    backward through the cast brings the gradient back to the fp32 parameter)."""

    def cast_params(mod: nn.Module, names: list[tuple[nn.Module, str]]):
        def pre(m, args):
            for owner, attr in names:
                owner.__dict__[attr] = owner._parameters[attr].to(dtype)
            return tree_map_only(
                torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, args
            )

        def post(m, args, out):
            for owner, attr in names:
                owner.__dict__.pop(attr, None)

        mod.register_forward_pre_hook(pre)
        mod.register_forward_hook(post)

    for block in lm.layers:
        cast_params(
            block,
            [(m, a) for m in block.modules() for a, p in m._parameters.items() if p is not None],
        )
    for layer in (lm.token_embeddings, lm.lm_head):
        cast_params(layer, [(layer, "weight")])


def train(
    rank: int,
    world: int,
    strategy: str,
    dtype,
    tied=False,
    frozen=False,
    window=2,
    reduce=None,
    sgd=False,
):
    torch.manual_seed(0)
    base = make_lm(tied, frozen)
    ref, local = copy.deepcopy(base), copy.deepcopy(base)
    checkpoint_plans.apply(local, strategy)
    if dtype is not None:
        cast_units(ref, dtype)
    if rank:  # FSDP starts every rank from rank 0's model
        with torch.no_grad():
            for p in local.parameters():
                p.add_(1.0)
    fsdp = FSDP(local, compute_dtype=dtype, window=window, reduce_dtype=reduce)
    if sgd:  # an update proportional to the gradient: its rounding stays visible as such
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        opt = torch.optim.SGD(fsdp.parameters(), lr=0.05)
    else:
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
        opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2, weight_decay=0.1)
    diffs, counts, unplanned, peaks, in_flight = [], [], [], [], []
    for x, y in batches(world):
        grads = []
        for r in range(world):  # the reference: rank-order sum of micro-batch gradients / W
            ref.zero_grad(set_to_none=True)
            sl = slice(r * PER_RANK, (r + 1) * PER_RANK)
            loss_fn(ref(x[sl]), y[sl]).backward()
            grads.append([None if p.grad is None else p.grad / world for p in ref.parameters()])
        for i, p in enumerate(ref.parameters()):
            if grads[0][i] is not None:
                acc = grads[0][i]
                for r in range(1, world):
                    acc = acc + grads[r][i]
                p.grad = acc
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        fsdp.reset_peak()
        sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        with collectives.counting() as counter:
            loss_fn(fsdp(x[sl]), y[sl]).backward()
            fsdp.finish_gradient_synchronization()
        opt.step()
        counts.append({k: v["calls"] for k, v in counter.totals().items()})
        unplanned.append(fsdp.unplanned_gathers)
        in_flight.append(fsdp.peak_reduce_in_flight)
        peaks.append(fsdp.peak_resident)
        full = fsdp.gather_full_params()
        diffs.append(
            {
                n: (p.detach() - full[n]).abs().max().item()
                for n, p in ref.named_parameters(remove_duplicate=False)
            }
        )
    return {
        "diffs": diffs,
        "counts": counts,
        "unplanned": unplanned,
        "peaks": peaks,
        "in_flight": in_flight,
        "resident_after": fsdp.resident_layers(),
        "units": [(u.label, u.kind, len(u.flat.members)) for u in fsdp.units],
        "names": sorted(fsdp.gather_full_params()),
        "ref_names": sorted(n for n, _ in ref.named_parameters(remove_duplicate=False)),
    }


CASES = {
    "fp32_none": dict(strategy="none", dtype=None),
    "fp32_every_1": dict(strategy="every_1", dtype=None),
    "fp32_every_2": dict(strategy="every_2", dtype=None, window=3),
    "fp32_halving": dict(strategy="halving", dtype=None),
    "tied_frozen_every_2": dict(strategy="every_2", dtype=None, tied=True, frozen=True),
    "bf16_none": dict(strategy="none", dtype=torch.bfloat16, sgd=True),
    "bf16_every_1": dict(strategy="every_1", dtype=torch.bfloat16, sgd=True),
    "bf16_fp32_reduce": dict(strategy="every_1", dtype=torch.bfloat16, reduce=torch.float32),
}


def freed_after_use(rank: int, world: int) -> bool:
    """A wrapper trained a step and dropped is freed with its model (hooks on parameters live in
    C++, out of the garbage collector's sight: a strong one to the wrapper kept both)."""
    import gc
    import weakref

    torch.manual_seed(0)
    fsdp = FSDP(make_lm(), compute_dtype=torch.bfloat16)
    x, y = batches(world)[0]
    loss_fn(fsdp(x[:PER_RANK]), y[:PER_RANK]).backward()
    fsdp.finish_gradient_synchronization()
    refs = [weakref.ref(fsdp), weakref.ref(fsdp.sharded[1].param)]
    del fsdp
    gc.collect()
    return all(r() is None for r in refs)


def _worker(rank: int, store_path: str, out_dir: str, world: int) -> None:
    import os

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    out = {}
    with collectives.use(collectives.TorchCollectives(ordered=world > 2)):
        for name, kw in CASES.items():
            out[name] = train(rank, world, **kw)
        out["freed"] = freed_after_use(rank, world)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def run(request):
    world = request.param
    torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled())
    return world, run_forked_ranks(functools.partial(_worker, world=world), world)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fp32_none", "fp32_every_1", "fp32_every_2", "fp32_halving"])
def test_fp32_blocks_train_bitwise_like_one_process(run, case):
    _, ranks = run
    for rank, res in enumerate(ranks):
        r = res[case]
        bad = [(i, n, d) for i, s in enumerate(r["diffs"]) for n, d in s.items() if d != 0]
        assert bad == [], f"rank {rank}"
        assert r["names"] == r["ref_names"]
        assert r["resident_after"] == []


@pytest.mark.slow
def test_units_are_blocks_with_every_parameter_and_layers_outside(run):
    _, ranks = run
    units = ranks[0]["fp32_none"]["units"]
    # each block: 4 attention and 3 FFN projections and two norm gains in one flat buffer
    assert units == [
        ("token_embeddings", "layer", 1),
        *[(f"layers.{i}", "block", 9) for i in range(LAYERS)],
        ("lm_head", "layer", 1),
    ]
    # a tied head is the embedding's shard (used twice); a frozen weight leaves its block
    tied = ranks[0]["tied_frozen_every_2"]["units"]
    assert ("layers.1", "block", 8) in tied and ("layers.1.ffn.w2", "layer", 1) in tied
    assert ("lm_head", "layer", 1) in tied


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, backward_gathers",
    [("fp32_none", LAYERS + 1), ("fp32_every_1", LAYERS + 1), ("fp32_every_2", LAYERS + 1)],
)
def test_one_collective_per_unit_and_pass_all_prefetched(run, case, backward_gathers):
    world, ranks = run
    for res in ranks:
        r = res[case]
        units = LAYERS + 2
        for c in r["counts"]:
            # forward gathers every unit; backward all but the embedding (a lookup saves no
            # weight), again or for the checkpoint's recompute
            assert c["all_gather_into_tensor"] == units + backward_gathers
            assert c["reduce_scatter_tensor"] == units
            assert c["all_reduce"] == 1  # the final norm's gain, replicated
        # after the first step every gather was predicted and prefetched
        assert r["unplanned"][1:] == [0] * (STEPS - 1), r["unplanned"]
        assert r["resident_after"] == []


@pytest.mark.slow
def test_at_most_two_reduce_scatters_in_flight(run):
    # six units reduce in backward; the gradients of all but two are landed as they come
    _, ranks = run
    for res in ranks:
        assert max(res["fp32_none"]["in_flight"]) == 2
        assert max(res["fp32_every_2"]["in_flight"]) == 2


@pytest.mark.slow
def test_prefetch_keeps_the_window(run):
    _, ranks = run
    for res in ranks:
        assert max(res["fp32_none"]["peaks"]) <= 2
        assert max(res["fp32_every_1"]["peaks"]) <= 2
        assert max(res["fp32_every_2"]["peaks"]) <= 3  # a pair recomputed + the next one


@pytest.mark.slow
def test_tied_and_frozen_under_checkpointing(run):
    _, ranks = run
    for res in ranks:
        r = res["tied_frozen_every_2"]
        worst = max(d for s in r["diffs"] for d in s.values())
        assert worst < 1e-6  # the tied weight's two gradients are summed in another order
        assert r["diffs"][-1]["layers.1.ffn.w2.weight"] == 0  # frozen: never updated
        assert r["names"] == r["ref_names"]


@pytest.mark.slow
def test_bf16_compute_with_fp32_reduction_is_the_cast_reference_bitwise(run):
    # each rank's bf16 weight gradient, cast to fp32, divided by W and summed in rank order:
    # exactly what the cast reference computes
    _, ranks = run
    for res in ranks:
        r = res["bf16_fp32_reduce"]
        assert max(d for s in r["diffs"] for d in s.values()) == 0
        assert r["resident_after"] == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bf16_none", "bf16_every_1"])
def test_bf16_compute_and_reduction_match_the_cast_reference(run, case):
    _, ranks = run
    for res in ranks:
        r = res[case]
        # SGD at lr 0.05 on gradients of order 0.1-1: the bf16 sum of the ranks' gradients
        # rounds each by about 2^-8 of itself (a few 1e-4 after three steps); a wrong or
        # missing gradient moves a weight by the whole update, 1e-2 and more
        worst = max(d for s in r["diffs"] for d in s.values())
        assert worst < 2e-3, worst
        assert r["resident_after"] == []


@pytest.mark.slow
def test_a_dropped_wrapper_frees_its_model(run):
    _, ranks = run
    assert all(res["freed"] for res in ranks)
