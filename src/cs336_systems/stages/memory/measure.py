"""Stage `memory`: what holds memory during a forward pass and a training step, and when.

    python -m cs336_systems.stages.memory run --size xl --machine M --preset P --block JSON \
        --out S.csv --allocations-out S.alloc.csv --raw-dir raw/ --timeline-dir timelines/ \
        --keep-raw true

`--block`: the job's part of the stage's preset block as JSON (plan.py: `JOB_KNOBS`, every
knob but the sweep's `sizes`, as the rule passes it).

One job per model size; each (context, mode, precision) point runs warm-up steps of the benchmark
stage's `Workload` (mode `inference`: its forward under `torch.inference_mode()`, beside
`forward`, the same forward with autograd on), then one measured step during which:

- CUDA: the allocator's history is recorded (`torch.cuda.memory._record_memory_history`) and
  dumped as a snapshot `.pickle` (opens in https://pytorch.org/memory_viz); the snapshot is
  rendered here as memory_viz's "Active Memory Timeline" (PNG and PDF: every live block a band
  stacked in allocation order, the phases marked with their durations; and, beside a kept
  snapshot, as a page that opens offline, profiling/memory_page.py), and its largest
  allocations are listed with the top user frames of their stacks. Peak allocated/reserved
  memory, and the split into parameters, gradients, optimizer state and activations.
- CPU: peak resident set size (VmHWM, reset per point) instead; the CUDA-only outputs are rows
  with status `skipped: <reason>`.
- Everywhere: the bytes autograd saves for backward (counted through saved-tensor hooks, unique
  storages, parameters/buffers/inputs excluded) beside `activation_memory`, the analytic model
  (analytic.py).

Phases are marked in the snapshot by tiny allocations made from functions named
``_memory_mark_<phase>``, called from the same module/optimizer hooks the profile stage uses.
"""

from __future__ import annotations

import argparse
import json
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils._pytree import tree_leaves

from cs336_systems.core import checkpoint_plans, own_model
from cs336_systems.core.device import pick_device
from cs336_systems.core.harness import Stopwatch, release_memory, run_point, synchronize
from cs336_systems.core.phases import phase_hooks
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.core.workload import Workload
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.profiling.memory_page import write_viz_page
from cs336_systems.profiling.memory_snapshot import (
    active_timeline,
    largest_allocations,
    render_active_memory,
    timeline_summary,
)
from cs336_systems.stages.memory import blocks
from cs336_systems.stages.memory.analytic import (
    activation_memory_for,
    known_tensor_sizes,
    likely_tensor,
)
from cs336_systems.stages.memory.plan import JOB_KNOBS

MiB = 2**20
GiB = 2**30

log = get_logger(__name__)


# ---------------------------------------------------------------------------------------------
# Measurement


def _memory_mark_forward(device):
    return torch.empty(1, dtype=torch.uint8, device=device)


def _memory_mark_backward(device):
    return torch.empty(1, dtype=torch.uint8, device=device)


def _memory_mark_optimizer(device):
    return torch.empty(1, dtype=torch.uint8, device=device)


def _memory_mark_optimizer_end(device):
    return torch.empty(1, dtype=torch.uint8, device=device)


_MARK_FUNCTIONS = {
    "phase.forward": _memory_mark_forward,
    "phase.backward": _memory_mark_backward,
    "phase.optimizer": _memory_mark_optimizer,
    "phase.optimizer_end": _memory_mark_optimizer_end,
}


