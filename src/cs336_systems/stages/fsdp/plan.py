"""What the workflow needs to check the fsdp stage's config block (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("size", cfg["size"], facts)
    at.env("env", cfg["env"])
