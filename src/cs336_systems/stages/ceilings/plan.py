"""What the workflow needs to check the ceilings stage's config block (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts, device_memory

BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """Sizes that fit the device's memory, where knowable: the copy's source and destination,
    the matmul's two operands and its product."""
    have, where = device_memory(facts)
    at.fits("copy_mb", cfg["copy_mb"], 2 * cfg["copy_mb"], have, where)
    n, widest = cfg["matmul_size"], max(BYTES[d] for d in cfg["dtypes"])
    at.fits("matmul_size", n, 3 * n * n * widest / 2**20, have, where)
