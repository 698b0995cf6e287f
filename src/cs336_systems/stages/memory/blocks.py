"""Part (f) of the 2026 memory questions: what one TransformerBlock saves for backward, by op,
and the bytes of one block's parameter gradients; the checkpointing choice of the 2026 grid.

    python -m cs336_systems.stages.memory block --size 2.7B --context 2048 --precision fp32

- ``block_saved_by_op``: one block of the model (its own input, shape (b, n, d_model), needs
  grad) runs forward under ``profiling.saved_tensors.SavedTensorLog``; each distinct storage it
  saved (parameters, buffers and the input excluded) is counted once, under the op(s) that saved
  it (``MmBackward0.self``, ``SoftmaxBackward0.result``; a storage saved by two ops is one group
  named by both). Rows: the ops ranked by bytes with their share of the block's total.
- ``block_grad_bytes``: backward of that block's output; a post-accumulate-grad hook on each of
  its parameters adds up the gradient bytes as backward makes them (fp32 parameters: 4 bytes
  per parameter, under autocast too).
- ``best_block_size``: the k of ``every_<k>`` checkpointing (core/checkpoint_plans.py) that
  minimizes the peak saved bytes of ``core.costs.checkpoint_memory`` for this model, context and
  precision (ties: the larger k, fewer checkpoint calls).
- ``step_need_bytes``: parameters, gradients and AdamW state a mode holds plus the analytic
  saved activations: what decides a `skipped: needs X GiB, have Y GiB` row before allocating.
- ``nsys_capture``: the `block` command above under ``nsys profile --cuda-memory-usage true``,
  kept as a raw capture (a row `skipped: nsys absent` without nsys or CUDA), its SQLite export
  trimmed to the timeline's tables in the timeline folder (``timeline``: the figure's input).
  Without nsys (or where it fails), the same block under torch.profiler with memory recorded,
  its window (the ``block.forward`` and ``block.backward`` ranges) saved in its place.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cs336_systems.core import costs, own_model
from cs336_systems.core.checkpoint_plans import plan_for, strategy_name
from cs336_systems.core.device import autocast
from cs336_systems.core.harness import release_memory, run_point, synchronize
from cs336_systems.core.phases import annotate
from cs336_systems.core.results import provenance
from cs336_systems.model import VOCAB_SIZE, RotaryEmbedding, TransformerBlock, size_spec
from cs336_systems.planning.log import configure, get_logger, point
from cs336_systems.profiling import nsys as nsys_tools
from cs336_systems.profiling import nsys_timeline
from cs336_systems.profiling.saved_tensors import SavedTensorLog

TOP = 5
GiB = 2**30
# bytes per parameter a mode holds besides activations: weights; + gradients; + AdamW's moments
STATE_BYTES = {"inference": 4, "forward": 4, "forward_backward": 8, "train_step": 16}
# NVTX / record_function ranges around the block's forward and backward (the timeline's window)
FORWARD_RANGE, BACKWARD_RANGE = "block.forward", "block.backward"
BLOCK_WINDOW = r"block\.(forward|backward)"

log = get_logger(__name__)


def build_block(size: str, context: int, device, edition: str | None = None) -> TransformerBlock:
    s = size_spec(size, edition)
    with torch.device(device):
        rope = RotaryEmbedding(s["d_model"] // s["num_heads"], context)
        return TransformerBlock(s["d_model"], s["num_heads"], s["d_ff"], rope)


def block_saved_by_op(
    block: torch.nn.Module, x: torch.Tensor, precision: str
) -> tuple[dict[str, int], dict[str, float], torch.Tensor]:
    """(bytes per op label, the log's totals, the block's output) for one forward of `block`."""
    saved = SavedTensorLog()
    with saved.recording(block, inputs=[x]), autocast(precision, x.device):
        out = block(x)
    saved.attribute(out)
    by_op: dict[str, int] = {}
    for s in saved.saved:
        if s.kind == "activation" and s.first:
            by_op[s.op] = by_op.get(s.op, 0) + s.storage_bytes
    return dict(sorted(by_op.items(), key=lambda kv: -kv[1])), saved.totals(), out


def top_ops(by_op: dict[str, int], top: int = TOP) -> list[dict]:
    """The `top` largest groups with their share of all the block's saved activation bytes."""
    total = sum(by_op.values())
    return [
        {"rank": i + 1, "op": op, "bytes": b, "share": b / total if total else float("nan")}
        for i, (op, b) in enumerate(list(by_op.items())[:top])
    ]


