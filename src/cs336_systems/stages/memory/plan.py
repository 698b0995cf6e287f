"""What the workflow needs to check the memory stage's config block (no torch)."""

from __future__ import annotations

import re
from pathlib import Path

from cs336_systems.core.config import Checker, Facts
from cs336_systems.core.imports import module_literal

SRC = Path(__file__).resolve().parents[3]


def layer_counts() -> dict[str, int]:
    """Layers per size name of model.py's tables (read from its source, no torch)."""
    table = {
        **module_literal(SRC, "cs336_systems.model", "MODEL_SIZES"),
        **module_literal(SRC, "cs336_systems.model", "EXTRA_SIZES"),
    }
    return {name: spec["num_layers"] for name, spec in table.items()}


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("sizes", cfg["sizes"], facts)
    ck = cfg.get("checkpoint")
    if ck:
        at.within(
            ("checkpoint", "contexts"), ck["contexts"], cfg["context_lengths"], "context_lengths"
        )
        at.within(("checkpoint", "modes"), ck["modes"], cfg["modes"], "modes")
        m = re.match(r"^every_(\d+)$", ck["strategy"])
        layers = layer_counts()
        for size in cfg["sizes"]:
            n = layers.get(size)
            if m and n and n % int(m.group(1)):
                divisors = ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)
                at.fail(
                    ("checkpoint", "strategy"),
                    ck["strategy"],
                    f"best, or every_<k> with k a divisor of the {n} layers of {size}: {divisors}",
                )
    for i, c in enumerate(cfg.get("nsys_contexts", [])):
        if c not in cfg["context_lengths"]:
            at.fail(
                ("nsys_contexts", i), c, f"a value of context_lengths ({cfg['context_lengths']})"
            )
