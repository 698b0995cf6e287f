"""What the workflow needs to check the memory stage's config block (no torch)."""

from __future__ import annotations

import re

from cs336_systems.core.config import Checker, Facts
from cs336_systems.core.edition import size_table


def layer_counts(edition: int) -> dict[str, int]:
    """Layers per size name of the edition's table (read from model.py's source, no torch)."""
    return {name: spec["num_layers"] for name, spec in size_table(edition).items()}


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("sizes", cfg["sizes"], facts)
    ck = cfg.get("checkpoint")
    if ck:
        at.within(
            ("checkpoint", "contexts"), ck["contexts"], cfg["context_lengths"], "context_lengths"
        )
        at.within(("checkpoint", "modes"), ck["modes"], cfg["modes"], "modes")
        m = re.match(r"^every_(\d+)$", ck["strategy"])
        layers = layer_counts(facts.edition)
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
