"""DDP wrappers: each variant trains like single-process training on the same global batch.

One spawned gloo group of two CPU processes trains a toy model (tied embedding/head, a frozen
layer, an unused layer, a buffer) with every variant and several bucket sizes; the parent
compares the replicas with single-process training on the whole batch.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_utils import run_forked_ranks
from pipeline_utils import ROOT, block
from torch import nn

from cs336_systems import adapters
from cs336_systems.parallel import collectives
from cs336_systems.parallel.ddp import DDPBucketed, DDPFlat, DDPNaive, DDPOverlapIndividual, wrap

WORLD = 2
STEPS = 4
GLOBAL_BATCH, SEQ, VOCAB = 8, 6, 17
# the toy model in float64: largest tensor 1088 B, all trainable ~3 KB; MB = 2**20 B
BUCKETS_MB = [0.0005, 0.001, 0.002, 1000.0]
CONFIGS = [("naive", None), ("flat", None), ("overlap", None)] + [
    ("bucketed", b) for b in BUCKETS_MB
]


class ToyModel(nn.Module):
    def __init__(self, d: int = 8, hidden: int = 12):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.fc1 = nn.Linear(d, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(3, 3)  # trainable but never used: keeps grad None
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, two modules
        self.register_buffer("offset", torch.zeros(d))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.offset
        h = h + self.fc2(F.gelu(self.norm(self.fc1(h))))
        return self.head(self.frozen(h))


def make_model(seed: int, offset: float = 0.0) -> ToyModel:
    torch.manual_seed(seed)
    model = ToyModel().double()
    model.offset.fill_(offset)
    return model


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (STEPS, GLOBAL_BATCH, SEQ + 1), generator=g)
    return tokens[..., :-1], tokens[..., 1:]


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def reference_state() -> dict[str, torch.Tensor]:
    model = make_model(seed=100)
    opt = make_optimizer(model.parameters())
    xs, ys = global_batch()
    for x, y in zip(xs, ys, strict=True):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.clone() for k, v in model.state_dict().items()}


def train_replica(variant: str, bucket: float | None, rank: int) -> dict:
    # every rank starts from a different model: the wrapper must broadcast rank 0's
    module = make_model(seed=100 + rank, offset=float(rank))
    if variant == "overlap":
        ddp = adapters.get_ddp_individual_parameters(module)
    elif variant == "bucketed":
        ddp = adapters.get_ddp_bucketed(module, bucket_size_mb=bucket)
    else:
        ddp = wrap(module, variant)
    opt = make_optimizer(ddp.module.parameters())
    xs, ys = global_batch()
    per = GLOBAL_BATCH // WORLD
    for x, y in zip(xs, ys, strict=True):
        x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        if variant == "bucketed":
            adapters.ddp_bucketed_on_train_batch_start(ddp, opt)
        loss_fn(ddp(x), y).backward()
        launched = _launched_during_backward(ddp)
        if variant == "bucketed":
            adapters.ddp_bucketed_on_after_backward(ddp, opt)
        elif variant == "overlap":
            adapters.ddp_individual_parameters_on_after_backward(ddp, opt)
        else:
            ddp.finish_gradient_synchronization()
        unused_grad_none = module.unused.weight.grad is None
        opt.step()
        opt.zero_grad(set_to_none=True)
    ddp.remove_hooks()
    out = {
        "state": {k: v.clone() for k, v in module.state_dict().items()},
        "unused_grad_none": unused_grad_none,
        "tied": module.head.weight is module.embed.weight,
        "launched": launched,
    }
    if isinstance(ddp, DDPBucketed):
        out["buckets"] = [[p.numel() * p.element_size() for p in b.params] for b in ddp.buckets]
    return out


def _launched_during_backward(ddp) -> tuple[int, int] | None:
    """(communications started by backward's hooks, those that could have been)."""
    with_grad = [p for p in ddp.sync_params if p.grad is not None]
    if isinstance(ddp, DDPOverlapIndividual):
        return len(ddp._pending), len(with_grad)
    if isinstance(ddp, DDPBucketed):
        complete = [b for b in ddp.buckets if all(p.grad is not None for p in b.params)]
        return sum(b.work is not None for b in ddp.buckets), len(complete)
    return None


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results = {f"{v}:{b}": train_replica(v, b, rank) for v, b in CONFIGS}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return reference_state()


@pytest.fixture(scope="module")
def replicas(reference) -> list[dict]:
    # after the reference: the forked children inherit what its first AdamW step imported
    return run_forked_ranks(_worker, WORLD)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "bucket"), CONFIGS, ids=[f"{v}-{b}" for v, b in CONFIGS])
