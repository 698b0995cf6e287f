"""What the workflow needs to check the allreduce stage's config block (no torch)."""

from __future__ import annotations

import math

from cs336_systems.core.config import Checker, Facts, check_launcher

# every rank holds the reference, its contribution and the buffer it all-reduces
BUFFERS_PER_RANK = 3


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.at_most("min_repeats", cfg["min_repeats"], "repeats", cfg["repeats"])
    at.env("env", cfg["env"])
    check_launcher(at, cfg["launcher"])
    # message sizes that cannot fit on this machine even at the smallest world size
    ranks = math.ceil(min(cfg["world_sizes"]) / cfg["launcher"]["nnodes"])
    memory = {
        "gloo": (facts.host_memory_mib, BUFFERS_PER_RANK * ranks, "this host"),
        "nccl": (facts.gpu_memory_mib, BUFFERS_PER_RANK, "one GPU"),
    }
    for backend in cfg["backends"]:
        have, copies, where = memory[backend]
        for i, mb in enumerate(cfg["sizes_mb"][backend]):
            at.fits(("sizes_mb", backend, i), mb, copies * mb, have, where)
