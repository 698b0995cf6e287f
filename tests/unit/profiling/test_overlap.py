"""The share of communication kernel time that ran while compute ran, on real NCCL: a blocking
all-reduce issued after the compute it waits for overlaps nothing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _blocking_allreduce_worker(rank: int, store: str, out_dir: str) -> None:
    """Naive DDP as the ddp stage profiles it: backward, one blocking all-reduce per gradient,
    AdamW; rank 0 also writes the Chrome trace."""
    from torch import nn

    from cs336_systems.parallel.ddp import wrap
    from cs336_systems.profiling.overlap import collective_overlap, profile_step

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
    device = torch.device("cuda", rank)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).to(device)
    ddp = wrap(model, "naive")
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    x = torch.randn(4096, 2048, device=device)

    def step(clock) -> None:
        opt.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()
        ddp.finish_gradient_synchronization()  # blocking, after backward
        opt.step()

    for _ in range(2):
        step(None)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile, record_function

    trace = os.path.join(out_dir, "trace.json") if rank == 0 else None
    out = profile_step(step, device, trace and Path(trace))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("profiled_step"):
            step(None)
        torch.cuda.synchronize()
    out.update(collective_overlap(prof, device))
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.gpu
def test_a_blocking_allreduce_after_compute_overlaps_nothing():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _blocking_allreduce_worker,
            args=(os.path.join(tmp, "store"), tmp),
            nprocs=2,
            join=True,
            start_method="spawn",
        )
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    for r in ranks:
        assert r["prof_comm_kernel_ms"] > 0  # the all-reduces ran as NCCL kernels
        # the step's record_function range is a device event spanning every kernel: counted as
        # compute it made these 100% overlapped
        assert r["prof_overlap_share"] < 0.2, r
        assert r["prof_comm_overlap_share"] < 0.2, r


def test_waited_for_counts_only_compute_held_back_by_a_gather():
    """A compute kernel that starts as a gather ends, after idle time, waited for it; idle time
    before a kernel that starts later (the host issued it late), or a gather that ends while
    compute runs, is no wait. Spans in microseconds."""
    from cs336_systems.profiling.overlap import RELEASE_US, waited_for

    compute = [(0.0, 100.0), (400.0, 500.0)]
    # released: idle from 100 (the last compute's end) to the gather's end at 398
    assert waited_for([(50.0, 398.0)], compute) == pytest.approx(298.0)
    # the gather started after compute went idle: only its own span counts
    assert waited_for([(200.0, 398.0)], compute) == pytest.approx(198.0)
    # compute starts long after the gather's end: the host was late, not the gather
    assert waited_for([(200.0, 400.0 - RELEASE_US - 1)], compute) == 0.0
    # the gather ends while compute runs: nothing waited
    assert waited_for([(50.0, 450.0)], compute) == 0.0
    assert waited_for([(20.0, 80.0)], compute) == 0.0
    # two gathers, the second one releasing the compute; nothing before any compute
    assert waited_for([(100.0, 250.0), (250.0, 399.0)], compute) == pytest.approx(149.0)
    assert waited_for([(-50.0, -1.0)], compute) == pytest.approx(49.0)
    assert waited_for([(0.0, 50.0)], []) == 0.0


def _late_rank_worker(rank: int, store: str, out_dir: str) -> None:
    """Rank 1 reaches the profiled step 1 s after rank 0; the step is one all-gather."""
    import time

    from cs336_systems.profiling.overlap import profile_step

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    device = torch.device("cpu")
    x = torch.ones(1024)
    out = [torch.empty(1024) for _ in range(2)]

    def step(clock) -> None:
        dist.all_gather(out, x)

    with torch.profiler.profile():  # the profiler's first start costs each rank its own time
        pass
    step(None)
    if rank == 1:
        time.sleep(1.0)
    stats = profile_step(step, device, None, per_collective=True)
    torch.save(stats, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_the_profiled_step_starts_with_the_ranks_together():
    """A rank that reaches the profiled step late does not stretch the other's collectives:
    the ranks meet at a barrier before the step's range, which is left out of the counts."""
    from dist_utils import run_forked_ranks

    ranks = run_forked_ranks(_late_rank_worker, 2)
    for r in ranks:
        assert 0 < r["prof_all_gather_ms"] < 300, r  # ~1,000 ms without the barrier on rank 0
        assert r["prof_step_ms"] < 400, r


