"""Run a worker on ranks (forked for gloo, spawned for CUDA) and collect what each rank saved."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.multiprocessing as mp


def run_forked_ranks(worker, world: int, start_method: str = "fork") -> list[dict]:
    """Start `worker(rank, store_path, out_dir)` on `world` forked processes (they inherit the
    imported torch; spawn would import it again in each) and load each rank's `rank<r>.pt`.
    CUDA workers need `start_method="spawn"` (a forked child cannot use its parent's CUDA).
    A parent that has used CUDA (an earlier GPU test in the same pytest process, as in the
    kernel_tests stage's run) spawns too: autograd's device threads do not survive a fork."""
    if start_method == "fork" and torch.cuda.is_initialized():
        start_method = "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            worker,
            args=(os.path.join(tmp, "store"), tmp),
            nprocs=world,
            join=True,
            start_method=start_method,
        )
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