class SavedTensorCounter:
    """Bytes of the distinct storages autograd saves for backward, excluding `exclude`d ones
    (parameters, buffers, inputs): the activations, measured without the allocator."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self.exclude:
            self.storages[ptr] = st.nbytes()
        # not `t` itself: a node that saves its own output would then hold a tensor that holds
        # the node, a cycle through C++ that Python's collector never frees (every forward's
        # activations stayed allocated until the process ended)
        return t.detach()

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def _storage_ptrs(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def read_proc_status() -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of this process in MiB, from /proc (Linux)."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = float(value.split()[0]) / 1024  # kB
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_columns(before: dict, after: dict, reset: bool) -> dict:
    """rss_before_mb, peak_rss_mb, rss_growth_mb of a step from /proc/self/status read before
    and after it. The peak of the window is at least every RSS read inside it: the kernel's RSS
    counters are approximate (per-CPU batches), so a VmHWM read after the step can come out a
    few MiB below the VmRSS read just after its reset, which made a negative growth (and a
    suspect row) on a busy machine."""
    rss = before.get("VmRSS", np.nan)
    hwm = after.get("VmHWM", np.nan) if reset else np.nan
    peak = np.nan if np.isnan(hwm) else float(np.nanmax([hwm, after.get("VmRSS", np.nan), rss]))
    return {"rss_before_mb": rss, "peak_rss_mb": peak, "rss_growth_mb": peak - rss}


@contextmanager
def _recording(cuda: bool, max_entries: int) -> Iterator[None]:
    if cuda:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=max_entries
        )
    try:
        yield
    finally:
        if cuda:
            torch.cuda.memory._record_memory_history(enabled=None)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_point(
    work: Workload,
    mode: str,
    precision: str,
    warmup: int,
    snapshot_path,
    max_entries: int,
    strategy="none",
):
    """One point (its blocks run under checkpointing `strategy`): warm up, then one recorded
    step (a CUDA snapshot keeps `max_entries` allocator events); returns (row values, snapshot
    or None)."""
    if strategy == "none":  # any module (an own model has no TransformerLM blocks)
        return _measure_point(work, mode, precision, warmup, snapshot_path, max_entries)
    checkpoint_plans.apply(work.model, strategy)
    try:
        return _measure_point(work, mode, precision, warmup, snapshot_path, max_entries)
    finally:
        checkpoint_plans.apply(work.model, "none")


def _measure_point(
    work: Workload, mode: str, precision: str, warmup: int, snapshot_path, max_entries: int
):
    device = work.device
    cuda = device.type == "cuda"
    step, cleanup = work.step(WORKLOAD_MODE.get(mode, mode), precision, False)
    if mode == "inference":
        step = inference(step)
    try:
        for _ in range(warmup):
            step()
        synchronize(device)
        row: dict = {}
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            row["before_step_mb"] = torch.cuda.memory_allocated(device) / MiB
        reset_rss = reset_peak_rss()
        rss_before = read_proc_status()
        rec = recorded_step(work, step, max_entries)
        row["step_ms"] = rec["step_ms"]
        rss_after = read_proc_status()
        row.update(state_columns(work, rec["optimizer"], rec["saved_bytes"]))
        if cuda:
            row.update(allocator_columns(device, rec["marks"]))
            if snapshot_path is not None:
                snapshot_path.parent.mkdir(parents=True, exist_ok=True)
                with open(snapshot_path, "wb") as f:
                    pickle.dump(rec["snapshot"], f)
        else:
            row.update(rss_columns(rss_before, rss_after, reset_rss))
        return row, rec["snapshot"]
    finally:
        cleanup()


# the memory stage's modes that the benchmark's Workload runs under another name: an inference
# forward is the Workload's forward with autograd off (`inference`)
WORKLOAD_MODE = {"inference": "forward"}
MODE_TITLE = {
    "inference": "inference forward (torch.inference_mode)",
    "forward": "forward with autograd on",
    "forward_backward": "forward+backward",
    "train_step": "training step",
}


def inference(step):
    """`step` run under `torch.inference_mode()`: no graph is built, nothing is saved for
    backward, and each layer's intermediates are freed as soon as the next layer has read them
    (the handout's "forward pass only", as an inference server runs it)."""

    def run(*args, **kwargs):
        with torch.inference_mode():
            return step(*args, **kwargs)

    return run


def recorded_step(work: Workload, step, max_entries: int) -> dict:
    """One step with its phases marked, the bytes autograd saves counted and (CUDA) the
    allocator's history recorded: {step_ms, marks (allocated MiB at each phase mark), optimizer
    (the one that stepped, or None), saved_bytes, snapshot (CUDA, else None)}."""
    device = work.device
    cuda = device.type == "cuda"
    marks: dict[str, float] = {}
    state: dict = {"optimizer": None, "counting": False}
    excluded = _storage_ptrs([*work.model.parameters(), *work.model.buffers()])
    excluded |= _storage_ptrs(tree_leaves([work.tokens, work.targets]))
    counter = SavedTensorCounter(excluded)
    counting = torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack)

    def mark(name: str) -> None:
        if cuda:
            marks[name] = torch.cuda.memory_allocated(device) / MiB
            _MARK_FUNCTIONS[name](device)
        # saved-tensor hooks are thread-local: enter on the main thread (forward pre-hook) and
        # leave after the step, on the same thread; backward and optimizer save nothing
        if name == "phase.forward" and not state["counting"]:
            counting.__enter__()
            state["counting"] = True

    def remember_optimizer(opt, *_):
        state["optimizer"] = opt

    from torch.optim.optimizer import register_optimizer_step_post_hook

    opt_hook = register_optimizer_step_post_hook(remember_optimizer)
    watch = Stopwatch()
    try:
        with phase_hooks(work.model, mark), _recording(cuda, max_entries):
            step()
            synchronize(device)
            snapshot = torch.cuda.memory._snapshot() if cuda else None
    finally:
        opt_hook.remove()
        if state["counting"]:
            counting.__exit__(None, None, None)
    step_ms = watch.stop() * 1e3
    return {
        "step_ms": step_ms,
        "marks": marks,
        "optimizer": state["optimizer"],
        "saved_bytes": counter.bytes,
        "snapshot": snapshot,
    }


