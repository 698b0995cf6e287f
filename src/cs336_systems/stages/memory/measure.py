"""Stage `memory`: what holds memory during a forward pass and a training step, and when.

    python -m cs336_systems.stages.memory run --size xl --machine M --preset P --block JSON \
        --out S.csv --allocations-out S.alloc.csv --raw-dir raw/ --timeline-dir timelines/ \
        --keep-raw true

`--block`: the job's part of the stage's preset block as JSON (plan.py: `JOB_KNOBS`, every
knob but the sweep's `sizes`, as the rule passes it).

One job per model size; each (context, mode, precision) point runs warm-up steps of the benchmark
stage's `Workload`, then one measured step during which:

- CUDA: the allocator's history is recorded (`torch.cuda.memory._record_memory_history`) and
  dumped as a snapshot `.pickle` (opens in https://pytorch.org/memory_viz); the snapshot is
  rendered here as an "active memory over time" PNG with the phases marked, and its largest
  allocations are listed with the top user frames of their stacks. Peak allocated/reserved
  memory, and the split into parameters, gradients, optimizer state and activations.
- CPU: peak resident set size (VmHWM, reset per point) instead; the CUDA-only outputs are rows
  with status `skipped: <reason>`.
- Everywhere: the bytes autograd saves for backward (counted through saved-tensor hooks, unique
  storages, parameters/buffers/inputs excluded) beside `activation_memory`, the analytic model.

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

from cs336_systems.core import checkpoint_plans
from cs336_systems.core import costs as flops
from cs336_systems.core.device import pick_device
from cs336_systems.core.harness import Stopwatch, release_memory, run_point, synchronize
from cs336_systems.core.phases import phase_hooks
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.core.workload import Workload
from cs336_systems.model import VOCAB_SIZE, size_spec
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.profiling.memory_snapshot import (
    active_timeline,
    largest_allocations,
    render_timeline,
    timeline_summary,
    write_viz_page,
)
from cs336_systems.stages.memory import blocks
from cs336_systems.stages.memory.plan import JOB_KNOBS

MiB = 2**20
GiB = 2**30
PRECISIONS = ("fp32", "bf16")

log = get_logger(__name__)


# ---------------------------------------------------------------------------------------------
# The analytic model


def activation_memory(
    batch: int,
    seq: int,
    d_model: int,
    num_layers: int,
    num_heads: int,
    d_ff: int,
    vocab_size: int = VOCAB_SIZE,
    precision: str = "fp32",
    device_type: str = "cuda",
) -> dict[str, int]:
    """Bytes autograd keeps for backward after the forward pass and the loss of our model
    (naive attention, RMSNorm in fp32, SwiGLU, RoPE), per component.

    Per block, in elements (b batch, n seq, d d_model, f d_ff, h heads), fp32:
      RMSNorm x2: its input and x*rms (2 bnd each) and rms (bn); the normed output, shared by
      the projections that read it (bnd each); RoPE'd q, k and a contiguous v (3 bnd);
      softmax probabilities (b h n^2) and the causal mask (n^2 bools); the attention output
      before W_O (bnd); SwiGLU: w1 x, silu(w1 x), w3 x and their product (4 bnf).
      -> 4 * (10 bnd + 4 bnf + b h n^2 + 2 bn) + n^2 bytes.
    bf16 autocast: the residual stream and the norms stay fp32 (4 bytes), every matmul input
    is a bf16 copy made per matmul (q, k, v and w1, w3 each cast the same fp32 input: 3 + 2
    copies), matmul outputs are bf16; on CUDA softmax runs in fp32 (4-byte probabilities, then
    a 2-byte copy for the PV matmul), CPU autocast keeps it in bf16; autocast's cached bf16
    copies of the weights are saved too (2 bytes per matmul parameter).
    After the blocks: the final norm (2 bnd + bn fp32) and the LM head's input, and the loss:
    log-softmax output (b n V, fp32) and nll_loss's total weight (a scalar).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {PRECISIONS}")
    b, n, d, f, h, L, V = batch, seq, d_model, d_ff, num_heads, num_layers, vocab_size
    bnd, bnf, bhnn, bn = b * n * d, b * n * f, b * h * n * n, b * n
    mask = n * n
    if precision == "fp32":
        norms = 2 * (4 * 2 * bnd + 4 * bn)
        matmul_inputs = 4 * (bnd + 3 * bnd + bnd + bnd)  # ln1-out, q k v, attn-out, ln2-out
        scores = 4 * bhnn
        mlp = 4 * 4 * bnf
        head_input = 4 * bnd
        weight_casts = 0
    else:
        norms = 2 * (4 * 2 * bnd + 4 * bn)
        matmul_inputs = 2 * (3 * bnd + 3 * bnd + bnd + 2 * bnd)  # casts, q k v, attn-out, casts
        scores = (4 + 2 if device_type == "cuda" else 2) * bhnn
        mlp = 2 * 4 * bnf
        head_input = 2 * bnd
        weight_casts = 2 * flops.matmul_param_count(V, d, L, f)
    per_layer = norms + matmul_inputs + scores + mlp + mask
    final = 4 * 2 * bnd + 4 * bn + head_input
    loss = 4 * b * n * V + 4
    out = {
        "residual_stream": 4 * bnd,
        "attention_scores_per_layer": scores,
        "per_layer": per_layer,
        "layers": L * per_layer,
        "final_norm_and_head": final,
        "loss": loss,
        "weight_casts": weight_casts,
    }
    out["total"] = out["layers"] + final + loss + weight_casts
    return out