def test_ddp_matches_single_process(replicas, reference, variant, bucket):
    initial = make_model(seed=100).state_dict()
    for rank, result in enumerate(replicas):
        got = result[f"{variant}:{bucket}"]
        assert got["tied"], "the wrapper must not untie shared weights"
        assert got["unused_grad_none"], "a parameter without gradient must keep grad=None"
        if variant in ("overlap", "bucketed"):  # communication started inside backward
            started, possible = got["launched"]
            assert started == possible
            # (with one big bucket, the unused parameter's bucket is only sent at the end)
            assert possible > 0 or len(got["buckets"]) == 1
        for name, expected in reference.items():
            torch.testing.assert_close(
                got["state"][name], expected, rtol=1e-9, atol=1e-11, msg=f"rank {rank}: {name}"
            )
        # frozen weights and the buffer are rank 0's initial ones on every rank
        torch.testing.assert_close(got["state"]["frozen.weight"], initial["frozen.weight"])
        torch.testing.assert_close(got["state"]["offset"], torch.zeros_like(initial["offset"]))
        # training moved the trainable parameters (the test is not vacuous)
        assert not torch.allclose(got["state"]["fc1.weight"], initial["fc1.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("bucket", BUCKETS_MB)
def test_bucket_layout(replicas, bucket):
    """Buckets respect the size limit (a tensor larger than it goes alone), cover every
    trainable parameter once, and have the same layout on both ranks."""
    layouts = [r[f"bucketed:{bucket}"]["buckets"] for r in replicas]
    assert layouts[0] == layouts[1]
    limit = bucket * 2**20
    for sizes in layouts[0]:
        assert sum(sizes) <= limit or len(sizes) == 1
    trainable = [
        p.numel() * p.element_size() for p in make_model(0).parameters() if p.requires_grad
    ]
    assert sorted(s for b in layouts[0] for s in b) == sorted(trainable)
    if bucket >= 1:
        assert len(layouts[0]) == 1
    if bucket <= 0.001:
        assert len(layouts[0]) > 2


# ------------------------------------------ a gradient accumulated twice in one step (tied)


class TiedAcrossCheckpoint(nn.Module):
    """A weight tied between a reentrant-checkpointed segment and the layer after it. The
    segment's backward is an autograd pass of its own, so in one backward the weight's gradient
    is accumulated twice (the layer's part, then the segment's) and its hooks fire twice."""

    def __init__(self, d: int = 6):
        super().__init__()
        self.pre = nn.Linear(d, d)
        self.inner = nn.Linear(d, d, bias=False)
        self.mid = nn.Linear(d, d)
        self.outer = nn.Linear(d, d, bias=False)
        self.outer.weight = self.inner.weight
        self.head = nn.Linear(d, 3)

    def segment(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mid(torch.tanh(self.inner(h))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(self.segment, torch.tanh(self.pre(x)), use_reentrant=True)
        return self.head(torch.tanh(self.outer(h)))


class _Deferred:
    def __init__(self, run):
        self._run, self._done = run, False

    def wait(self, timeout=None) -> bool:
        if not self._done:
            self._run()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


class DeferredCollectives(collectives.TorchCollectives):
    """An all-reduce started asynchronously reads and writes its tensor only when waited on:
    the slowest network there is. It forces the interleaving where backward adds into a
    gradient before the all-reduce already started on it has read it."""

    def all_reduce(self, tensor, group=None, async_op=False):
        run = functools.partial(collectives.TorchCollectives.all_reduce, self, tensor, group)
        if not async_op:
            return run()
        return _Deferred(run)


TIED_CONFIGS = [
    (variant, bucket, deferred)
    for variant, bucket in (("overlap", None), ("bucketed", 1e-6), ("bucketed", 1000.0))
    for deferred in (False, True)
]


def tied_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randint(
        0, 3, (8,), generator=g
    )


def tied_model(seed: int) -> TiedAcrossCheckpoint:
    torch.manual_seed(seed)
    return TiedAcrossCheckpoint().double()


def _tied_grads(variant: str, bucket: float | None, deferred: bool, rank: int) -> dict:
    model = tied_model(seed=10 + rank)  # the wrapper broadcasts rank 0's
    fired = []
    model.inner.weight.register_post_accumulate_grad_hook(lambda p: fired.append(1))
    impl = DeferredCollectives() if deferred else collectives.current()
    with collectives.use(impl):
        ddp = wrap(model, variant, bucket)
        x, y = tied_batch()
        half = slice(4 * rank, 4 * (rank + 1))
        ddp.on_train_batch_start()
        F.cross_entropy(ddp(x[half]), y[half]).backward()
        ddp.finish_gradient_synchronization()
    ddp.remove_hooks()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"grads": grads, "accumulations": len(fired)}


def _tied_worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results = {c: _tied_grads(*c, rank) for c in TIED_CONFIGS}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tied_replicas() -> list[dict]:
    return run_forked_ranks(_tied_worker, WORLD)


@pytest.mark.parametrize(
    ("variant", "bucket", "deferred"),
    TIED_CONFIGS,
    ids=[f"{v}-{b}-{'deferred' if d else 'gloo'}" for v, b, d in TIED_CONFIGS],
)
def test_a_weight_accumulated_twice_is_averaged_once(tied_replicas, variant, bucket, deferred):
    """The overlapping wrappers average a gradient accumulated twice in one step exactly: the
    all-reduce started after the first accumulation is finished before the second one adds
    into the gradient (with deferred collectives the addition would otherwise land before the
    all-reduce reads it), and the sum is sent again."""
    model = tied_model(seed=10)
    x, y = tied_batch()
    F.cross_entropy(model(x), y).backward()  # the whole batch in one process
    for rank, result in enumerate(tied_replicas):
        got = result[(variant, bucket, deferred)]
        assert got["accumulations"] == 2  # the case under test happened
        for name, p in model.named_parameters():
            torch.testing.assert_close(
                got["grads"][name], p.grad, rtol=1e-12, atol=1e-14, msg=f"rank {rank}: {name}"
            )


@pytest.fixture
def single_process_group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_bucket_order_and_wrappers(single_process_group):
    """Reverse registration order, one bucket per oversize tensor; the common interface."""
    model = make_model(0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ddp = DDPBucketed(model, bucket_size_mb=0.0005)
    flat = [p for b in ddp.buckets for p in b.params]
    assert [id(p) for p in flat] == [id(p) for p in reversed(trainable)]
    assert all(not p.requires_grad for p in model.frozen.parameters())
    assert ddp.num_buckets > 1
    ddp.remove_hooks()
    for cls in (DDPNaive, DDPFlat, DDPOverlapIndividual):
        w = cls(model)
        assert w.module is model
        assert len(w.sync_params) == len(trainable)  # tied weight once, frozen skipped
        w.remove_hooks()
    with pytest.raises(ValueError):
        DDPBucketed(model, bucket_size_mb=0)
    with pytest.raises(ValueError):
        wrap(model, "ring")


def test_overhead_model_and_optimum():
    from cs336_systems.core.costs import optimal_bucket, overhead_model

    s, w, o = 8e9, 300e9, 50e-6  # 8 GB of gradients, 300 GB/s, 50 us per call
    best = optimal_bucket(s, w, o)
    assert best["n_b"] == pytest.approx((s / (w * o)) ** 0.5)
    assert best["bucket_mb"] * 2**20 == pytest.approx((s * w * o) ** 0.5)
    # the optimum is a minimum of overhead(n_b) = s / (n_b w) + n_b o
    at = overhead_model(s, w, o, best["n_b"])
    assert at * 1e3 == pytest.approx(best["overhead_ms"])
    for factor in (0.5, 0.9, 1.1, 2.0):
        assert overhead_model(s, w, o, best["n_b"] * factor) > at


def test_profile_overlap_arithmetic():
    from cs336_systems.profiling.overlap import overlap_stats

    comm = [(0.0, 10.0), (20.0, 30.0)]  # us
    compute = [(5.0, 12.0), (8.0, 9.0), (25.0, 40.0)]
    stats = overlap_stats(comm, compute)
    assert stats["prof_comm_kernel_ms"] == pytest.approx(20e-3)
    assert stats["prof_comm_overlapped_ms"] == pytest.approx(10e-3)  # 5..10 and 25..30
    assert stats["prof_overlap_share"] == pytest.approx(0.5)


@pytest.mark.slow
def test_ddp_benchmark_end_to_end(tmp_path):
    """The stage's worker through the launcher: baseline and two variants, checked replicas."""
    from cs336_systems.stages.ddp import measure as bench

    knobs = block(
        "ddp", context_length=16, batch_per_rank=2, warmup_steps=0, measure_steps=2,
        variants=["naive", "bucketed", "torch_ddp"], bucket_sizes_mb=[1], profile=True,
        timeout_s=240,
    )  # fmt: skip
    args = bench.parse_args(
        ["variants", "--machine", "m", "--preset", "cpu", *knobs, "--trace-dir", str(tmp_path),
         "--out", str(tmp_path / "out.csv")]
    )  # fmt: skip
    rows = {(r["variant"], r["bucket_size_mb"]): r for r in bench.run(args)}
    peer = ("torch_ddp", bench.PEER_BUCKET_MB)
    assert set(rows) == {("baseline", None), ("naive", None), ("bucketed", 1.0), peer}
    # the peer (PyTorch's DDP) keeps the replicas equal and leaves nothing after backward
    assert rows[peer]["replica_spread"] == 0.0 and rows[peer]["comm_ms_mean"] < 1.0
    for key, r in rows.items():
        assert r["status"] == "ok", (key, r["status"])
        assert r["step_ms_mean"] > 0
        assert r["optimizer"] == "adamw_forloop"  # CPU tensors: AdamW's per-tensor loop
    for key in (("naive", None), ("bucketed", 1.0)):
        r = rows[key]
        assert r["replica_spread"] == 0.0
        assert r["comm_ms_mean"] > 0
        assert r["fwd_bwd_ms_mean"] + r["comm_ms_mean"] + r["opt_ms_mean"] <= r["step_ms_mean"]
    assert rows[("bucketed", 1.0)]["num_buckets"] > 1
    # every rank's trace, gzipped, in the step's folder (HolisticTraceAnalysis reads it whole)
    assert sorted(p.name for p in (tmp_path / "ddp_naive").iterdir()) == [
        "rank0.json.gz",
        "rank1.json.gz",
    ]
    assert rows[("naive", None)]["trace"] == "ddp_naive"


def _peer_worker(rank: int, store: str, out_dir: str) -> None:
    from cs336_systems.stages.ddp.peer import TorchDDP

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    x = torch.randn(4, 8) * (rank + 1)  # each rank its own batch: local gradients differ

    def grads_equal(net) -> bool:
        net(x).sum().backward()
        g = model[0].weight.grad.clone()
        model.zero_grad(set_to_none=True)
        every = [torch.empty_like(g) for _ in range(2)]
        dist.all_gather(every, g)
        return torch.allclose(every[0], every[1])

    peer = TorchDDP(model)
    averaged = grads_equal(peer)  # its reducer all-reduces during backward
    peer.remove_hooks()
    after = grads_equal(model)
    torch.save({"averaged": averaged, "after": after}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_the_peer_averages_gradients_and_leaves_no_hook_behind():
    """The stage runs the peer on the model the other variants use: once dropped, its reducer
    must average nothing more."""
    for r in run_forked_ranks(_peer_worker, 2):
        assert r == {"averaged": True, "after": False}


# ------------------------------------------------------------- report: suspect rows are shown


def _ddp_rows():
    """A CPU run's ddp.csv: every run ran; the bucketed 10 MB run is the fastest but its sync
    time's std is above its mean (generic check std_above_mean flags it on load)."""
    import pandas as pd
    from fixture_rows import prov

    common = {
        **prov(),
        "backend": "gloo",
        "device": "cpu",
        "world_size": 2,
        "size": "tiny",
        "params": 3_000_000,
        "context_length": 64,
        "batch_per_rank": 4,
        "status": "ok",
        "warmup_steps": 1,
        "measure_steps": 3,
        "num_grad_tensors": 21,
        "grad_mb": 11.77,
        "mem_init_peak_mb": float("nan"),
        "mem_before_step_peak_mb": float("nan"),
        "mem_after_step_peak_mb": float("nan"),
        "params_mb": 11.77,
        "grads_mb": 11.77,
    }
    # variant, bucket MB, buckets, step, fwd+bwd, comm mean, comm std, optimizer
    runs = [
        ("baseline", None, None, 90.0, 70.0, 0.01, 0.001, 20.0),
        ("naive", None, None, 200.0, 80.0, 100.0, 10.0, 20.0),
        ("flat", None, None, 150.0, 88.0, 40.0, 5.0, 20.0),
        ("overlap", None, None, 140.0, 110.0, 8.0, 2.0, 20.0),
        ("bucketed", 1.0, 5, 155.0, 90.0, 36.0, 4.0, 25.0),
        ("bucketed", 10.0, 2, 120.0, 80.0, 40.0, 45.0, 20.0),
    ]
    rows = [
        {
            **common,
            "kind": "variants",
            "variant": v,
            "bucket_size_mb": b,
            "num_buckets": n,
            "step_ms_mean": step,
            "step_ms_std": 5.0,
            "fwd_bwd_ms_mean": fb,
            "comm_ms_mean": comm,
            "comm_ms_std": comm_std,
            "opt_ms_mean": opt,
            "comm_share": comm / step,
        }
        for v, b, n, step, fb, comm, comm_std, opt in runs
    ]
    rows += [
        {
            **common,
            "kind": "sharding",
            "variant": v,
            "step_ms_mean": 160.0,
            "step_ms_std": 8.0,
            "fwd_bwd_ms_mean": 100.0,
            "comm_ms_mean": 20.0,
            "comm_ms_std": 5.0,
            "opt_ms_mean": 30.0,
            "comm_share": 0.1,
            "optimizer_state_mb": state,
        }
        for v, state in (("unsharded", 23.54), ("sharded", 13.77))
    ]
    return pd.DataFrame(rows)


def test_report_shows_suspect_ddp_runs_marked_and_keeps_them_out_of_sentences(tmp_path):
    from fixture_rows import write_results

    from cs336_systems.reporting import report
    from cs336_systems.stages.ddp import analysis

    results = write_results(tmp_path / "results" / "fixture-cpu", ddp=_ddp_rows())
    ctx = analysis.context(results)
    assert (ctx["n_ok"], ctx["n_points"], ctx["failed_table"]) == (8, 8, "")
    row = next(x for x in ctx["variant_table"].splitlines() if "bucketed 10 MiB" in x)
    assert "120 ± 5.00 ⚠ suspect" in row
    cells = [[c.strip() for c in x.split("|")[1:-1]] for x in ctx["bucket_table"].splitlines()]
    assert ["10", "2", "120 ⚠ suspect"] in [c[:3] for c in cells]
    # the sentence rests on the runs that passed: 1 MB, not the faster suspect 10 MB
    assert ctx["best_bucket"].startswith(
        "The fastest measured bucket size (1 suspect point excluded: see Suspect numbers) is "
        "1.00 MiB (155 ms per step"
    )
    section = report.render(results, ["ddp"]).split('<a id="ddp"></a>', 1)[1]
    section = section.split("<a id=", 1)[0]
    assert "8 of 8 runs succeeded." in section
    assert "Runs that did not succeed" not in section and "_(no rows)_" not in section
    assert "marked ⚠ where a table lists it" in section
    # a CPU/gloo run: no GPU wording, no conclusion about peaks it did not measure
    flat = " ".join(section.split())
    assert "(after model init, just before the optimizer step, just after it) needs a GPU" in flat
    assert "counter is reset at each point" not in flat and "does not change" not in section
    assert "peak of the optimizer step" not in section  # no allocator rows without CUDA
    assert "communication kernels" not in section


def _bucket_rows(overlap: tuple, buckets: list[tuple]):
    """ddp.csv rows of an overlap run (step, std, sync after backward) and bucketed runs
    (bucket MiB, buckets, step, std, sync), 435 gradient tensors, as on two H200s (xl)."""
    import pandas as pd
    from fixture_rows import prov

    common = {**prov(gpus=2), "kind": "variants", "backend": "nccl", "device": "cuda"}
    common |= {"world_size": 2, "size": "xl", "params": 2e9, "context_length": 512}
    common |= {"batch_per_rank": 4, "status": "ok", "warmup_steps": 2, "measure_steps": 5}
    common |= {"num_grad_tensors": 435, "grad_mb": 7622.66, "optimizer": "adamw_fused"}
    common |= {"opt_ms_mean": 16.0}
    step, std, sync = overlap
    rows = [{**common, "variant": "overlap", "step_ms_mean": step, "step_ms_std": std}]
    rows[0] |= {"comm_ms_mean": sync, "comm_ms_std": 0.01, "fwd_bwd_ms_mean": step - 30}
    rows[0] |= {"comm_share": sync / step}
    for mib, n, step, std, sync in buckets:
        rows.append(
            {
                **common,
                "variant": "bucketed",
                "bucket_size_mb": mib,
                "num_buckets": n,
                "step_ms_mean": step,
                "step_ms_std": std,
                "comm_ms_mean": sync,
                "comm_ms_std": 0.01,
                "fwd_bwd_ms_mean": step - 30 - sync,
                "comm_share": sync / step,
            }
        )
    return pd.DataFrame(rows)


def test_bucketed_against_overlap_is_stated_from_the_numbers():
    from cs336_systems.stages.ddp import answers

    # every bucket size ~10 ms slower than overlap, within 1 ms of each other; 1 MiB buckets
    # hold one tensor each, like overlap, and leave 10.25 ms after backward against 0.44
    d = _bucket_rows(
        (1025.0, 0.6, 0.44),
        [
            (1.0, 435, 1035.6, 0.5, 10.25),
            (10.0, 339, 1035.2, 0.4, 10.1),
            (100.0, 98, 1034.8, 0.7, 9.6),
            (1000.0, 8, 1035.0, 0.3, 9.9),
        ],
    )
    lines = answers.bucket_vs_overlap(d)
    assert lines[0] == (
        "The 4 bucket sizes (1, 10, 100, 1000 MiB) take 1,035–1,036 ms per step, within 0.80 ms "
        "of each other (step std 0.30–0.70 ms)."
    )
    assert lines[1] == (
        "Every bucket size is slower than per-parameter overlap (1,025 ms), by 9.80–10.60 ms "
        "(every gap larger than the step std of either run, at most 0.70 ms)."
    )
    assert lines[2].startswith("Sync left after backward: 1 MiB 10.25 ms, 10 MiB 10.10 ms")
    assert lines[2].endswith("against 0.44 ms for overlap.")
    assert len(lines) == 4  # only the 1 MiB buckets hold one tensor each
    assert lines[3].startswith(
        "With 1 MiB buckets each bucket holds one gradient tensor (435 buckets for 435 "
        "tensors), the same 435 all-reduces overlap sends, yet 10.25 ms are left after backward "
        "against 0.44 ms: 9.81 ms more, 22.55 µs per bucket"
    )
    # faster, within the noise, or a single bucket size: said as the numbers say it
    d = _bucket_rows((1025.0, 3.0, 0.44), [(1000.0, 8, 1023.5, 2.0, 0.3)])
    lines = answers.bucket_vs_overlap(d)
    assert lines[0] == (
        "The 1000 MiB run is faster than per-parameter overlap (1,025 ms), by 1.50 ms (not every "
        "gap larger than the runs' step std, at most 3.00 ms)."
    )
    assert len(lines) == 2 and "against 0.44 ms for overlap" in lines[1]
    d = _bucket_rows(
        (1025.0, 0.5, 0.44), [(1.0, 435, 1020.0, 0.5, 0.3), (10.0, 339, 1030, 0.5, 1.0)]
    )
    assert "range from 5.00 ms faster to 5.00 ms slower" in answers.bucket_vs_overlap(d)[1]
    # no overlap run that passed the checks: no comparison with it
    assert len(answers.bucket_vs_overlap(d[d["variant"] == "bucketed"])) == 1


def test_the_committed_h200_run_reads_as_its_numbers(tmp_path):
    """The two-H200 run kept as test data (2026 xl): every bucket size about 10 ms slower than
    per-parameter overlap and within 2 ms of each other; 1 and 10 MiB buckets hold one tensor
    each and leave 10.2 ms after backward against 0.43; sizes in MiB; an older CSV without the
    optimizer column says AdamW alone."""
    import re

    import pandas as pd
    from fixture_rows import write_results

    from cs336_systems.reporting import report
    from cs336_systems.stages.ddp import analysis

    csv = ROOT / "tests" / "fixtures" / "h200-x2"
    results = write_results(tmp_path / "h200-x2", ddp=pd.read_csv(csv / "ddp.csv"))
    ctx = analysis.context(results)
    assert ctx["bucket_vs_overlap"] == [
        "The 4 bucket sizes (1, 10, 100, 1000 MiB) take 1,034–1,036 ms per step, within 1.94 ms "
        "of each other (step std 0.069–0.18 ms).",
        "Every bucket size is slower than per-parameter overlap (1,024 ms), by 9.41–11.35 ms "
        "(every gap larger than the step std of either run, at most 0.18 ms).",
        "Sync left after backward: 1 MiB 10.23 ms, 10 MiB 10.25 ms, 100 MiB 9.17 ms, 1000 MiB "
        "8.49 ms, against 0.43 ms for overlap.",
        "With 1 and 10 MiB buckets each bucket holds one gradient tensor (291 buckets for 291 "
        "tensors), the same 291 all-reduces overlap sends, yet 10.23 and 10.25 ms are left "
        "after backward against 0.43 ms: 9.80 and 9.82 ms more, 33.68 and 33.75 µs per bucket, "
        "spent after backward on what the bucketed wrapper does there per bucket (it waits for "
        "the bucket's all-reduce and copies the result back into the gradients; overlap only "
        "waits).",
    ]
    assert "fp32, AdamW; 3 warm-up" in ctx["setup"]
    section = report.render(results, ["ddp"]).split('<a id="ddp"></a>', 1)[1]
    assert "Bucketed against per-parameter overlap:" in section
    assert "| MiB per rank (max over ranks)" in section and "MiB of gradients" in section
    assert "| bucketed 1 MiB " in section
    assert not re.search(r"\d MB\b|\bMB per", section)


def test_each_row_says_which_optimizer_it_ran(tmp_path):
    from fixture_rows import write_results

    from cs336_systems.stages.ddp import analysis

    d = _bucket_rows((1025.0, 0.6, 0.44), [(1.0, 435, 1035.6, 0.5, 10.25)])
    ctx = analysis.context(write_results(tmp_path / "a", ddp=d))
    assert "fp32, AdamW (`adamw_fused`);" in ctx["setup"]
    d.loc[0, "optimizer"] = "adamw_foreach"
    ctx = analysis.context(write_results(tmp_path / "b", ddp=d))
    assert "AdamW (`adamw_foreach`, `adamw_fused`: each run's in the table)" in ctx["setup"]
    rows = [[c.strip() for c in x.split("|")] for x in ctx["variant_table"].splitlines()]
    col = rows[0].index("optimizer")
    assert [r[col] for r in rows[2:]] == ["adamw_foreach", "adamw_fused"]


def test_optimizer_impl_names_what_step_runs():
    from cs336_systems.model import optimizer_impl

    params = list(nn.Linear(3, 3).parameters())
    assert optimizer_impl(torch.optim.AdamW(params, fused=True)) == "adamw_fused"
    assert optimizer_impl(torch.optim.AdamW(params, foreach=True)) == "adamw_foreach"
    assert optimizer_impl(torch.optim.AdamW(params, foreach=False)) == "adamw_forloop"
    # neither given: torch's own choice (for-loop for CPU tensors, foreach for CUDA ones)
    assert optimizer_impl(torch.optim.AdamW(params)) == "adamw_forloop"
    assert optimizer_impl(torch.optim.SGD(params, lr=0.1, foreach=True)) == "sgd_foreach"

    class Wrapper(torch.optim.Optimizer):  # a sharded optimizer: reports the one it steps
        def __init__(self):
            super().__init__(params, {})
            self.local_optimizer = torch.optim.AdamW(params, fused=True)

    assert optimizer_impl(Wrapper()) == "adamw_fused"


@pytest.mark.parametrize("variant", ["overlap_individual", "bucketed"])
def test_a_dropped_wrapper_frees_its_model(single_process_group, variant):
    """Gradient hooks live in C++, out of the garbage collector's sight: a hook holding the
    wrapper strongly would keep the wrapper, its model and its gradients alive after a step."""
    import gc
    import weakref

    model = make_model(0)
    ddp = DDPBucketed(model, 0.0005) if variant == "bucketed" else DDPOverlapIndividual(model)
    x, y = global_batch()
    ddp.on_train_batch_start()
    loss_fn(ddp(x[0]), y[0]).backward()
    ddp.finish_gradient_synchronization()
    refs = [weakref.ref(ddp), weakref.ref(model)]
    del ddp, model
    gc.collect()
    assert all(r() is None for r in refs)


def test_a_run_whose_bucketed_rows_are_all_suspect_still_renders(tmp_path):
    """On 2 shared CPU cores every bucketed run can fail a sanity check (a cpu preset run did:
    both bucket sizes' optimizer times had a std above their mean); the section then has no
    bucket comparison and says so by its absence, and the report still renders."""
    from fixture_rows import write_results

    from cs336_systems.reporting import report
    from cs336_systems.stages.ddp import analysis

    rows = _ddp_rows()
    rows.loc[rows["variant"] == "bucketed", "comm_ms_std"] = 100.0  # above every mean
    results = write_results(tmp_path / "results" / "fixture-cpu", ddp=rows)
    ctx = analysis.context(results)
    assert ctx["bucket_vs_overlap"] == []
    section = report.render(results, ["ddp"]).split('<a id="ddp"></a>', 1)[1]
    assert "Bucketed against per-parameter overlap" not in section
    assert "bucketed 1 MiB" in section  # the runs themselves are shown, flagged


def test_the_peer_is_set_beside_our_fastest_run():
    import pandas as pd

    from cs336_systems.stages.ddp.answers import peer_sentence

    def run(variant, bucket, step, std, status="ok"):
        return {"variant": variant, "bucket_size_mb": bucket, "status": status,
                "step_ms_mean": step, "step_ms_std": std}  # fmt: skip

    d = pd.DataFrame(
        [
            run("overlap", None, 1025.3, 0.12),
            run("bucketed", 100.0, 1020.0, 0.5),
            run("bucketed", 10.0, 1000.0, 0.5, status="error: diverged"),
            run("torch_ddp", 25.0, 1034.7, 0.41),
        ]
    )
    assert peer_sentence(d) == (
        "The peer, PyTorch's DistributedDataParallel (25 MiB buckets), takes 1,035 ± 0.41 ms a "
        "step; our fastest, bucketed 100 MiB, 1,020 ± 0.50 ms (0.99× the peer's time)."
    )
    assert peer_sentence(d[d["variant"] != "torch_ddp"]) == ""
    assert peer_sentence(d[d["variant"] == "torch_ddp"]) == ""


H200 = ROOT / "tests" / "fixtures" / "h200-x2"


def _naive_flat(naive_ms: float, flat_ms: float, std: float, calls: int = 435):
    """The two-H200 run's variants rows with naive and flat communication set as given, on the
    2025 XL's 435 gradient tensors (the audit's 61.04 vs 61.02 ms)."""
    import pandas as pd

    df = pd.read_csv(H200 / "ddp.csv")
    for variant, ms in (("naive", naive_ms), ("flat", flat_ms)):
        at = df["variant"] == variant
        df.loc[at, ["comm_ms_mean", "comm_ms_std", "num_grad_tensors"]] = (ms, std, calls)
    return df


def test_an_impossible_per_call_cost_is_rejected_and_never_used():
    """naive − flat over the calls saved: 0.040 ms / 434 = 0.092 µs per call, below any
    collective's cost and far below the all-reduce stage's 18.7 µs: rejected with its reason,
    left out of the bucket model; a difference within the runs' std is rejected as noise."""
    import pandas as pd

    from cs336_systems.stages.ddp import answers, rows

    allreduce = pd.read_csv(H200 / "allreduce.csv")
    fits = rows.comm_fits(_naive_flat(61.04, 61.00, 0.001), allreduce)
    pair = fits["naive vs flat DDP runs"]
    assert pair["o"] == pytest.approx(0.04e-3 / 434)
    assert pair["problem"].startswith("a per-call cost of 0.092 µs is below 1 µs")
    assert list(rows.usable(fits)) == ["allreduce stage"]
    assert fits["allreduce stage"]["o"] == pytest.approx(18.74e-6, rel=0.01)
    lines = answers.fit_lines(fits, rows.variant_runs(_naive_flat(61.04, 61.00, 0.001)))
    assert "⚠ rejected, not used: a per-call cost of 0.092 µs" in lines[1]
    noisy = rows.comm_fits(_naive_flat(61.04, 61.02, 0.5), allreduce)["naive vs flat DDP runs"]
    assert noisy["problem"] == (
        "naive and flat communication differ by 0.020 ms, within their std (0.50 ms)"
    )


def test_flat_equal_to_naive_is_explained_from_calls_bytes_and_the_fit():
    """Flat = naive: the 434 calls saved at the all-reduce stage's o against the bandwidth term
    s/w of the same bytes; where the fit cannot be quoted, flagged instead."""
    import pandas as pd

    from cs336_systems.core.costs import MiB
    from cs336_systems.stages.ddp import answers, rows

    df = _naive_flat(61.04, 61.02, 0.5)
    fit = rows.comm_fits(df, pd.read_csv(H200 / "allreduce.csv"))["allreduce stage"]
    d = rows.variant_runs(df)
    naive, flat = rows.one(d, "naive"), rows.one(d, "flat")
    text = answers.flat_vs_naive(naive, flat, fit)
    saved = 434 * fit["o"] * 1e3
    band = naive.grad_mb * MiB / fit["w"] * 1e3
    assert "naive in 435 calls and flat in one" in text
    assert f"(n − 1)·o = {saved:.2f} ms, against a bandwidth term s/w = {band:.2f} ms" in text
    assert "naive communicates 0.020 ms longer (std up to 0.50 ms)" in text
    assert "of the predicted saving does not show" in text  # 8 ms predicted, 0.02 ms seen
    # a fit whose saved calls cost a tenth of the bytes' time or less: bound by bytes
    small = {**fit, "o": 1e-6}
    assert "bound by its bytes, not its calls" in answers.flat_vs_naive(naive, flat, small)
    # calls that would dominate, their saving within the steps' std: no verdict either way
    noisy = naive.copy()
    noisy["comm_ms_std"] = 2 * saved
    unclear = answers.flat_vs_naive(noisy, flat, fit)
    assert "bound by its bytes" not in unclear and "does not show" not in unclear
    assert "these steps cannot tell flat from naive" in unclear
    share = 100 * saved / (435 * fit["o"] * 1e3 + band)
    assert f"refute a saving of {share:.1f}% of naive's predicted time" in unclear
    flagged = answers.flat_vs_naive(naive, flat, {**fit, "problem": "a poor fit"})
    assert "Flagged: the per-call and bandwidth terms cannot be told apart" in flagged
    assert flagged.endswith("(its fit is rejected: a poor fit).")
    assert "Flagged" in answers.flat_vs_naive(naive, flat, None)


def _comm_run(variant: str, step: float, step_std: float, comm: float, comm_std: float):
    """One ddp.csv row for the answer-level tests: 21 gradient tensors, 11.77 MiB, gloo."""
    return {"variant": variant, "status": "ok", "backend": "gloo", "num_grad_tensors": 21,
            "grad_mb": 11.77, "step_ms_mean": step, "step_ms_std": step_std,
            "comm_ms_mean": comm, "comm_ms_std": comm_std}  # fmt: skip


def test_the_share_flat_saves_is_of_naives_predicted_time_and_its_gap_only_likely_copies():
    """The CPU reference: o = 1,532 µs, w = 1.55 GB/s, 21 calls: naive's predicted time is
    21·o + s/w = 40.12 ms, so the 20 calls flat saves (30.64 ms) are 76.4% of it, not the 79.4%
    that 30.64 / (30.64 + 7.95) gives; the saving that does not show is put down to the copies
    as a likely cause only: no copy time is measured."""
    import pandas as pd

    from cs336_systems.core.costs import MiB
    from cs336_systems.stages.ddp import answers

    fit = {"o": 1.532e-3, "w": 11.77 * MiB / 7.95e-3, "problem": ""}
    naive = pd.Series(_comm_run("naive", 97.9, 6.4, 52.70, 3.3))
    flat = pd.Series(_comm_run("flat", 67.6, 7.6, 21.81, 7.5))
    text = answers.flat_vs_naive(naive, flat, fit)
    assert "(the saving is 76.4% of naive's predicted time, n·o + s/w)" in text
    assert "79.4%" not in text
    short = answers.flat_vs_naive(naive, pd.Series(_comm_run("flat", 97.0, 0.1, 52.0, 0.1)), fit)
    assert "of the predicted saving does not show" in short
    assert "likely flat's copies" in short and "flat spends it copying" not in short


def test_flat_slower_than_naive_is_a_multiple_of_naives_time_not_more():
    """The four-H200 reference: 60.54 against 59.33 ms is 1.02× naive's time, not "1.02× more"."""
    import pandas as pd

    from cs336_systems.stages.ddp import answers

    naive = pd.Series(_comm_run("naive", 1068.0, 0.6, 59.33, 0.49))
    flat = pd.Series(_comm_run("flat", 1069.0, 0.3, 60.54, 0.32))
    text = answers.q24(naive, flat)
    assert text.endswith("(1.02× naive's communication time).") and "× more" not in text


def test_overlap_is_read_against_naive_and_flat_beside_the_spread():
    """The CPU reference: overlap's 98.90 ms step is naive's within the spread and slower than
    flat's, with twice flat's communication left: not "only"; the four-H200 one: faster than
    both, 0.44 ms left against ~60 ms: "only"."""
    import pandas as pd

    from cs336_systems.stages.ddp import answers

    cpu = pd.DataFrame(
        [
            _comm_run("naive", 97.93, 6.43, 52.70, 3.26),
            _comm_run("flat", 67.61, 7.64, 21.81, 7.50),
            _comm_run("overlap", 98.90, 12.82, 42.84, 10.56),
        ]
    )
    text = answers.q25(cpu, answers.one(cpu, "overlap"), None)
    assert (
        "98.90 ms per step (naive 97.93 ms, flat 67.61 ms): overlapping did not help here, as "
        "fast as naive within the step std of 12.82 ms and 31.29 ms slower than flat (step std "
        "up to 12.82 ms); 42.84 ms of communication is left after backward, against naive's "
        "52.70 ms and flat's 21.81 ms."
    ) in text
    assert "only" not in text
    gpu = pd.DataFrame(
        [
            _comm_run("naive", 1067.66, 0.56, 59.33, 0.49),
            _comm_run("flat", 1068.83, 0.34, 60.54, 0.32),
            _comm_run("overlap", 1024.67, 0.10, 0.44, 0.07),
        ]
    )
    text = answers.q25(gpu, answers.one(gpu, "overlap"), None)
    assert "42.99 ms faster than naive (step std up to 0.56 ms) and 44.16 ms faster than flat" in (
        text
    )
    assert "did not help" not in text
    assert "; only 0.44 ms of communication is left after backward, against naive's" in text


def test_a_saving_beyond_the_predicted_one_and_the_std_is_not_called_a_match():
    """The CPU-2025 reference: the 20 calls flat saves cost 24.74 ms, yet naive communicates
    38.65 ms longer (std up to 11.30 ms): 13.91 ms more than predicted, beyond the std, is said
    with its numbers and no cause; only a saving within the std "matches"."""
    import pandas as pd

    from cs336_systems.core.costs import MiB
    from cs336_systems.stages.ddp import answers

    fit = {"o": 1.237e-3, "w": 11.77 * MiB / 7.95e-3, "problem": ""}
    naive = pd.Series(_comm_run("naive", 97.9, 6.4, 60.00, 11.30))
    flat = pd.Series(_comm_run("flat", 67.6, 7.6, 21.35, 8.00))
    text = answers.flat_vs_naive(naive, flat, fit)
    assert "(n − 1)·o = 24.74 ms" in text
    assert "naive communicates 38.65 ms longer (std up to 11.30 ms)" in text
    assert text.endswith(
        " The measured saving is 13.91 ms more than the per-call costs flat no longer pays, "
        "beyond the std: more than the fit's per-call cost accounts for here."
    )
    assert "matches" not in text
    close = answers.flat_vs_naive(naive, pd.Series(_comm_run("flat", 67.6, 7.6, 30.0, 8.0)), fit)
    assert "matches the per-call costs flat no longer pays" in close


def test_a_forward_backward_slowdown_within_the_std_is_given_no_cause():
    """The CPU reference: 48.87 ms against 45.59 ms without communication, stds 5.2 and
    6.2 ms: within the spread, no competition for CPU cores asserted; a difference beyond the
    larger std is put down to it."""
    import pandas as pd

    from cs336_systems.stages.ddp import answers

    def fwd_bwd(variant, mean, std):
        return {**_comm_run(variant, 98.9, 12.8, 42.84, 10.56), "fwd_bwd_ms_mean": mean,
                "fwd_bwd_ms_std": std}  # fmt: skip

    d = pd.DataFrame([fwd_bwd("naive", 45.0, 5.0), fwd_bwd("overlap", 48.87, 5.2)])
    base = pd.Series(fwd_bwd("compute_only", 45.59, 6.2))
    text = answers.q25(d, answers.one(d, "overlap"), base)
    assert (
        " Forward+backward itself takes 48.87 ms against 45.59 ms without communication: the "
        "two are within the steps' spread (std up to 6.20 ms), so no slowdown shows."
    ) in text
    assert "compete" not in text
    d.loc[d["variant"] == "overlap", "fwd_bwd_ms_mean"] = 60.0
    slower = answers.q25(d, answers.one(d, "overlap"), base)
    assert (
        "60.00 ms against 45.59 ms without communication, 14.41 ms longer, beyond the std (up to "
        "6.20 ms): the all-reduces launched during backward compete with it for CPU cores."
    ) in slower


def test_the_uneven_split_caveat_only_where_the_state_is_off_an_even_split():
    """The four-H200 reference halves the state exactly (0.50×): no caveat about whole
    parameters there; the CPU one's 0.59× keeps it."""
    import pandas as pd

    from cs336_systems.stages.ddp import answers

    def run(state):
        return pd.Series({"world_size": 2, "optimizer_state_mb": state, "step_ms_mean": 1.0,
                          "opt_ms_mean": 1.0})  # fmt: skip

    even = answers.sharding(run(25991.9), run(12995.96), False, False)["state"]
    assert "(0.50×, an even split over 2 ranks)." in even and "assigned whole" not in even
    uneven = answers.sharding(run(23.54), run(13.77), False, False)["state"]
    assert "(0.58×; an even split over 2 ranks would be 0.50× — parameters are assigned" in uneven


def test_the_sharding_step_resets_the_peak_counter_between_its_points(monkeypatch):
    """The recorded step reads the memory before the optimizer step, resets the peak counter,
    then steps: the peak after the step is the optimizer step's own, not the backward's."""
    from cs336_systems.core.harness import StepClock
    from cs336_systems.stages.ddp import measure

    events: list[str] = []
    monkeypatch.setattr(measure, "_reset_peak", lambda device: events.append("reset"))
    monkeypatch.setattr(measure, "_allocated", lambda device: events.append("read") or (1.0, 2.0))
    model = nn.Linear(4, 5)

    class Wrapper:
        def __call__(self, x):
            events.append("forward")
            return model(x)

        def finish_gradient_synchronization(self):
            events.append("sync")

    class Optimizer:
        def step(self):
            events.append("step")

        def zero_grad(self, set_to_none=True):
            model.zero_grad(set_to_none=set_to_none)

    x, y = torch.randn(2, 3, 4), torch.randint(0, 5, (2, 3))
    memory: dict = {}
    step = measure._memory_step(Wrapper(), model, Optimizer(), x, y, torch.device("cpu"), memory)
    step(StepClock(torch.device("cpu")))
    assert events == ["forward", "sync", "step"]  # a timed step reads nothing
    events.clear()
    step(StepClock(torch.device("cpu")), record=True)
    assert events == ["reset", "forward", "sync", "read", "reset", "step", "read"]
    assert memory["grads_mb"] == pytest.approx(
        sum(p.numel() * 4 for p in model.parameters()) / 2**20
    )


def _sharding_rows(reset: bool):
    import pandas as pd

    df = pd.read_csv(H200 / "ddp.csv")
    df = df[df["kind"] == "sharding"].copy()
    if reset:  # as a run with the counter reset at each point reads: the step's peak apart
        df["mem_after_step_peak_mb"] = df["mem_after_step_allocated_mb"] + 25_000.0
        df["mem_peaks_reset"] = True
    return df


def test_the_three_memory_points_are_read_apart_only_where_the_counter_was_reset():
    from cs336_systems.stages.ddp import answers, rows

    old = _sharding_rows(reset=False)
    u, s = (old[old["variant"] == v].iloc[0] for v in ("unsharded", "sharded"))
    text = answers.sharding(u, s, True, rows.peaks_reset(old))["peaks"]
    assert "the peaks before and after the step are one number and are not compared" in text
    assert "peak up to just after the optimizer step" in rows.memory_table(old)
    new = _sharding_rows(reset=True)
    u, s = (new[new["variant"] == v].iloc[0] for v in ("unsharded", "sharded"))
    text = answers.sharding(u, s, True, rows.peaks_reset(new))["peaks"]
    assert "Peaks, the counter reset at each point: forward+backward 60,431 vs 47,434 MiB" in text
    assert "the optimizer step itself 77,256 vs 64,259 MiB" in text
    table = rows.memory_table(new)
    assert "peak of the optimizer step (reset right before it)" in table
    assert "allocated just before the optimizer step" in table


def test_the_2025_edition_trains_its_own_xl_and_says_so():
    """`xl` under --edition 2025 is 2025's XL (1600/6400/48/25: 435 gradient tensors), not
    2026's; the setup names the edition and the shape; a small preset model names the one the
    handout asks for."""
    import pandas as pd

    from cs336_systems.core.costs import param_count
    from cs336_systems.stages.ddp import answers
    from cs336_systems.stages.ddp import measure as stage

    args = stage.parse_args(
        ["variants", "--machine", "m", "--preset", "gpu", "--edition", "2025", "--out", "x.csv",
         *block("ddp", "gpu", edition=2025)]
    )  # fmt: skip
    cols = stage._job_columns(args)
    assert (cols["size"], cols["d_model"], cols["d_ff"], cols["num_layers"]) == (
        "xl",
        1600,
        6400,
        48,
    )
    assert cols["num_heads"] == 25 and cols["params"] == param_count(10_000, 1600, 48, 6400)
    assert "--edition=2025" in stage.worker_argv(args, ["variants"])
    row = pd.Series({**cols, "edition": 2025, "preset": "gpu", "backend": "nccl"})
    assert answers.edition_model(row) == (
        "the 2025 edition's `xl` (d_model 1600, d_ff 6400, 48 layers, 25 heads; 1,998 M parameters)"
    )
    assert answers.handout_model(row) == ""
    tiny = pd.Series({**row.to_dict(), "size": "tiny", "preset": "cpu"})
    assert answers.handout_model(tiny) == (
        "`tiny` is the cpu preset's model, not the one the 2025 handout asks for, its `xl` "
        "(d_model 1600, d_ff 6400, 48 layers, 25 heads), which the gpu and full presets run: "
        "no number below is that model's."
    )


def test_the_ddp_figures_labels_do_not_collide(tmp_path, monkeypatch):
    import shutil

    from figure_checks import drawn_figures

    from cs336_systems.stages.ddp import figures

    for name in ("ddp.csv", "allreduce.csv"):
        shutil.copy(H200 / name, tmp_path / name)
    with drawn_figures(monkeypatch, figures) as caught:
        figures.draw(tmp_path, tmp_path / "figures")
    assert [p.name for p, _ in caught] == ["ddp_variants.png", "ddp_buckets.png", "ddp_memory.png"]
    assert all(hits == [] for _, hits in caught), caught
