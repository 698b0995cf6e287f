"""The checkpointing stage's knobs (`CheckpointingKnobs`, one per preset block of
config/stages/checkpointing.yaml) and what the workflow needs to plan (and check) from a block.

Pure functions of the preset block (no torch): the model's size table is read from model.py's
source (``planning.edition.size_table``), so a block size that does not divide the layer count
is refused while planning, before any job, in the run's one-line form (planning/config.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.edition import DEFAULT_EDITION, size_table
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

NESTED = ("sqrt", "halving", "chain")

Size = Literal["tiny", "small", "medium", "large", "xl", "2.7B"]


@dataclass(frozen=True)
class Accounting(Knobs):
    """The saved-tensor accounting job: one RMSNorm and one TransformerBlock of a size."""

    size: Size = knob("a model size name: its dimensions")
    batch_size: int = knob("sequences of the input", minimum=1)
    context_length: int = knob("tokens per sequence", minimum=1)
    device: Literal["auto", "cpu", "cuda", "meta"] = knob(
        "auto: CUDA when present, else CPU; meta: shapes only, nothing allocated"
    )
    compile_backend: Literal["inductor", "partition"] = knob(
        "the compiled run's backend (partition: inductor's partitioner, no code generation)"
    )


@dataclass(frozen=True)
class CheckpointingKnobs(Knobs):
    """The tensors autograd saves (saved-tensor accounting) and the peak memory and step time of a
    training step under each checkpointing strategy."""

    accounting: Accounting = knob("the saved-tensor accounting job")
    size: str = knob(
        "the strategies' model size: a course size, or the own model's name (docs/own-model.md)"
    )
    batch_size: int = knob("sequences per step", minimum=1)
    context_length: int = knob("tokens per sequence", minimum=1)
    precisions: list[Literal["fp32", "bf16"]] = knob(
        "one strategies job per precision (bf16: autocast)", minItems=1, uniqueItems=True
    )
    block_sizes: list[int] = knob(
        "one level of checkpointing every k blocks; each k must divide the layer count",
        uniqueItems=True,
        items={"minimum": 1},
    )
    nested: list[Literal["sqrt", "halving", "chain"]] = knob(
        "the nested strategies run", uniqueItems=True
    )
    sub_block: list[Literal["attn", "ffn", "halves"]] = knob(
        "checkpointing inside every block, beside whole blocks: its attention half (attn), its "
        "FFN half (ffn), or both halves each under its own checkpoint call (halves)",
        uniqueItems=True,
    )
    warmup_steps: int = knob("steps run before the measured ones", minimum=1)
    measure_steps: int = knob("steps timed per strategy", minimum=1)
    skip_factor: float = knob(
        "a point predicted to need more than this many times the GPU's memory is skipped",
        exclusiveMinimum=0,
    )
    num_layers: int | None = knob(
        "override the size's layer count (the CPU preset's tiny model)", default=None, minimum=1
    )
    vocab_size: int | None = knob(
        "override the study's vocabulary (a small one: the blocks hold the memory)",
        default=None,
        minimum=2,
    )


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = CheckpointingKnobs
# what the accounting job reads: a change to the strategies' knobs leaves it as it was
ACCOUNTING_KNOBS = CheckpointingKnobs.part("accounting")


def num_layers(cfg: dict, edition: int = DEFAULT_EDITION) -> int | None:
    """The layer count the strategies run over: `num_layers` if set, else the size's own."""
    if "num_layers" in cfg:
        return cfg["num_layers"]
    spec = size_table(edition).get(cfg["size"])
    return spec["num_layers"] if spec else None


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def strategies(k: CheckpointingKnobs) -> list[str]:
    """Every strategy the block runs, in the report's order: none, every_<k>, the nested ones,
    the sub-block ones."""
    return ["none", *(f"every_{b}" for b in k.block_sizes), *k.nested, *k.sub_block]


# what a sub-block strategy keeps of the blocks' saved activations, by the eager count of
# core/costs.py at xl (fp32, batch 4, 2048; stages/checkpointing/sub_block.py): the attention
# half (with its scores) 61%, the FFN half 35%, the two halves' inputs 4%; backward adds one
# block's half at a time on top
SUB_BLOCK_KEEPS = {"attn": 0.39, "ffn": 0.65, "halves": 0.04}