def block_grad_bytes(block: torch.nn.Module, out: torch.Tensor) -> int:
    """Bytes of the block's parameter gradients made by backward of `out`, counted by hooks."""
    made = {"bytes": 0}

    def hook(p: torch.Tensor) -> None:
        made["bytes"] += p.grad.numel() * p.grad.element_size()

    handles = [p.register_post_accumulate_grad_hook(hook) for p in block.parameters()]
    try:
        out.float().sum().backward()
    finally:
        for h in handles:
            h.remove()
    return made["bytes"]


def block_rows(
    size: str, context: int, batch: int, precision: str, device, edition: str | None = None
) -> list[dict]:
    """Part (f) rows of one (context, precision): the top ops, then a `block_total` row."""
    device = torch.device(device)
    s = size_spec(size, edition)
    torch.manual_seed(0)
    block = build_block(size, context, device, edition)
    x = torch.randn(batch, context, s["d_model"], device=device, requires_grad=True)
    m0 = allocated(device)
    with annotate(FORWARD_RANGE):  # the ranges the timeline figure is drawn around
        by_op, totals, out = block_saved_by_op(block, x, precision)
        synchronize(device)
    m1 = allocated(device)
    params = sum(p.numel() for p in block.parameters())
    with annotate(BACKWARD_RANGE):
        grads = block_grad_bytes(block, out)
        synchronize(device)
    m2 = allocated(device)
    out_bytes = out.numel() * out.element_size()
    dx_bytes = x.grad.numel() * x.grad.element_size() if x.grad is not None else 0
    model = costs.block_saved_bytes(
        batch, context, s["d_model"], s["num_heads"], s["d_ff"], precision, device.type
    )
    key = {"context_length": context, "precision": precision, "device": device.type}
    rows = [{**key, "part": "saved_by_op", **r} for r in top_ops(by_op)]
    rows.append(
        {
            **key,
            "part": "block_total",
            "bytes": totals["activation_bytes_unique"],
            "input_bytes": totals["input_bytes"],
            "analytic_bytes": model["total"],
            "ops": len(by_op),
            "top_share": sum(r["share"] for r in rows),
            "block_params": params,
            "grad_bytes": grads,
            # the allocator's view (CUDA; NaN on a CPU): what forward added (the saved tensors
            # and the output), what backward changed (gradients and dx made, the saved freed),
            # and the gradients' bytes those imply (part (f)'s calculation from the profile)
            "forward_alloc_bytes": m1 - m0,
            "backward_alloc_change_bytes": m2 - m1,
            "output_bytes": out_bytes,
            "input_grad_bytes": dx_bytes,
            "grads_from_memory_bytes": (m2 - m1) + (m1 - m0 - out_bytes) - dx_bytes,
        }
    )
    return rows


