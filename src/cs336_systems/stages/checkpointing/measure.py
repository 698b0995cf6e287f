"""Stage `checkpointing`: what autograd saves for backward, and what activation checkpointing buys.

    python -m cs336_systems.stages.checkpointing accounting --machine M --preset P \\
        --block JSON --out saved.csv
    python -m cs336_systems.stages.checkpointing strategies --precision fp32 --machine M \\
        --preset P --block JSON --out S.csv

`--block`: the stage's preset block as JSON (plan.py: `CheckpointingKnobs`, as the rule passes
it); the strategies run are none, every_<k> of `block_sizes`, the `nested` ones and the
`sub_block` ones (a block's attention half, FFN half, or both halves apart).

`accounting`: one RMSNorm and one TransformerBlock of the size's dimensions on (batch, context,
d_model), eager and torch.compile'd, under ``profiling.saved_tensors.SavedTensorLog``: one row per
saved tensor (shape, dtype, bytes, storage, parameter/buffer/input/activation, module, the op
that saved it), fp32 as in the handout. The meta device gives exact shapes without allocating;
the `partition` compile backend then stands in for inductor (its decompositions and min-cut
partitioner, no code generation).

`strategies`: a training step (forward, cross-entropy, backward, AdamW) of the model with its
blocks run under each strategy of ``core.checkpoint_plans``. Per strategy, after warm-up steps
(gradients kept allocated, so the memory before a step is parameters + gradients + optimizer
state): one step under ``LiveTensorBytes`` (peak bytes of tensors the step creates; on CUDA also
the allocator's peak above the memory before it), `measure_steps` timed steps, and one forward
under the saved-tensor log (what the forward leaves saved). Beside each:
``core.costs.checkpoint_memory``, the analytic peak of saved activations for the strategy's
plan (sub_block.py for the halves of a block). A point the model says cannot fit (more than `skip_factor` times the GPU's memory) is a
`skipped: needs X GiB, have Y GiB` row, decided before allocating; nearer the limit it runs and
an out-of-memory error is an `oom` row.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from cs336_systems.core import checkpoint_plans, costs, own_model
from cs336_systems.core.device import autocast, pick_device
from cs336_systems.core.harness import (
    Stopwatch,
    release_memory,
    run_point,
    summarize,
    synchronize,
    time_steps,
)
from cs336_systems.core.results import provenance, with_columns_first, write_csv
from cs336_systems.core.workload import model_columns
from cs336_systems.model import (
    VOCAB_SIZE,
    RMSNorm,
    RotaryEmbedding,
    TransformerBlock,
    TransformerLM,
    make_optimizer,
    size_spec,
)
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.profiling.saved_tensors import LiveTensorBytes, SavedTensorLog, compile_backend
from cs336_systems.stages.checkpointing import plan as stage_plan
from cs336_systems.stages.checkpointing.plan import ACCOUNTING_KNOBS, CheckpointingKnobs
from cs336_systems.stages.checkpointing.sub_block import step_shape, sub_block_memory

MiB = 2**20
GiB = 2**30
log = get_logger(__name__)
# the strategies job's device (CUDA when present) and the runs' seed: not knobs
STRATEGIES_DEVICE = "auto"
SEED = 0


def dims(size: str, num_layers: int | None = None, edition=None) -> dict[str, int]:
    spec = dict(size_spec(size, edition))
    if num_layers:
        spec["num_layers"] = num_layers
    return spec


# ---- accounting ------------------------------------------------------------------------------


def account(module: torch.nn.Module, x: torch.Tensor, compiled: bool, backend: str) -> list[dict]:
    """One row per tensor `module(x)` saves for backward (eager, or compiled via `backend`)."""
    saved = SavedTensorLog()
    run = module
    if compiled:
        torch._dynamo.reset()
        run = torch.compile(module, backend=compile_backend(backend, saved.graph_names))
    with saved.recording(module, [x]):
        y = run(x)
    saved.attribute(y)
    rows = saved.rows()
    del y
    return rows


def accounting(args) -> list[dict]:
    """The accounting job's rows: every tensor one RMSNorm and one TransformerBlock save, eager
    and compiled (the block's `accounting` part)."""
    acc = args.block.accounting
    device = torch.device(acc.device) if acc.device == "meta" else pick_device(acc.device)
    s = dims(acc.size, edition=args.edition)
    d, h, f = s["d_model"], s["num_heads"], s["d_ff"]
    b, n = acc.batch_size, acc.context_length
    base = {
        **provenance(args.machine, args.preset, args.edition),
        "size": acc.size,
        "d_model": d,
        "num_heads": h,
        "d_ff": f,
        "batch_size": b,
        "context_length": n,
        "device": device.type,
        "precision": "fp32",
    }
    torch.manual_seed(0)
    rows = []
    for name in ("rmsnorm", "block"):
        for compiled in (False, True):
            label = "compiled" if compiled else "eager"
            backend = acc.compile_backend if compiled else ""

            def measure(name=name, compiled=compiled, backend=backend):
                with device:
                    rope = RotaryEmbedding(d // h, n)
                    module = RMSNorm(d) if name == "rmsnorm" else TransformerBlock(d, h, f, rope)
                x = torch.randn(b, n, d, device=device, requires_grad=True)
                return account(module, x, compiled, backend)

            with point(name, label, backend):
                watch = Stopwatch()
                res = run_point(measure)
                found = res.value or []
                act = sum(
                    r["storage_bytes"] for r in found if r["first"] and r["kind"] == "activation"
                )
                log.log(
                    status_level(res.status),
                    "%s: %d saved tensors, %.1f MiB of activations (%.1f s)",
                    res.status,
                    len(found),
                    act / MiB,
                    watch.s,
                )
            key = {"module_kind": name, "compile": label, "compile_backend": backend}
            if res.status != "ok" or not found:
                rows.append({**base, **key, "status": res.status})
            rows += [{**base, **key, "status": "ok", **r} for r in found]
    return rows


# ---- strategies ------------------------------------------------------------------------------


def vocab_of(k: CheckpointingKnobs) -> int:
    """The study's vocabulary: the block's `vocab_size`, else the model's."""
    return k.vocab_size if k.vocab_size is not None else VOCAB_SIZE


def run_columns(k: CheckpointingKnobs, precision: str, device: torch.device) -> dict:
    """The columns every row of a strategies job shares: its batch, context, precision, device
    and step counts."""
    return {
        "batch_size": k.batch_size,
        "context_length": k.context_length,
        "precision": precision,
        "device": device.type,
        "warmup_steps": k.warmup_steps,
        "measure_steps": k.measure_steps,
    }


def analytic(k: CheckpointingKnobs, precision: str, spec: dict, device_type: str) -> dict:
    """The saved-activation model's inputs for this model and precision."""
    blk = costs.block_saved_bytes(
        k.batch_size,
        k.context_length,
        spec["d_model"],
        spec["num_heads"],
        spec["d_ff"],
        precision,
        device_type,
    )
    head = costs.head_saved_bytes(
        k.batch_size, k.context_length, spec["d_model"], vocab_of(k), precision
    )
    step = step_shape(spec, k.batch_size, k.context_length, vocab_of(k), precision, device_type)
    return {"block": blk, "head": head, "shape": step}


def model_for(name: str, plan: tuple, inputs: dict) -> dict[str, float]:
    """The analytic peak of strategy `name` (its `plan`): whole blocks by checkpoint_memory,
    the halves of a block by sub_block.py."""
    blk = inputs["block"]
    if name in checkpoint_plans.SUB_BLOCK:
        return sub_block_memory(name, blk, inputs["head"], inputs["shape"])
    return costs.checkpoint_memory(
        plan, blk["total"], blk["input"], inputs["head"], blk["weight_casts"]
    )


class Trainer:
    """The model, its batch and AdamW; `step()` is one training step with gradients kept."""

    def __init__(self, k: CheckpointingKnobs, precision: str, spec: dict, device: torch.device):
        torch.manual_seed(SEED)
        vocab = vocab_of(k)
        with device:
            self.model = TransformerLM(vocab_size=vocab, context_length=k.context_length, **spec)
        shape = (k.batch_size, k.context_length)
        self.tokens = torch.randint(0, vocab, shape, device=device)
        self.targets = torch.randint(0, vocab, shape, device=device)
        self.optimizer = make_optimizer(self.model)
        self.device = device
        self.precision = precision

    def loss(self) -> torch.Tensor:
        with autocast(self.precision, self.device):
            logits = self.model(self.tokens)
            return F.cross_entropy(logits.flatten(0, 1).float(), self.targets.flatten())

    def step(self) -> None:
        # gradients stay allocated (zeroed in place): the memory before a step is then
        # parameters + gradients + optimizer state, and the step adds activations only
        self.optimizer.zero_grad(set_to_none=False)
        self.loss().backward()
        self.optimizer.step()

    def static_bytes(self) -> int:
        """Parameters, gradients and AdamW's two moments, all fp32: 16 bytes per parameter."""
        return 16 * sum(p.numel() for p in self.model.parameters())


def measure_strategy(trainer: Trainer, k: CheckpointingKnobs) -> dict:
    """One strategy's step: its peak memory after `warmup_steps`, `measure_steps` timed steps,
    and what one forward leaves saved."""
    device, cuda = trainer.device, trainer.device.type == "cuda"
    for _ in range(k.warmup_steps):
        trainer.step()
    synchronize(device)
    row: dict = {}
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        static = torch.cuda.memory_allocated(device)
        row["static_mb"] = static / MiB
    live = LiveTensorBytes()
    with live:
        trainer.step()
    synchronize(device)
    row["peak_live_mb"] = live.peak / MiB
    if cuda:
        peak = torch.cuda.max_memory_allocated(device)
        row["peak_allocated_mb"] = peak / MiB
        row["peak_activation_mb"] = (peak - static) / MiB
        row["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / MiB
    _, times = time_steps(trainer.step, 0, k.measure_steps, device)
    row.update(summarize(times, "step"))
    saved = SavedTensorLog()
    with saved.recording(trainer.model, [trainer.tokens, trainer.targets]):
        loss = trainer.loss()
    row["forward_saved_mb"] = saved.totals()["activation_bytes_unique"] / MiB
    del loss, saved
    return row


def strategies(args) -> list[dict]:
    """The strategies job's rows: a training step under each strategy of the block, at
    `--precision`, beside the saved-activation model's peak."""
    k, precision = args.block, args.precision
    device = pick_device(STRATEGIES_DEVICE)
    if own_model.spec_for(k.size) is not None:
        return own_strategies(args, device)
    cuda = device.type == "cuda"
    spec = dims(k.size, k.num_layers, args.edition)
    base = {
        **provenance(args.machine, args.preset, args.edition),
        "size": k.size,
        **spec,
        "vocab_size": vocab_of(k),
        **run_columns(k, precision, device),
    }
    inputs = analytic(k, precision, spec, device.type)
    with point(k.size, precision, "build"):
        built = run_point(lambda: Trainer(k, precision, spec, device))
    trainer = built.value
    have = torch.cuda.get_device_properties(device).total_memory if cuda else None
    static = trainer.static_bytes() if trainer is not None else None
    rows = []
    for name in stage_plan.strategies(k):
        plan = checkpoint_plans.plan_for(name, spec["num_layers"])
        model = model_for(name, plan, inputs)
        row = {
            **base,
            "strategy": name,
            "block_size": checkpoint_plans.block_size_of(name),
            "checkpoint_calls": plan_calls(plan),
            "model_peak_mb": model["peak_bytes"] / MiB,
            "model_forward_mb": model["forward_bytes"] / MiB,
            "model_backward_mb": model["backward_bytes"] / MiB,
            "model_block_mb": inputs["block"]["total"] / MiB,
            "model_boundary_mb": inputs["block"]["input"] / MiB,
            "model_head_mb": inputs["head"] / MiB,
            "recomputed_blocks": model["recomputed_blocks"],
            "compute_factor": model["compute_factor"],
        }
        with point(k.size, precision, name):
            if trainer is None:
                row["status"] = built.status
            elif have is not None and static + model["peak_bytes"] > float(k.skip_factor) * have:
                need = (static + model["peak_bytes"]) / GiB
                row["status"] = f"skipped: needs {need:.0f} GiB; have {have / GiB:.0f} GiB"
                row["static_mb"] = static / MiB
            else:
                checkpoint_plans.apply(trainer.model, name)
                res = run_point(lambda: measure_strategy(trainer, k))
                row["status"] = res.status
                row.update(res.value or {})
            log.log(
                status_level(row["status"]),
                "%s: peak %.1f MiB (model %.1f MiB), step %.1f ms",
                row["status"],
                row.get("peak_activation_mb", row.get("peak_live_mb", float("nan"))),
                row["model_peak_mb"],
                row.get("step_ms_mean", float("nan")),
            )
        rows.append(row)
    trainer = built = None
    release_memory()
    return rows


class OwnTrainer(Trainer):
    """A model of one's own (core/own_model.py) in the Trainer's step: its factory, its batch,
    its logits read as the study reads them; the vocabulary is the study's."""

    def __init__(self, k: CheckpointingKnobs, precision: str, device: torch.device):
        torch.manual_seed(SEED)
        own = own_model.spec_for(k.size)
        with device:
            self.model = own_model.build(own, k.context_length)
        self.tokens, self.targets = own_model.make_batch(
            own, k.batch_size, k.context_length, device
        )
        self.optimizer = make_optimizer(self.model)
        self.device, self.precision = device, precision

    def loss(self) -> torch.Tensor:
        with autocast(self.precision, self.device):
            return own_model.loss_of(self.model, self.tokens, self.targets)


# what an own model cannot run, by strategy (its blocks are any modules, not the course's)
OWN_SKIPS = {
    **{
        n: "skipped: nested checkpoints need the course's block stack" for n in ("halving", "chain")
    },
    **{
        n: "skipped: checkpoints inside a block need the course's TransformerBlock"
        for n in checkpoint_plans.SUB_BLOCK
    },
}


# the analytic columns, which know the course's block only
OWN_UNMODELLED = (
    "num_layers",
    "model_peak_mb",
    "model_forward_mb",
    "model_backward_mb",
    "model_block_mb",
    "model_boundary_mb",
    "model_head_mb",
    "recomputed_blocks",
    "compute_factor",
)


def own_segments(name: str, blocks, feeds: bool) -> tuple[list[int] | None, str]:
    """(blocks per checkpointed segment, or None; why not) of strategy `name` on an own
    model's repeated `blocks` (core/own_model.py: repeated_blocks)."""
    if name in OWN_SKIPS:
        return None, OWN_SKIPS[name]
    if name == "none":
        return [], ""
    if blocks is None:
        return None, "skipped: the model has no nn.ModuleList of repeated blocks"
    n = len(blocks)
    if (size := checkpoint_plans.block_size_of(name)) is not None and n % size:
        return None, f"skipped: block size {size} does not divide the {n} blocks"
    sizes = [len(checkpoint_plans.blocks_of((seg,))) for seg in checkpoint_plans.plan_for(name, n)]
    if max(sizes) > 1 and not feeds:
        why = "its blocks do not feed each other in order, so a segment cannot run as one"
        return None, f"skipped: {why}"
    return sizes, ""


def own_strategies(args, device: torch.device) -> list[dict]:
    """The strategies job of an own model: `none`, and every `every_<k>` / `sqrt` its largest
    nn.ModuleList allows, each segment of blocks under one checkpoint call
    (core/own_model.py: checkpoint_segments); the rest `skipped` rows with the reason. No
    analytic columns (the saved-activation model knows the course's block only)."""
    k, precision = args.block, args.precision
    base = {
        **provenance(args.machine, args.preset, args.edition),
        **model_columns(k.size, args.edition, context_length=k.context_length),
        "vocab_size": VOCAB_SIZE,
        **run_columns(k, precision, device),
        **dict.fromkeys(OWN_UNMODELLED, float("nan")),
    }
    with point(k.size, precision, "build"):
        built = run_point(lambda: OwnTrainer(k, precision, device))
    trainer, found, feeds = built.value, None, False
    if trainer is not None and (found := own_model.repeated_blocks(trainer.model)):
        base["blocks"] = f"{found[0]} ({len(found[1])})"
        base["num_layers"] = len(found[1])
        feeds = own_model.feeds_in_order(trainer.model, found[1], trainer.tokens)
    blocks = found[1] if found else None
    rows = []
    for name in stage_plan.strategies(k):
        row = {**base, "strategy": name, "block_size": checkpoint_plans.block_size_of(name)}
        sizes, why = own_segments(name, blocks, feeds)
        with point(k.size, precision, name):
            if trainer is None or sizes is None:
                row["status"] = built.status if trainer is None else why
            else:
                if sizes:
                    own_model.checkpoint_segments(blocks, sizes)
                res = run_point(lambda: measure_strategy(trainer, k))
                own_model.restore_blocks(blocks or [])
                row.update(status=res.status, checkpoint_calls=len(sizes), **(res.value or {}))
            log.log(status_level(row["status"]), "%s", row["status"])
        rows.append(row)
    trainer = built = None
    release_memory()
    return rows


def plan_calls(plan: tuple) -> int:
    """checkpoint calls a plan makes in its forward (nested ones run again in backward)."""
    return sum(1 + plan_calls(item) for item in plan if isinstance(item, tuple))


# ---- CLI -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job, its precision, where its rows go and what they say
    they come from) and the stage's knobs as one value (`--block`: its preset block)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    # the accounting job reads its part of the block only (plan.py: ACCOUNTING_KNOBS)
    for name, knobs in (("accounting", ACCOUNTING_KNOBS), ("strategies", CheckpointingKnobs)):
        p = sub.add_parser(name)
        add_run_arguments(p)
        add_block_argument(p, knobs)
    sub.choices["strategies"].add_argument("--precision", choices=("fp32", "bf16"), required=True)
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    if args.cmd == "strategies" and own_model.spec_for(args.block.size) is None:
        k = args.block
        n = dims(k.size, k.num_layers, args.edition)["num_layers"]
        for name in stage_plan.strategies(k):
            try:
                checkpoint_plans.plan_for(name, n)
            except ValueError as exc:
                ap.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("checkpointing")
    with Stopwatch() as job:
        rows = accounting(args) if args.cmd == "accounting" else strategies(args)
    first = ["module_kind", "compile", "index"] if args.cmd == "accounting" else ["strategy"]
    df = with_columns_first(rows, [*first, "status"])
    write_csv(df, args.out)
    log.info("wrote %s: %d rows in %.1f s", args.out, len(df), job.s)


if __name__ == "__main__":
    main()
