"""What the workflow needs to check the leaderboard stage's config block (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    d, h = cfg["d_model"], cfg["num_heads"]
    if d % h:
        at.fail("num_heads", h, f"a divisor of d_model ({d})")
    elif (d // h) % 8:
        at.fail("num_heads", h, f"a head dimension d_model / num_heads of a multiple of 8 ({d})")
    if cfg["batch"] % cfg["world_size"]:
        at.fail("batch", cfg["batch"], f"a multiple of world_size ({cfg['world_size']})")
    at.env("env", cfg["env"])