def problems(
    cfg: dict, edition: int = DEFAULT_EDITION, own: tuple[str, ...] = ()
) -> list[tuple[tuple, object, str]]:
    """(key path inside the preset block, value, what is allowed) for each problem the schema
    cannot see: sizes of the model table (`size` may name an own model, `own`: its blocks are
    counted by the job), block sizes that divide the layer count, a compiled accounting on the
    meta device through the real compiler."""
    out = []
    sizes = size_table(edition)
    for key, size in (("size",), cfg["size"]), (("accounting", "size"), cfg["accounting"]["size"]):
        if size not in sizes and not (key == ("size",) and size in own):
            out.append(
                (key, size, f"a model size of the {edition} edition: one of {', '.join(sizes)}")
            )
    n = num_layers(cfg, edition)
    if n is not None:
        allowed = ", ".join(map(str, divisors(n)))
        for i, k in enumerate(cfg["block_sizes"]):
            if n % k:
                out.append(
                    (
                        ("block_sizes", i),
                        k,
                        f"a divisor of the {n} layers of {cfg['size']}: {allowed}",
                    )
                )
    acc = cfg["accounting"]
    if acc["device"] == "meta" and acc["compile_backend"] == "inductor":
        out.append(
            (
                ("accounting", "compile_backend"),
                "inductor",
                "partition on the meta device (inductor generates code for real devices only)",
            )
        )
    return out


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {
    "checkpointing_accounting": lambda w: "accounting",
    "checkpointing": lambda w: w["precision"],
}


def _accounting_job(k: CheckpointingKnobs, cost: Costs) -> Job:
    """One RMSNorm and one block, eager and compiled (5 s where nothing compiles for real)."""
    acc = k.accounting
    compiled = acc.compile_backend == "inductor" and acc.device != "meta"
    seconds = cost.dev.fixed_s["accounting"] if compiled else 5.0
    return Job("checkpointing", "accounting", cost.dev.job_start_s + seconds,
               "one block, eager and compiled")  # fmt: skip


def _precision_job(k: CheckpointingKnobs, cost: Costs, prec: str) -> Job:
    """No checkpointing and every block size k (saving about k/N of the activations), the
    sub-block strategies (SUB_BLOCK_KEEPS): those whose state and activations fit the device
    run their steps, those that fit only skip_factor x its memory one step (their out-of-memory
    attempt), the others none; the nested strategies likewise by what they hold at a time.
    A checkpointed step recomputes: 4/3 of one."""
    size, ctx, batch = k.size, k.context_length, k.batch_size
    full = cost.layers(size)
    layers = k.num_layers if k.num_layers is not None else full
    scale = layers / full
    steps = k.warmup_steps + k.measure_steps
    state, acts = cost.state_and_activations_gib(size, ctx, batch, prec)
    state, acts = scale * state, scale * acts

    def steps_at(gib: float) -> int:
        return steps if cost.fits(gib) else (1 if cost.fits(gib, k.skip_factor) else 0)

    sizes = [layers] + [b for b in k.block_sizes if b < layers]
    taken = [steps_at(state + acts * min(b, layers) / layers) for b in sizes]
    # nested: sqrt holds about one segment of ceil(N / round(sqrt N)) blocks at a time, the
    # others about one block (and the inputs of its levels)
    segment = math.ceil(layers / max(1, round(math.sqrt(layers))))
    taken += [steps_at(state + acts * (segment if s == "sqrt" else 2) / layers) for s in k.nested]
    taken += [steps_at(state + acts * (SUB_BLOCK_KEEPS[s] + 1 / layers)) for s in k.sub_block]
    t = sum(taken) * 4 / 3 * scale * cost.step_s(size, ctx, batch, "train_step", prec)
    build = cost.build_s(size) * scale  # once per precision
    runs, tried = sum(n == steps for n in taken), sum(0 < n < steps for n in taken)
    how = f"{runs} of {len(taken)} strategies run, {steps} steps each" + (
        f"; {tried} out of memory after a step" if tried else ""
    )
    return Job("checkpointing", prec, cost.dev.job_start_s + build + t, how)


def estimate(k: CheckpointingKnobs, cost: Costs) -> list[Job]:
    """The accounting job, then one job per precision."""
    return [_accounting_job(k, cost), *(_precision_job(k, cost, p) for p in k.precisions)]


def check(cfg: dict, at, facts=None) -> None:
    """The stage's checks for planning/config.py's check_run (`at` collects problems under the
    block's path)."""
    edition = facts.edition if facts is not None else DEFAULT_EDITION
    own = tuple(facts.sizes) if facts is not None else ()
    for path, value, allowed in problems(cfg, edition, own):
        at.fail(path, value, allowed)
