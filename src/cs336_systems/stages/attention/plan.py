"""What the workflow needs to plan the attention stage's jobs, from the stage's config block."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts, head_dim_problem

# naive attention takes any d; the study compares it with the flash stage's kernels, whose
# head dims are multiples of 8 (SDPA's backends), so those are the ones worth measuring
MAX_HEAD_DIM = 256


def point_files(cfg: dict, results: str) -> list[str]:
    """One CSV per implementation."""
    return [f"{results}/attention/points/{impl}.csv" for impl in cfg["impls"]]


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    for i, d in enumerate(cfg["head_dims"]):
        if why := head_dim_problem(d, MAX_HEAD_DIM):
            at.fail(("head_dims", i), d, why)
