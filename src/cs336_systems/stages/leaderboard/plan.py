"""The leaderboard stage's knobs (`LeaderboardKnobs`, one per preset block of
config/stages/leaderboard.yaml), its ablation rows (`ABLATIONS`: the engine with one
optimization off, each row at the engine row's checkpointing), what the workflow checks in a
block beyond its schema, and the time budget's estimate of its reduced configuration
(`reduced_seconds`). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Env, Knobs, knob

# the engine with one optimization turned off: the EngineOptions each row changes
ABLATIONS: dict[str, dict] = {
    "attention_ours": {"attention": "flash_triton"},  # our FlashAttention-2, not measured against
    "attention_cudnn": {"attention": "sdpa_cudnn"},  # SDPA's cuDNN, not measured against ours
    "sdpa": {"attention": "sdpa"},  # PyTorch's SDPA (its own backend choice)
    "plain_loss": {"loss": "plain"},  # full logits and F.cross_entropy instead of the fused loss
    "fsdp_per_layer": {"fsdp_units": "layer"},  # FSDP units of one Linear instead of a block
    "no_prefetch": {"prefetch": False},  # each gather when its unit runs
    "whole_blocks": {"selective": False},  # auto checkpointing of whole blocks only
    "every_1": {"checkpoint": "every_1"},  # every block checkpointed alone
    "every_2": {"checkpoint": "every_2"},  # pairs of blocks checkpointed
    "no_compile": {"compile": False},  # eager blocks
}


def pins_checkpointing(ablation: str, pinned: str) -> bool:
    """Whether an ablation row runs the engine row's checkpointing `pinned` (every row but those
    whose change is the checkpointing itself): a plan chosen afresh per row would move with the
    free memory and the measured block bytes, and the row's difference would mix two changes."""
    changes = ABLATIONS.get(ablation, {})
    return bool(pinned) and pinned != "auto" and not {"checkpoint", "selective"} & set(changes)


# an ablation row: the engine with one optimization off (ABLATIONS, in its order)
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


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = LeaderboardKnobs


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {
    # the runs job measures the full configuration, or on too few GPUs the reduced one
    "leaderboard": lambda w: ("runs", "reduced"),
    "leaderboard_ablation": lambda w: "ablation",
}


def _gloo_jobs(k: LeaderboardKnobs, cost: Costs) -> list[Job]:
    """The tiny configuration on one world of host processes (about 30 s)."""
    world_s = cost.dev.job_start_s + cost.dev.gloo_world_s
    jobs = [Job("leaderboard", "runs", world_s,
                f"{len(k.variants)} variants on {k.world_size} gloo processes")]  # fmt: skip
    if k.ablations:
        jobs.append(Job("leaderboard", "ablation", world_s,
                        f"{len(k.ablations)} ablation rows on {k.world_size} gloo processes"))  # fmt: skip
    return jobs


def _reduced_jobs(k: LeaderboardKnobs, cost: Costs) -> list[Job]:
    """NCCL on fewer GPUs than the world: the reduced configuration on one GPU, and the
    ablation's `skipped` rows."""
    seconds = reduced_seconds(k, cost.train_step_flops, cost.rate("bf16"))
    jobs = [Job("leaderboard", "reduced", cost.dev.job_start_s + seconds,
                f"{k.world_size} GPUs needed: the reduced configuration on one")]  # fmt: skip
    if k.ablations:
        jobs.append(Job("leaderboard", "ablation", cost.dev.job_start_s,
                        f"{k.world_size} GPUs needed: skipped rows"))  # fmt: skip
    return jobs


def estimate(k: LeaderboardKnobs, cost: Costs) -> list[Job]:
    """Each variant's compile and steps at the 8B's FLOPs over the world, and the ablation
    rows (the memory model skips the plain loss at once; each other row runs)."""
    if k.backend == "gloo":
        return _gloo_jobs(k, cost)
    if k.world_size > cost.dev.gpus:
        return _reduced_jobs(k, cost)
    flops = cost.train_step_flops(k.vocab, k.d_model, k.num_layers, k.d_ff, k.batch,
                                  k.context_length)  # fmt: skip
    steps = k.warmup_steps + k.measure_steps
    # the blocks are alike: one compile serves them all (LEADERBOARD_COMPILE_S); the 2x H200
    # run of 995b90f: runs 79 s, ablation 217 s (the 4x H200 reference: 86 and 225)
    compiled = LEADERBOARD_COMPILE_S if k.compile else 0.0
    per = compiled + steps * flops / (ENGINE_RATE * cost.rate("bf16") * k.world_size)
    jobs = [Job("leaderboard", "runs", cost.dev.job_start_s + len(k.variants) * per,
                f"{len(k.variants)} variants on {k.world_size} GPUs")]  # fmt: skip
    if k.ablations:
        run = [a for a in k.ablations if a != "plain_loss"]
        jobs.append(Job("leaderboard", "ablation", cost.dev.job_start_s + len(run) * per,
                        f"{len(k.ablations)} ablation rows on {k.world_size} GPUs"))  # fmt: skip
    return jobs


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
# the engine's step (fused kernels, its own checkpointing plan) reaches about twice the plain
# model's bf16 rate: the 2x H200 run of 995b90f measured 36 s a variant, 87 s estimated at 1x
ENGINE_RATE = 2.0


def reduced_seconds(k: LeaderboardKnobs, step_flops, bf16_flops_per_s: float) -> float:
    """The time budget's estimate of the reduced configuration's run on one GPU that reaches
    `bf16_flops_per_s` in a model step, in seconds after its job starts; `step_flops(vocab,
    d_model, num_layers, d_ff, batch, context_length)` counts a training step's FLOPs."""
    if not k.reduced_layers:
        return LEADERBOARD_REDUCED_S
    flops = step_flops(k.vocab, k.d_model, k.reduced_layers, k.d_ff, k.batch, k.context_length)
    step_s = flops / bf16_flops_per_s
    steps = k.warmup_steps + k.measure_steps + 2  # + the profiled step and the first
    return LEADERBOARD_COMPILE_S + steps * step_s
