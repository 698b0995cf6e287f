"""What the workflow needs to check the memory stage's config block (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("sizes", cfg["sizes"], facts)
