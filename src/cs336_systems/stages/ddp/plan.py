"""What the workflow needs to check the ddp stage's config block (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts, check_launcher


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("size", cfg["size"], facts)
    at.env("env", cfg["env"])
    check_launcher(at, cfg["launcher"])
    nnodes = cfg["launcher"]["nnodes"]
    if cfg["world_size"] % nnodes:
        at.fail(
            "world_size",
            cfg["world_size"],
            f"a multiple of launcher.nnodes ({nnodes}): as many ranks on every node",
        )
