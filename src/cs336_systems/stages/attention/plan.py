"""What the workflow needs to plan the attention stage's jobs, from the stage's config block."""

from __future__ import annotations


def point_files(cfg: dict, results: str) -> list[str]:
    """One CSV per implementation."""
    return [f"{results}/attention/points/{impl}.csv" for impl in cfg["impls"]]
