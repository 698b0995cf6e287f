"""The course's editions (spring 2025, spring 2026): their names, each one's model size names,
and the per-edition overrides of a preset block. Standard library only: the workflow reads it
while planning (planning/config.py) and every stage's CLI takes `--edition` through it.

model.py holds the size tables themselves (SIZE_TABLES); tests/unit/planning/test_config.py keeps the names
here equal to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

from cs336_systems.planning.imports import module_literal

SRC = Path(__file__).resolve().parents[2]

# the course's editions (model.py: EDITIONS, DEFAULT_EDITION)
EDITIONS = (2026, 2025)
DEFAULT_EDITION = 2026
# model size names per edition (model.py: SIZE_TABLES and EXTRA_SIZES; tests/unit/planning/test_config.py
# keeps them equal)
MODEL_SIZE_NAMES = {
    2026: ("tiny", "small", "medium", "large", "xl", "10B"),
    2025: ("tiny", "small", "medium", "large", "xl", "2.7B"),
}
# a preset block's per-edition overrides (see the module docstring)
EDITION_OVERRIDES = "editions"
# stages whose questions one edition's handout asks and the other's does not (a stage not named
# here answers both): `stages: all` runs an edition's own; a listed one still runs, with a note
STAGE_EDITIONS = {"checkpointing": (2026,), "fsdp": (2026,), "leaderboard": (2026,)}


def edition_stages(stages: Iterable[str], edition: int) -> list[str]:
    """The stages of `stages` whose questions `edition`'s handout asks (STAGE_EDITIONS)."""
    return [s for s in stages if int(edition) in STAGE_EDITIONS.get(s, EDITIONS)]


@cache
def size_table(edition: int = DEFAULT_EDITION) -> dict[str, dict[str, int]]:
    """model.py's SIZE_TABLES[edition] and EXTRA_SIZES (name -> d_model, d_ff, num_layers,
    num_heads), read from its source: planning needs them without importing torch."""
    return {
        **module_literal(SRC, "cs336_systems.model", "SIZE_TABLES")[int(edition)],
        **module_literal(SRC, "cs336_systems.model", "EXTRA_SIZES"),
    }


@cache
def vocab_size() -> int:
    """model.py's VOCAB_SIZE, read from its source (the report needs it without torch)."""
    return module_literal(SRC, "cs336_systems.model", "VOCAB_SIZE")


def add_edition_argument(parser) -> None:
    """`--edition` of a stage's CLI (the workflow passes the run's; default the current one)."""
    parser.add_argument(
        "--edition",
        type=int,
        choices=EDITIONS,
        default=DEFAULT_EDITION,
        help="the course's edition: its model table (size names) and grids",
    )


def edition_overrides(config: dict, stage_names: Iterable[str], edition: int) -> list[tuple]:
    """Replace, in place, each preset block's keys by its `editions` entry for `edition` (and
    drop the `editions` key); the problems of a malformed `editions` mapping, as (key path,
    value, what is allowed) for planning/config.py's Problem."""
    problems = []
    allowed = f"a mapping of an edition ({', '.join(map(str, EDITIONS))}) to the keys that edition changes"
    for stage in stage_names:
        block = config.get(stage)
        if not isinstance(block, dict):
            continue
        for name, cfg in block.items():
            if not isinstance(cfg, dict) or EDITION_OVERRIDES not in cfg:
                continue
            overrides = cfg.pop(EDITION_OVERRIDES)
            path = (stage, name, EDITION_OVERRIDES)
            if not isinstance(overrides, dict):
                problems.append((path, overrides, allowed))
                continue
            for key, keys in overrides.items():
                if str(key) not in {str(e) for e in EDITIONS}:
                    problems.append((path + (key,), keys, allowed))
                elif not isinstance(keys, dict):
                    problems.append((path + (key,), keys, "a mapping of keys to values"))
            chosen = {str(k): v for k, v in overrides.items()}.get(str(edition))
            if isinstance(chosen, dict):
                cfg.update(chosen)
    return problems