def allocated(device: torch.device) -> float:
    """Bytes the CUDA caching allocator holds in tensors now (NaN elsewhere: no allocator)."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    return float(torch.cuda.memory_allocated(device))


# ---- the 2026 grid's checkpointing choice and the skip decision --------------------------------


def _analytic(size: str, context: int, batch: int, precision: str, device_type: str, edition=None):
    s = size_spec(size, edition)
    blk = costs.block_saved_bytes(
        batch, context, s["d_model"], s["num_heads"], s["d_ff"], precision, device_type
    )
    head = costs.head_saved_bytes(batch, context, s["d_model"], VOCAB_SIZE, precision)
    return s["num_layers"], blk, head


def checkpoint_peak(
    strategy: str,
    size: str,
    context: int,
    batch: int,
    precision: str,
    device_type: str,
    edition: str | None = None,
) -> float:
    """Analytic peak saved bytes of a training step under `strategy` (core.costs)."""
    n, blk, head = _analytic(size, context, batch, precision, device_type, edition)
    plan = plan_for(strategy, n)
    return costs.checkpoint_memory(plan, blk["total"], blk["input"], head, blk["weight_casts"])[
        "peak_bytes"
    ]


def best_block_size(
    size: str, context: int, batch: int, precision: str, device_type: str, edition=None
) -> int:
    """The divisor k of the layer count whose `every_<k>` has the least analytic peak."""
    n = size_spec(size, edition)["num_layers"]
    ks = [k for k in range(1, n + 1) if n % k == 0]
    peaks = {
        k: checkpoint_peak(strategy_name(k), size, context, batch, precision, device_type, edition)
        for k in ks
    }
    return min(ks, key=lambda k: (peaks[k], -k))


def step_need_bytes(
    size: str,
    context: int,
    batch: int,
    mode: str,
    precision: str,
    device_type: str,
    strategy: str,
    activations: float,
    edition: str | None = None,
) -> float:
    """Bytes a point needs: the state its mode holds plus its saved activations (`activations`:
    the whole-model analytic count; a checkpointed point: the strategy's analytic peak)."""
    s = size_spec(size, edition)
    params = costs.param_count(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"])
    if strategy != "none":
        activations = checkpoint_peak(
            strategy, size, context, batch, precision, device_type, edition
        )
    return STATE_BYTES[mode] * params + activations


# ---- the grid of the measure job


def grid(args, context: int, device_type: str) -> list[tuple[str, str, str]]:
    """(precision, mode, checkpointing strategy) of each point at `context`: every mode without
    checkpointing; at the block's `checkpoint.contexts`, its `checkpoint.modes` again with
    `every_<k>`, k the analytic best (blocks.best_block_size) or the given strategy."""
    knobs = args.block
    # an own model: no blocks to checkpoint by the analytic best (core/own_model.py)
    ck = knobs.checkpoint if own_model.spec_for(args.size) is None else None
    out = []
    for precision in knobs.precisions:
        for mode in knobs.modes:
            out.append((precision, mode, "none"))
            if ck is not None and context in ck.contexts and mode in ck.modes:
                strategy = ck.strategy
                if strategy == "best":
                    k = best_block_size(
                        args.size, context, knobs.batch_size, precision, device_type, args.edition
                    )
                    strategy = strategy_name(k)
                out.append((precision, mode, strategy))
    return out


def block_grid(args, device: torch.device) -> list[dict]:
    """Part (f) rows for every (context, precision), and Nsight's capture where it can run;
    an own model's a `skipped` row each (part (f) runs one TransformerBlock)."""
    knobs = args.block
    base = {**provenance(args.machine, args.preset, args.edition), "size": args.size}
    base["batch_size"] = knobs.batch_size
    if own_model.spec_for(args.size) is not None:
        why = f"skipped: part (f) measures the course's TransformerBlock, not {args.size}"
        return [
            {**base, "context_length": c, "precision": p, "part": "block_total", "status": why}
            for c in knobs.context_lengths
            for p in knobs.precisions
        ]
    out = []
    for context in knobs.context_lengths:
        for precision in knobs.precisions:
            with point(args.size, f"ctx{context}", "block", precision):
                res = run_point(
                    lambda c=context, p=precision: block_rows(
                        args.size, c, knobs.batch_size, p, device, args.edition
                    )
                )
            key = {"context_length": context, "precision": precision}
            if res.status != "ok":
                out.append({**key, "part": "block_total", "status": res.status})
            else:
                out += [{**r, "status": "ok"} for r in res.value]
            release_memory()
    for context in knobs.nsys_contexts or []:
        for precision in knobs.precisions:
            row = nsys_capture(args, Path(args.raw_dir), context, precision, knobs.nsys or "")
            out.append({**row, **block_timeline(args, row, context, precision, device)})
            release_memory()
    return [{**base, **r} for r in out]


# ---- Nsight's view of the same block ------------------------------------------------------------


def nsys_capture(args, raw_dir: Path, context: int, precision: str, nsys_setting: str) -> dict:
    """A raw `nsys profile --cuda-memory-usage true` capture of one block's forward+backward."""
    key = {"context_length": context, "precision": precision, "part": "nsys_capture"}
    path = nsys_tools.find_nsys(nsys_setting or None)
    if path is None or not torch.cuda.is_available():
        why = "nsys absent" if path is None else "no CUDA device"
        return {**key, "status": f"skipped: {why}"}
    out = raw_dir / f"{args.size}_block_{context}_{precision}_cuda_memory"
    cmd = [
        sys.executable,
        "-m",
        "cs336_systems.stages.memory.blocks",
        f"--size={args.size}",
        f"--context={context}",
        f"--batch-size={args.block.batch_size}",
        f"--precision={precision}",
        f"--edition={args.edition}",
    ]
    try:
        rep = nsys_tools.run_profile(
            path, out, cmd, args.nsys_timeout, None, "none", ["--cuda-memory-usage=true"]
        )
    except (nsys_tools.NsysError, OSError) as exc:
        return {**key, "status": f"error: {str(exc)[:160]}"}
    return {**key, "status": "ok", "capture": str(rep)}


def block_timeline(args, row: dict, context: int, precision: str, device) -> dict:
    """The timeline figure's input for one capture (`timeline`, `timeline_source`, and
    `timeline_status` when none could be made): the nsys capture's SQLite export trimmed to
    what the figure reads, else one block under torch.profiler (memory recorded)."""
    folder = Path(args.timeline_dir)
    name = f"{args.size}_block_{context}_{precision}"
    if row["status"] == "ok":
        try:
            nsys = nsys_tools.find_nsys(args.block.nsys or None)
            db = nsys_tools.export_sqlite(nsys, row["capture"], args.nsys_timeout)
            out = nsys_tools.trim_sqlite(db, folder / f"{name}.sqlite", nsys_timeline.TABLES)
            return {"timeline": str(out), "timeline_source": nsys_timeline.NSYS}
        except (nsys_tools.NsysError, OSError, TypeError) as exc:
            log.warning("nsys export of %s failed (%s): torch.profiler instead", name, exc)
    res = run_point(lambda: profiled_block(args, context, precision, device, folder / name))
    if res.status != "ok":
        return {"timeline_status": res.status}
    return {"timeline": str(res.value), "timeline_source": nsys_timeline.TORCH}


def profiled_block(args, context: int, precision: str, device, stem: Path) -> Path:
    """One block's forward and backward (`block_rows`) under torch.profiler with memory
    recorded; its window saved as `<stem>.timeline.json.gz`."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, profile_memory=True) as prof:
        block_rows(args.size, context, args.block.batch_size, precision, device, args.edition)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return nsys_timeline.save_window(
            trace, BLOCK_WINDOW, stem.with_name(stem.name + ".timeline.json.gz")
        )


def main(argv: list[str] | None = None) -> None:
    """One block's forward and backward on CUDA (what `nsys_capture` profiles)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--edition", default=None)
    args = ap.parse_args(argv)
    configure("memory")
    rows = block_rows(
        args.size, args.context, args.batch_size, args.precision, args.device, args.edition
    )
    total = rows[-1]
    log.info(
        "block saved %.1f MiB, gradients %.1f MiB",
        total["bytes"] / 2**20,
        total["grad_bytes"] / 2**20,
    )


if __name__ == "__main__":
    main()