def state_columns(work: Workload, optimizer, saved_bytes: int) -> dict:
    """MiB of the parameters, their gradients, the optimizer's state and the saved activations
    after a step."""
    params = list(work.model.parameters())
    opt_state = []
    if optimizer is not None:
        for st in optimizer.state.values():
            opt_state += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return {
        "params_mb": _tensor_bytes(params) / MiB,
        "grads_mb": _tensor_bytes(p.grad for p in params if p.grad is not None) / MiB,
        "optimizer_state_mb": _tensor_bytes(opt_state) / MiB,
        "saved_activations_mb": saved_bytes / MiB,
    }


def allocator_columns(device: torch.device, marks: dict[str, float]) -> dict:
    """The CUDA allocator's peaks over the step and what it held at each phase mark (MiB)."""
    fwd, bwd = marks.get("phase.forward", np.nan), marks.get("phase.backward", np.nan)
    return {
        "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / MiB,
        "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / MiB,
        "allocated_at_forward_mb": fwd,
        "allocated_at_backward_mb": bwd,
        "allocated_at_optimizer_mb": marks.get("phase.optimizer", np.nan),
        "forward_growth_mb": bwd - fwd,
    }


def point_name(size: str, context: int, mode: str, precision: str, strategy: str = "none") -> str:
    tail = "" if strategy == "none" else f"_{strategy}"
    return f"{size}_{context}_{mode}_{precision}{tail}"


SKIP_CUDA = "skipped: CUDA memory snapshots need a CUDA device"


def inference_need(analytic: dict) -> float:
    """An upper bound of what an inference forward holds above its weights (bytes): one
    layer's intermediates (what autograd would save of it, all alive at once), the head's input
    and norm, the logits and their log-softmax, and, as a margin, autocast's bf16 copy of every
    weight (which it keeps with autograd on; under inference_mode it casts each again where it
    is used, so the bound is loose by them)."""
    return (
        analytic["per_layer"]
        + analytic["final_norm_and_head"]
        + 2 * analytic["loss"]
        + analytic["weight_casts"]
    )