def activation_memory_for(
    size: str, context: int, batch: int, precision: str, device_type: str, edition=None
) -> dict[str, int]:
    s = size_spec(size, edition)
    return activation_memory(
        batch,
        context,
        s["d_model"],
        s["num_layers"],
        s["num_heads"],
        s["d_ff"],
        VOCAB_SIZE,
        precision,
        device_type,
    )


# ---------------------------------------------------------------------------------------------
# Snapshot -> timeline, phases, largest allocations


def known_tensor_sizes(
    size: str, context: int, batch: int, precision: str, edition=None
) -> dict[str, list[int]]:
    """Block sizes (bytes, rounded up to the allocator's 512) of the tensors a step of this
    model allocates, by name, in fp32 and (under bf16 autocast) bf16."""
    s = size_spec(size, edition)
    b, n, d, f, h, V = batch, context, s["d_model"], s["d_ff"], s["num_heads"], VOCAB_SIZE
    widths = (4, 2) if precision == "bf16" else (4,)
    shapes = {
        "attention scores/probabilities (b·h·n²)": b * h * n * n,
        "logits / log-softmax / their grad (b·n·V)": b * n * V,
        "SwiGLU hidden (b·n·d_ff)": b * n * f,
        "residual-stream-sized activation (b·n·d)": b * n * d,
        "W1/W2/W3 weight-sized (d·d_ff)": d * f,
        "embedding/LM-head weight-sized (V·d)": V * d,
        "attention projection weight-sized (d²)": d * d,
    }
    out: dict[str, list[int]] = {
        name: [-(-(elems * w) // 512) * 512 for w in widths] for name, elems in shapes.items()
    }
    out["causal mask (n², bool)"] = [-(-(n * n) // 512) * 512]
    return out


def likely_tensor(size_bytes: int, known: dict[str, list[int]]) -> str:
    names = [name for name, sizes in known.items() if int(size_bytes) in sizes]
    return " or ".join(names)


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
    return {t.untyped_storage().data_ptr() for t in tensors}


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
    work: Workload, mode: str, precision: str, warmup: int, snapshot_path, args, strategy="none"
):
    """One point (its blocks run under checkpointing `strategy`): warm up, then one recorded
    step; returns (row values, snapshot or None)."""
    checkpoint_plans.apply(work.model, strategy)
    try:
        return _measure_point(work, mode, precision, warmup, snapshot_path, args)
    finally:
        checkpoint_plans.apply(work.model, "none")


def _measure_point(work: Workload, mode: str, precision: str, warmup: int, snapshot_path, args):
    device = work.device
    cuda = device.type == "cuda"
    step, cleanup = work.step(mode, precision, False)
    marks: dict[str, float] = {}
    state: dict = {"optimizer": None, "counting": False}
    excluded = _storage_ptrs([*work.model.parameters(), *work.model.buffers()])
    excluded |= _storage_ptrs([work.tokens, work.targets])
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
        opt_hook = register_optimizer_step_post_hook(remember_optimizer)
        watch = Stopwatch()
        try:
            with phase_hooks(work.model, mark), _recording(cuda, args.max_entries):
                step()
                synchronize(device)
                snapshot = torch.cuda.memory._snapshot() if cuda else None
        finally:
            opt_hook.remove()
            if state["counting"]:
                counting.__exit__(None, None, None)
        row["step_ms"] = watch.stop() * 1e3
        rss_after = read_proc_status()
        params = list(work.model.parameters())
        opt_state = []
        if state["optimizer"] is not None:
            for st in state["optimizer"].state.values():
                opt_state += [v for v in st.values() if isinstance(v, torch.Tensor)]
        row.update(
            {
                "params_mb": _tensor_bytes(params) / MiB,
                "grads_mb": _tensor_bytes(p.grad for p in params if p.grad is not None) / MiB,
                "optimizer_state_mb": _tensor_bytes(opt_state) / MiB,
                "saved_activations_mb": counter.bytes / MiB,
            }
        )
        if cuda:
            fwd, bwd = marks.get("phase.forward", np.nan), marks.get("phase.backward", np.nan)
            row.update(
                {
                    "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / MiB,
                    "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / MiB,
                    "allocated_at_forward_mb": fwd,
                    "allocated_at_backward_mb": bwd,
                    "allocated_at_optimizer_mb": marks.get("phase.optimizer", np.nan),
                    "forward_growth_mb": bwd - fwd,
                }
            )
            if snapshot_path is not None:
                snapshot_path.parent.mkdir(parents=True, exist_ok=True)
                with open(snapshot_path, "wb") as f:
                    pickle.dump(snapshot, f)
        else:
            row.update(rss_columns(rss_before, rss_after, reset_rss))
        return row, snapshot
    finally:
        cleanup()


def point_name(size: str, context: int, mode: str, precision: str, strategy: str = "none") -> str:
    tail = "" if strategy == "none" else f"_{strategy}"
    return f"{size}_{context}_{mode}_{precision}{tail}"


def run(args) -> tuple[pd.DataFrame, pd.DataFrame]:
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    base = {
        **provenance(args.machine, args.preset, args.edition),
        "size": args.size,
        "batch_size": args.batch_size,
        "device": device.type,
        "warmup_steps": args.warmup,
    }
    raw_dir, tl_dir = Path(args.raw_dir), Path(args.timeline_dir)
    rows, allocs = [], []
    skip_cuda = "skipped: CUDA memory snapshots need a CUDA device"
    have = torch.cuda.get_device_properties(device).total_memory if cuda else None
    for context in args.contexts:
        with point(args.size, f"ctx{context}", "build"):
            built = run_point(
                lambda c=context: Workload.build(
                    args.size, c, args.batch_size, device, edition=args.edition
                )
            )
        for precision, mode, strategy in blocks.grid(args, context, device.type):
            with point(args.size, f"ctx{context}", mode, precision, strategy):
                name = point_name(args.size, context, mode, precision, strategy)
                row = {
                    **base,
                    "context_length": context,
                    "mode": mode,
                    "precision": precision,
                    "checkpoint": strategy,
                    "checkpoint_choice": "none" if strategy == "none" else args.checkpoint,
                }
                analytic = activation_memory_for(
                    args.size, context, args.batch_size, precision, device.type, args.edition
                )
                row["analytic_activations_mb"] = analytic["total"] / MiB
                row["analytic_residual_stream_mb"] = analytic["residual_stream"] / MiB
                row["analytic_scores_per_layer_mb"] = analytic["attention_scores_per_layer"] / MiB
                row["analytic_weight_casts_mb"] = analytic["weight_casts"] / MiB
                need = blocks.step_need_bytes(
                    args.size, context, args.batch_size, mode, precision, device.type,
                    strategy, analytic["total"], args.edition,
                )  # fmt: skip
                row["analytic_need_gib"] = need / GiB
                if strategy != "none":
                    row["analytic_checkpoint_peak_mb"] = (
                        blocks.checkpoint_peak(
                            strategy,
                            args.size,
                            context,
                            args.batch_size,
                            precision,
                            device.type,
                            args.edition,
                        )  # fmt: skip
                        / MiB
                    )
                key = {"context_length": context, "mode": mode, "precision": precision}
                key["checkpoint"] = strategy
                if built.status != "ok":
                    rows.append({**row, "status": built.status})
                    continue
                if have and need > args.skip_factor * have:
                    row["status"] = (
                        f"skipped: needs {need / GiB:.0f} GiB, have {have / GiB:.0f} GiB"
                    )
                    rows.append(row)
                    allocs.append({**base, **key, "status": row["status"]})
                    log.info("%s", row["status"])
                    continue
                snap_path = raw_dir / f"{name}.pickle" if cuda else None
                res = run_point(
                    lambda w=built.value, m=mode, p=precision, s=snap_path, c=strategy: (
                        measure_point(w, m, p, args.warmup, s, args, c)
                    )
                )
                row["status"] = res.status
                if res.status == "ok":
                    values, snapshot = res.value
                    row.update(values)
                    if cuda:
                        tl = active_timeline(snapshot)
                        row.update(timeline_summary(tl))
                        png = render_timeline(
                            tl,
                            tl_dir / f"memory_timeline_{name}.png",
                            f"{args.size}, context {context}, {mode}, {precision}",
                        )
                        row["timeline_png"] = png.name
                        row["snapshot"] = str(snap_path) if args.keep_raw else "dropped"
                        row["trace_events"] = len(tl)
                        top = largest_allocations(snapshot)
                        known = known_tensor_sizes(
                            args.size, context, args.batch_size, precision, args.edition
                        )
                        for r in top.to_dict("records"):
                            r["likely_tensor"] = likely_tensor(r["size_bytes"], known)
                            allocs.append({**base, **key, "status": "ok", **r})
                        if args.keep_raw:  # memory_viz's page beside the snapshot
                            write_viz_page(snapshot, snap_path.with_suffix(".html"))
                        else:
                            snap_path.unlink(missing_ok=True)
                    else:
                        row["timeline_png"] = row["snapshot"] = skip_cuda
                        allocs.append({**base, **key, "status": skip_cuda})
                    snapshot = None
                else:
                    allocs.append({**base, **key, "status": res.status})
                rows.append(row)
                peak = row.get("peak_allocated_mb", row.get("peak_rss_mb", np.nan))
                shown = f" peak {peak:.0f} MiB" if res.status == "ok" else ""
                log.log(status_level(res.status), "%s%s", res.status, shown)
        built = None
        release_memory()
    return pd.DataFrame(rows), pd.DataFrame(allocs)


def _bool(text: str) -> bool:
    return str(text).lower() in ("1", "true", "yes", "on")


# what a block that leaves a knob out gets (the knobs that may be left out)
MAX_ENTRIES = 200_000
NO_CHECKPOINT = {"contexts": [], "modes": [], "strategy": "best"}
SKIP_FACTOR = 1.5
# not knobs: the device (CUDA when present) and the seconds part (f)'s nsys capture may take
DEVICE = "auto"
NSYS_TIMEOUT_S = 600.0


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
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return with_knobs(args)


def with_knobs(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with each knob of its block as the attribute the stage reads."""
    k = args.block  # plan.py: JOB_KNOBS
    args.contexts, args.modes = list(k.context_lengths), list(k.modes)
    args.precisions, args.batch_size, args.warmup = list(k.precisions), k.batch_size, k.warmup_steps
    args.max_entries = k.max_entries if k.max_entries is not None else MAX_ENTRIES
    ck = k.checkpoint.as_block() if k.checkpoint is not None else NO_CHECKPOINT
    args.checkpoint_contexts, args.checkpoint_modes = list(ck["contexts"]), list(ck["modes"])
    args.checkpoint = ck["strategy"]
    args.skip_factor = float(k.skip_factor if k.skip_factor is not None else SKIP_FACTOR)
    args.nsys_contexts = list(k.nsys_contexts or [])
    args.nsys = k.nsys or ""
    args.device, args.nsys_timeout = DEVICE, NSYS_TIMEOUT_S
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
