"""What the workflow needs to plan the benchmark stage's jobs, from the stage's config block.

Pure functions of the validated preset block (no torch): the rules file calls them.
"""

from __future__ import annotations

import itertools

from cs336_systems.core.config import Checker, Facts

# the sweep axes a filter (`compile_only`, `attention_only`) may narrow
FILTERED = {
    "compile_only": ("sizes", "context_lengths", "attentions", "modes", "precisions"),
    "attention_only": ("sizes", "context_lengths"),
}


def points(cfg: dict) -> list[dict]:
    """One dict per job (size, context_length, attention); attentions other than the first run
    only where `attention_only` (if given) admits the size and context."""
    only = cfg.get("attention_only", {})
    sizes = set(only.get("sizes", cfg["sizes"]))
    contexts = set(only.get("context_lengths", cfg["context_lengths"]))
    first = cfg["attentions"][0]
    return [
        {"size": s, "context_length": c, "attention": a}
        for s, c, a in itertools.product(cfg["sizes"], cfg["context_lengths"], cfg["attentions"])
        if a == first or (s in sizes and c in contexts)
    ]


def compile_arg(cfg: dict, size: str, context_length: int, attention: str | None = None) -> str:
    """The job's `--compile` list: eager everywhere, compiled where `compile_only` admits its
    size, context length and attention (each torch.compile of a model costs about a minute)."""
    only = cfg.get("compile_only", {})
    admitted = (
        size in only.get("sizes", [size])
        and context_length in only.get("context_lengths", [context_length])
        and (attention is None or attention in only.get("attentions", [attention]))
    )
    return ",".join(c for c in cfg["compile"] if c == "eager" or admitted)


def compile_filter(cfg: dict, key: str) -> str:
    """Within a job, the modes (or precisions) that get compiled points."""
    return ",".join(str(v) for v in cfg.get("compile_only", {}).get(key, cfg[key]))


def shared_args(cfg: dict) -> str:
    """The options every point's job takes alike, as one string (the rule formats it once)."""
    return " ".join(
        [
            f"--modes {','.join(cfg['modes'])}",
            f"--precisions {','.join(cfg['precisions'])}",
            f"--compile-modes {compile_filter(cfg, 'modes')}",
            f"--compile-precisions {compile_filter(cfg, 'precisions')}",
            f"--compile-mode {cfg.get('compile_mode', 'default')}",
            f"--batch-size {cfg['batch_size']}",
            f"--warmup {cfg['warmup_steps']}",
            f"--steps {cfg['measure_steps']}",
            *([f"--max-point-s {cfg['max_point_s']}"] if "max_point_s" in cfg else []),
        ]
    )


def engines_arg(cfg: dict, attention: str) -> str:
    """The engines a job runs beside the plain grid: in the first attention's job only (the
    engine picks its own attention), `plain` elsewhere."""
    engines = cfg.get("engines", ["plain"])
    return ",".join(engines) if attention == cfg["attentions"][0] else "plain"


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """What the schema cannot say: size names of this run's model table, and filters that name
    only values of the sweep."""
    at.sizes("sizes", cfg["sizes"], facts)
    at.sizes(("warmup_sweep", "sizes"), cfg.get("warmup_sweep", {}).get("sizes", []), facts)
    # a filter that selects nothing here is inert (no compiled points, one attention): the
    # defaults' filters survive a user's override of the sweep (mappings merge key by key)
    active = {
        "compile_only": "compiled" in cfg["compile"],
        "attention_only": len(cfg["attentions"]) > 1,
    }
    for name, axes in FILTERED.items():
        for axis in axes:
            if active[name] and axis in cfg.get(name, {}):
                at.within((name, axis), cfg[name][axis], cfg[axis], axis)