def point_row(args, base: dict, point_key: dict, device_type: str) -> tuple[dict, float]:
    """A point's row before it runs (its analytic columns), and the bytes it needs."""
    k = args.block
    context, mode, precision, strategy = (
        point_key[c] for c in ("context_length", "mode", "precision", "checkpoint")
    )
    row = {
        **base,
        "context_length": context,
        "mode": mode,
        "precision": precision,
        "checkpoint": strategy,
        "checkpoint_choice": "none" if strategy == "none" else k.checkpoint.strategy,
    }
    if own_model.spec_for(args.size) is not None:  # no analytic model of a module of one's own
        return row, 0.0
    analytic = activation_memory_for(
        args.size, context, k.batch_size, precision, device_type, args.edition
    )
    row["analytic_activations_mb"] = analytic["total"] / MiB
    row["analytic_residual_stream_mb"] = analytic["residual_stream"] / MiB
    row["analytic_scores_per_layer_mb"] = analytic["attention_scores_per_layer"] / MiB
    row["analytic_weight_casts_mb"] = analytic["weight_casts"] / MiB
    held = inference_need(analytic) if mode == "inference" else analytic["total"]
    need = blocks.step_need_bytes(
        args.size, context, k.batch_size, mode, precision, device_type,
        strategy, held, args.edition,
    )  # fmt: skip
    row["analytic_need_gib"] = need / GiB
    if strategy != "none":
        peak = blocks.checkpoint_peak(
            strategy, args.size, context, k.batch_size, precision, device_type, args.edition
        )
        row["analytic_checkpoint_peak_mb"] = peak / MiB
    return row, need


def snapshot_rows(args, row: dict, alloc_key: dict, snapshot, snap_path: Path) -> list[dict]:
    """A CUDA point's snapshot: its timeline rendered and summarized into `row`, and the rows
    of its largest allocations; the snapshot kept (with its page, profiling/memory_page.py) or
    dropped."""
    context, mode, precision = row["context_length"], row["mode"], row["precision"]
    name = point_name(args.size, context, mode, precision, row["checkpoint"])
    tl = active_timeline(snapshot)
    row.update(timeline_summary(tl))
    ck = "" if row["checkpoint"] == "none" else f", checkpointing {row['checkpoint']}"
    title = f"{args.size}, context {context}, {MODE_TITLE.get(mode, mode)}, {precision}{ck}"
    png = render_active_memory(
        snapshot, Path(args.timeline_dir) / f"memory_timeline_{name}.png", title
    )
    row["timeline_png"] = png.name
    row["snapshot"] = str(snap_path) if args.keep_raw else "dropped"
    row["trace_events"] = len(tl)
    top = largest_allocations(snapshot)
    known = known_tensor_sizes(args.size, context, args.block.batch_size, precision, args.edition)
    allocs = []
    for r in top.to_dict("records"):
        r["likely_tensor"] = likely_tensor(r["size_bytes"], known)
        allocs.append({**alloc_key, "status": "ok", **r})
    if args.keep_raw:  # its timeline as a page that opens offline, beside the snapshot
        write_viz_page(snapshot, snap_path.with_suffix(".html"), title)
    else:
        snap_path.unlink(missing_ok=True)
    return allocs


def measured_row(args, work: Workload, row: dict, alloc_key: dict) -> tuple[dict, list[dict]]:
    """Run the point: its row with what it measured, and its allocations' rows."""
    cuda = work.device.type == "cuda"
    mode, precision, strategy = row["mode"], row["precision"], row["checkpoint"]
    name = point_name(args.size, row["context_length"], mode, precision, strategy)
    snap_path = Path(args.raw_dir) / f"{name}.pickle" if cuda else None
    k = args.block
    res = run_point(
        lambda: measure_point(
            work, mode, precision, k.warmup_steps, snap_path, entries_of(k), strategy
        )
    )
    row["status"] = res.status
    if res.status != "ok":
        return row, [{**alloc_key, "status": res.status}]
    values, snapshot = res.value
    row.update(values)
    if not cuda:
        row["timeline_png"] = row["snapshot"] = SKIP_CUDA
        return row, [{**alloc_key, "status": SKIP_CUDA}]
    return row, snapshot_rows(args, row, alloc_key, snapshot, snap_path)


def own_columns(size: str) -> dict:
    """An own model's factory and counted parameters (core/own_model.py); nothing for a
    course size."""
    if (own := own_model.spec_for(size)) is None:
        return {}
    return {"own_model": own.factory, "params": own_model.describe(own, 16, 1)["params"]}


