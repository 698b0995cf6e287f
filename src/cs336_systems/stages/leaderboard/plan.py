"""The leaderboard stage's knobs (`LeaderboardKnobs`, one per preset block of
config/stages/leaderboard.yaml), what the workflow checks in a block beyond its schema, and the
time budget's estimate of its reduced configuration (`reduced_seconds`; no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from cs336_systems.core.config import Checker, Facts
from cs336_systems.core.knobs import Env, Knobs, knob
from cs336_systems.stages.leaderboard.ablation import ABLATIONS

# an ablation row: the engine with one optimization off (ablation.py's ABLATIONS, in its order)
Ablation = Literal[tuple(ABLATIONS)]


@dataclass(frozen=True)
class LeaderboardKnobs(Knobs):
    """The 2026 full-step leaderboard through the engine and the plain model, its ablation, and
    a reduced one-GPU configuration when the world size is not there."""

    backend: Literal["gloo", "nccl"] = knob("gloo on CPU processes, nccl on GPUs")
    world_size: int = knob("ranks of the full configuration", minimum=1)
    vocab: int = knob("vocabulary size", minimum=2)
    d_model: int = knob("model width", minimum=8)
    d_ff: int = knob("feed-forward width", minimum=1)
    num_layers: int = knob("layers of the full configuration", minimum=1)
    num_heads: int = knob("attention heads", minimum=1)
    context_length: int = knob("tokens per sequence", minimum=1)
    batch: int = knob("sequences per step, over all ranks", minimum=1)
    variants: list[Literal["engine", "plain"]] = knob(
        "engine (engine/step.py) and the plain model", minItems=1, uniqueItems=True
    )
    ablations: list[Ablation] = knob(
        "the ablation job's rows: the engine with one optimization off each", uniqueItems=True
    )
    reduced_layers: int = knob(
        "layers of the reduced one-GPU configuration",
        minimum=0,
        allowed="the reduced one-GPU configuration's layers at most; 0 for the most that fit",
    )
    warmup_steps: int = knob("steps run before the measured ones", minimum=1)
    measure_steps: int = knob("steps measured", minimum=1)
    checkpoint: str = knob(
        "the engine's activation checkpointing",
        pattern="^(auto|none|sqrt|halving|chain|ffn|every_[1-9][0-9]*|mixed_p[0-9]+_f[0-9]+)$",
        allowed="auto (by memory), none, sqrt, halving, chain, ffn, every_<k> or mixed_p<P>_f<F>",
    )
    compile: bool = knob("compile the engine's blocks")
    profile: bool = knob("profile one step per row of the runs job (the breakdown)")
    env: Env = knob("variables set for every rank")
    timeout_s: float = knob("seconds a launch may take", exclusiveMinimum=0)


# the stage's knobs: its config blocks are checked against their schema (core/config.py)
KNOBS = LeaderboardKnobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    d, h = cfg["d_model"], cfg["num_heads"]
    if d % h:
        at.fail("num_heads", h, f"a divisor of d_model ({d})")
    elif (d // h) % 8:
        at.fail("num_heads", h, f"a head dimension d_model / num_heads of a multiple of 8 ({d})")
    if cfg["batch"] % cfg["world_size"]:
        at.fail("batch", cfg["batch"], f"a multiple of world_size ({cfg['world_size']})")
    at.env("env", cfg["env"])


# the leaderboard's reduced one-GPU configuration (the 8B's widths and context, the most layers
# that fit, compiled, a few steps): 2-4 min on an H100 (the lead's estimate), its middle
LEADERBOARD_REDUCED_S = 180.0
# with `reduced_layers` set: the engine's blocks compile once (35 s for the 2026 xl's, measured
# on an H100) and each step costs its FLOPs at the reached bf16 rate (warm-up, measured, the
# first and the profiled one); the reference run's leaderboard job: 54 s in all
LEADERBOARD_COMPILE_S = 24.0


def reduced_seconds(cfg: Mapping, bf16_flops_per_s: float) -> float:
    """The time budget's estimate (budget/) of the reduced configuration's run on one GPU that
    reaches `bf16_flops_per_s` in a model step, in seconds after its job starts."""
    layers = cfg.get("reduced_layers", 0)
    if not layers:
        return LEADERBOARD_REDUCED_S
    from cs336_systems.core.costs import train_step_flops  # numpy, pandas: only when asked

    flops = train_step_flops(cfg["vocab"], cfg["d_model"], layers, cfg["d_ff"],
                             cfg["batch"], cfg["context_length"])  # fmt: skip
    step_s = flops / bf16_flops_per_s
    steps = cfg["warmup_steps"] + cfg["measure_steps"] + 2  # + the profiled step and the first
    return LEADERBOARD_COMPILE_S + steps * step_s