def _traced_worker(rank: int, store: str, out_dir: str, trace_dir: str) -> None:
    """One profiled gloo step (a matmul, its result all-reduced) whose trace every rank keeps
    where `rank_trace` puts it, and rank 0 its timeline too. One thread and no autograd: a
    forked child inherits neither the parent's intra-op pool nor its autograd threads."""
    from cs336_systems.profiling.overlap import profile_step, rank_trace

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    w, x = torch.randn(64, 64), torch.randn(32, 64)

    def step(clock) -> None:
        dist.all_reduce(x @ w)

    trace = rank_trace(trace_dir, "step", rank)
    timeline = Path(trace_dir) / "step_rank0.timeline.json.gz" if rank == 0 else None
    stats = profile_step(step, torch.device("cpu"), trace, timeline_path=timeline)
    torch.save(stats, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_every_rank_keeps_its_gzipped_trace_in_one_folder(tmp_path):
    """Two gloo ranks profile one step: both traces lie in the step's folder, gzipped, each
    naming its rank (what HolisticTraceAnalysis needs to tell them apart); rank 0's still
    gives the timeline figure its window."""
    import functools
    import gzip
    import json

    from dist_utils import run_forked_ranks

    from cs336_systems.profiling.nsys_timeline import load, read_chrome_trace

    run_forked_ranks(functools.partial(_traced_worker, trace_dir=str(tmp_path)), 2)
    files = sorted((tmp_path / "step").iterdir())
    assert [p.name for p in files] == ["rank0.json.gz", "rank1.json.gz"]
    docs = []
    for p in files:
        with gzip.open(p, "rt") as f:
            docs.append(json.load(f))
    assert [d["distributedInfo"]["rank"] for d in docs] == [0, 1]
    assert all(d["distributedInfo"]["backend"] == "gloo" for d in docs)
    for d in docs:  # each rank's own all-reduce on gloo's worker thread
        assert any(e.get("name", "").startswith("gloo:all_reduce") for e in d["traceEvents"])
    assert len(read_chrome_trace(files[0]).ranges)  # the timeline figures' reader takes it
    assert load(tmp_path / "step_rank0.timeline.json.gz").window is not None


class _CountingProfiler:
    """A finished torch.profiler run whose exports are counted."""

    def __init__(self, prof):
        self.prof, self.exports = prof, 0

    def export_chrome_trace(self, path: str) -> None:
        self.exports += 1
        self.prof.export_chrome_trace(path)


def _profiled_cpu_step() -> _CountingProfiler:
    from torch.profiler import ProfilerActivity, profile, record_function

    from cs336_systems.profiling.overlap import STEP_RANGE

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x @ x  # before the step: outside its window
        with record_function(STEP_RANGE):
            (x @ x).relu()
    return _CountingProfiler(prof)


def test_one_export_gives_the_gzipped_trace_and_the_steps_window(tmp_path):
    """keep_trace exports once: the window is read from the plain JSON, then the trace is
    gzipped at the fast level (the gzip header's XFL byte is 4 for the fastest level)."""
    import gzip
    import json

    from cs336_systems.profiling.nsys_timeline import load
    from cs336_systems.profiling.overlap import TRACE_GZIP_LEVEL, keep_trace

    prof = _profiled_cpu_step()
    trace, timeline = tmp_path / "s" / "rank0.json.gz", tmp_path / "t" / "w.timeline.json.gz"
    keep_trace(prof, trace, timeline)
    assert prof.exports == 1
    assert TRACE_GZIP_LEVEL == 1 and trace.read_bytes()[8] == 4
    with gzip.open(trace, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"profiled_step", "aten::matmul"} <= names
    tl = load(timeline)
    assert tl.window is not None and "aten::relu" in set(tl.compute["name"])
    # (torch.profiler exports a run once) a plain path is written as JSON; a trace alone (the
    # profile stage's) or a timeline alone
    keep_trace(_profiled_cpu_step(), tmp_path / "only.json", None)
    keep_trace(_profiled_cpu_step(), None, tmp_path / "only.timeline.json.gz")
    assert json.loads((tmp_path / "only.json").read_text())["traceEvents"]
    assert (tmp_path / "only.timeline.json.gz").exists()