def run(args) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every point of one size (blocks.grid: each context's modes and precisions, and the
    checkpointed ones); a point predicted not to fit is a `skipped` row, a failed one a row
    with its status. Returns (point rows, allocation rows)."""
    k = args.block
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    base = {
        **provenance(args.machine, args.preset, args.edition),
        **own_columns(args.size),
        "size": args.size,
        "batch_size": k.batch_size,
        "device": device.type,
        "warmup_steps": k.warmup_steps,
    }
    rows, allocs = [], []
    have = torch.cuda.get_device_properties(device).total_memory if cuda else None
    for context in k.context_lengths:
        with point(args.size, f"ctx{context}", "build"):
            built = run_point(
                lambda c=context: Workload.build(
                    args.size, c, k.batch_size, device, edition=args.edition
                )
            )
        for precision, mode, strategy in blocks.grid(args, context, device.type):
            with point(args.size, f"ctx{context}", mode, precision, strategy):
                key = {"context_length": context, "mode": mode, "precision": precision}
                key["checkpoint"] = strategy
                row, need = point_row(args, base, key, device.type)
                if built.status != "ok":
                    rows.append({**row, "status": built.status})
                    continue
                if have and need > skip_factor_of(k) * have:
                    row["status"] = (
                        f"skipped: needs {need / GiB:.0f} GiB, have {have / GiB:.0f} GiB"
                    )
                    rows.append(row)
                    allocs.append({**base, **key, "status": row["status"]})
                    log.info("%s", row["status"])
                    continue
                row, more = measured_row(args, built.value, row, {**base, **key})
                rows.append(row)
                allocs += more
                peak = row.get("peak_allocated_mb", row.get("peak_rss_mb", np.nan))
                shown = f" peak {peak:.0f} MiB" if row["status"] == "ok" else ""
                log.log(status_level(row["status"]), "%s%s", row["status"], shown)
        built = None
        release_memory()
    return pd.DataFrame(rows), pd.DataFrame(allocs)


def _bool(text: str) -> bool:
    return str(text).lower() in ("1", "true", "yes", "on")


# what a block that leaves a knob out gets (the knobs that may be left out; a block without
# `checkpoint` runs no checkpointed point, without `nsys_contexts` no Nsight capture)
MAX_ENTRIES = 200_000
SKIP_FACTOR = 1.5
# not knobs: the device (CUDA when present) and the seconds part (f)'s nsys capture may take
DEVICE = "auto"
NSYS_TIMEOUT_S = 600.0


def entries_of(k) -> int:
    """Allocator events a snapshot keeps: the block's `max_entries`, else MAX_ENTRIES."""
    return k.max_entries if k.max_entries is not None else MAX_ENTRIES


def skip_factor_of(k) -> float:
    """The block's `skip_factor`, else SKIP_FACTOR."""
    return float(k.skip_factor if k.skip_factor is not None else SKIP_FACTOR)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's size, where its rows and raw files go, what they say
    they come from) and the stage's knobs as one value (`--block`: the job's part of its
    preset block)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--size", required=True, help="the job's model size (one of `sizes`)")
    add_run_arguments(p)
    add_block_argument(p, JOB_KNOBS)
    p.add_argument("--raw-dir", required=True)
    p.add_argument("--timeline-dir", required=True)
    p.add_argument("--keep-raw", type=_bool, required=True, help="keep the snapshots")
    p.add_argument("--allocations-out", required=True)
    p.add_argument("--blocks-out", default="", help="part (f) rows (blocks.py); empty: none")
    p.set_defaults(device=DEVICE, nsys_timeout=NSYS_TIMEOUT_S)
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("memory")
    with Stopwatch() as job:
        rows, allocs = run(args)
    write_csv(rows, args.out)
    write_csv(allocs, args.allocations_out)
    if args.blocks_out:
        write_csv(pd.DataFrame(blocks.block_grid(args, pick_device(args.device))), args.blocks_out)
    log.info(
        "wrote %s (%d points) and %s in %.1f s; %s",
        args.out,
        len(rows),
        args.allocations_out,
        job.s,
        json.dumps(rows["status"].value_counts().to_dict()),
    )


if __name__ == "__main__":
    main()
