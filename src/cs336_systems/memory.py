"""Stage `memory`: what holds memory during a forward pass and a training step, and when.

    python -m cs336_systems.memory run --size 2.7B --contexts 128,256,512 --modes forward,train_step \
        --precisions fp32,bf16 --machine M --preset P --out S.csv --allocations-out S.alloc.csv \
        --raw-dir raw/ --timeline-dir timelines/

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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cs336_systems import flops
from cs336_systems.benchmark import Workload, pick_device
from cs336_systems.harness import release_memory, run_point, synchronize
from cs336_systems.model import BATCH_SIZE, VOCAB_SIZE, size_spec
from cs336_systems.profile import phase_hooks
from cs336_systems.results import provenance, write_csv

MiB = 2**20
MODES = ("forward", "forward_backward", "train_step")
PRECISIONS = ("fp32", "bf16")
MARK_PREFIX = "_memory_mark_"
TOP_ALLOCATIONS = 10


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
    size: str, context: int, batch: int, precision: str, device_type: str
) -> dict[str, int]:
    s = size_spec(size)
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


def load_snapshot(path: str | Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def _trace(snapshot: dict, device: int | None = None) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    if device is None:  # the device with the most events
        return max(traces, key=len) if traces else []
    return traces[device] if device < len(traces) else []


def _free_action(trace: list[dict]) -> str:
    actions = {e.get("action") for e in trace}
    return "free_completed" if "free_completed" in actions else "free_requested"


def _marker_phase(frames: list[dict]) -> str | None:
    for fr in frames or ():
        name = str(fr.get("name", ""))
        if name.startswith(MARK_PREFIX):
            return name[len(MARK_PREFIX) :]
    return None


def active_timeline(snapshot: dict, device: int | None = None) -> pd.DataFrame:
    """Allocated ("active") bytes after every allocator event of the trace.

    Blocks allocated before the trace began (parameters, optimizer state...) form the baseline:
    those freed during the trace without having been allocated in it, plus those still active
    in the snapshot's segments that the trace never allocated. Columns: event, action, addr,
    size, active_bytes, phase (the last phase marker seen), time_us (when recorded).
    """
    trace = _trace(snapshot, device)
    free = _free_action(trace)
    live: dict[int, int] = {}
    baseline = 0
    deltas, rows = [], []
    phase = "before"
    for i, e in enumerate(trace):
        action, addr, size = e.get("action"), e.get("addr"), int(e.get("size", 0))
        delta = 0
        if action == "alloc":
            marked = _marker_phase(e.get("frames"))
            if marked is not None:
                phase = marked
            live[addr] = size
            delta = size
        elif action == free:
            if addr in live:
                delta = -live.pop(addr)
            else:  # allocated before the trace began
                baseline += size
                delta = -size
        deltas.append(delta)
        rows.append((i, action, addr, size, phase, e.get("time_us", np.nan)))
    for seg in snapshot.get("segments", ()):
        if device is not None and seg.get("device", device) != device:
            continue
        for blk in seg.get("blocks", ()):
            active = blk.get("state") in ("active_allocated", "active_pending_free")
            if active and blk.get("address") not in live:
                baseline += int(blk.get("size", 0))
    df = pd.DataFrame(rows, columns=["event", "action", "addr", "size", "phase", "time_us"])
    df["active_bytes"] = baseline + np.cumsum(np.asarray(deltas, dtype=np.int64))
    df.attrs["baseline_bytes"] = baseline
    return df


def phase_spans(timeline: pd.DataFrame) -> list[tuple[str, int, int]]:
    """(phase, first event, last event) for each run of events under one marker."""
    if timeline.empty:
        return []
    spans, start = [], 0
    phases = timeline["phase"].to_numpy()
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            spans.append((str(phases[start]), start, i - 1))
            start = i
    return spans


_TORCH_PATH_PARTS = ("/torch/", "/site-packages/", "/lib/python3", "<frozen", "/runpy.py")


def user_frames(frames: list[dict], k: int = 3) -> list[str]:
    """Up to `k` `file:line function` frames outside torch and the standard library, innermost
    first (our own code: model.py, benchmark.py ...)."""
    out = []
    for fr in frames or ():
        filename = str(fr.get("filename", ""))
        if not filename.endswith(".py") or any(p in filename for p in _TORCH_PATH_PARTS):
            continue
        if str(fr.get("name", "")).startswith(MARK_PREFIX):
            continue
        out.append(f"{filename.rsplit('/', 1)[-1]}:{fr.get('line', '?')} {fr.get('name', '?')}")
        if len(out) == k:
            break
    return out


def largest_allocations(
    snapshot: dict, n: int = TOP_ALLOCATIONS, device: int | None = None
) -> pd.DataFrame:
    """The `n` largest allocations of the trace (ties: earliest first) with their phase and the
    top user frames of their stacks; `(no Python frames: ...)` when the stack has none."""
    tl = active_timeline(snapshot, device)
    trace = _trace(snapshot, device)
    allocs = tl[tl["action"] == "alloc"]
    allocs = allocs[[_marker_phase(trace[i].get("frames")) is None for i in allocs["event"]]]
    top = allocs.sort_values(["size", "event"], ascending=[False, True]).head(n)
    rows = []
    for rank, (_, a) in enumerate(top.iterrows(), start=1):
        frames = trace[int(a["event"])].get("frames") or []
        users = user_frames(frames)
        if not users:
            users = (
                ["(no Python frames: allocated by the autograd engine or C++)"]
                if not frames
                else [f"(torch internals: {frames[0].get('name', '?')})"]
            )
        rows.append(
            {
                "rank": rank,
                "size_bytes": int(a["size"]),
                "size_mb": a["size"] / MiB,
                "event": int(a["event"]),
                "phase": a["phase"],
                "frames": " <- ".join(users),
            }
        )
    return pd.DataFrame(rows)


def timeline_summary(timeline: pd.DataFrame) -> dict[str, float | str]:
    """Numbers the report states about a timeline: the baseline (memory held before the
    step), the peak and the phase it falls in, and the memory at the end of each phase."""
    if timeline.empty:
        return {}
    active = timeline["active_bytes"]
    i = int(active.to_numpy().argmax())
    out: dict[str, float | str] = {
        "baseline_mb": timeline.attrs.get("baseline_bytes", 0) / MiB,
        "trace_peak_mb": float(active.iloc[i]) / MiB,
        "peak_phase": str(timeline["phase"].iloc[i]),
        "end_mb": float(active.iloc[-1]) / MiB,
    }
    for phase, _, last in phase_spans(timeline):
        if phase in ("forward", "backward", "optimizer"):
            out[f"{phase}_end_mb"] = float(active.iloc[last]) / MiB
            out[f"{phase}_peak_mb"] = float(active[timeline["phase"] == phase].max() / MiB)
    return out


def known_tensor_sizes(size: str, context: int, batch: int, precision: str) -> dict[str, list[int]]:
    """Block sizes (bytes, rounded up to the allocator's 512) of the tensors a step of this
    model allocates, by name, in fp32 and (under bf16 autocast) bf16."""
    s = size_spec(size)
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


def render_timeline(timeline: pd.DataFrame, png: str | Path, title: str) -> Path:
    """Active memory (GiB) against allocator events, each phase shaded and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    y = timeline["active_bytes"] / 2**30
    ax.plot(timeline["event"], y, lw=1.2, color="#1f4e79")
    colors = {
        "forward": "#cfe2f3",
        "backward": "#fce5cd",
        "optimizer": "#d9ead3",
        "optimizer_end": "#eeeeee",
    }
    top = float(y.max()) if len(y) else 1.0
    for phase, a, b in phase_spans(timeline):
        if phase in colors:
            ax.axvspan(a, b, color=colors[phase], alpha=0.8, lw=0)
            ax.text((a + b) / 2, top * 1.02, phase, ha="center", va="bottom", fontsize=8)
    base = timeline.attrs.get("baseline_bytes", 0) / 2**30
    ax.axhline(base, color="grey", lw=0.8, ls="--")
    ax.set_ylim(0, top * 1.12 if top > 0 else 1)
    ax.set_xlabel("allocator event")
    ax.set_ylabel("allocated (GiB)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


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


def measure_point(work: Workload, mode: str, precision: str, warmup: int, snapshot_path, args):
    """One point: warm up, then one recorded step; returns (row values, snapshot or None)."""
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
        t0 = time.perf_counter()
        try:
            with phase_hooks(work.model, mark), _recording(cuda, args.max_entries):
                step()
                synchronize(device)
                snapshot = torch.cuda.memory._snapshot() if cuda else None
        finally:
            opt_hook.remove()
            if state["counting"]:
                counting.__exit__(None, None, None)
        row["step_ms"] = (time.perf_counter() - t0) * 1e3
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
            row["rss_before_mb"] = rss_before.get("VmRSS", np.nan)
            row["peak_rss_mb"] = rss_after.get("VmHWM", np.nan) if reset_rss else np.nan
            row["rss_growth_mb"] = row["peak_rss_mb"] - row["rss_before_mb"]
        return row, snapshot
    finally:
        cleanup()


def point_name(size: str, context: int, mode: str, precision: str) -> str:
    return f"{size}_{context}_{mode}_{precision}"


def run(args) -> tuple[pd.DataFrame, pd.DataFrame]:
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    base = {
        **provenance(args.machine, args.preset),
        "size": args.size,
        "batch_size": args.batch_size,
        "device": device.type,
        "warmup_steps": args.warmup,
    }
    raw_dir, tl_dir = Path(args.raw_dir), Path(args.timeline_dir)
    rows, allocs = [], []
    skip_cuda = "skipped: CUDA memory snapshots need a CUDA device"
    for context in args.contexts:
        built = run_point(lambda c=context: Workload.build(args.size, c, args.batch_size, device))
        for precision in args.precisions:
            for mode in args.modes:
                name = point_name(args.size, context, mode, precision)
                row = {**base, "context_length": context, "mode": mode, "precision": precision}
                analytic = activation_memory_for(
                    args.size, context, args.batch_size, precision, device.type
                )
                row["analytic_activations_mb"] = analytic["total"] / MiB
                row["analytic_residual_stream_mb"] = analytic["residual_stream"] / MiB
                row["analytic_scores_per_layer_mb"] = analytic["attention_scores_per_layer"] / MiB
                row["analytic_weight_casts_mb"] = analytic["weight_casts"] / MiB
                if built.status != "ok":
                    rows.append({**row, "status": built.status})
                    continue
                snap_path = raw_dir / f"{name}.pickle" if cuda else None
                res = run_point(
                    lambda w=built.value, m=mode, p=precision, s=snap_path: measure_point(
                        w, m, p, args.warmup, s, args
                    )
                )
                row["status"] = res.status
                key = {"context_length": context, "mode": mode, "precision": precision}
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
                        known = known_tensor_sizes(args.size, context, args.batch_size, precision)
                        for r in top.to_dict("records"):
                            r["likely_tensor"] = likely_tensor(r["size_bytes"], known)
                            allocs.append({**base, **key, "status": "ok", **r})
                        if not args.keep_raw:
                            snap_path.unlink(missing_ok=True)
                    else:
                        row["timeline_png"] = row["snapshot"] = skip_cuda
                        allocs.append({**base, **key, "status": skip_cuda})
                    snapshot = None
                else:
                    allocs.append({**base, **key, "status": res.status})
                rows.append(row)
                print(
                    f"[memory] {name}: {res.status} "
                    + (
                        f"peak {row.get('peak_allocated_mb', row.get('peak_rss_mb', np.nan)):.0f} MiB"
                        if res.status == "ok"
                        else ""
                    ),
                    flush=True,
                )
        built = None
        release_memory()
    return pd.DataFrame(rows), pd.DataFrame(allocs)


def _csv_list(text: str, cast=str) -> list:
    return [cast(x) for x in str(text).split(",") if x]


def _bool(text: str) -> bool:
    return str(text).lower() in ("1", "true", "yes", "on")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--size", required=True)
    p.add_argument("--contexts", type=lambda s: _csv_list(s, int), required=True)
    p.add_argument("--modes", type=_csv_list, default=["forward", "train_step"])
    p.add_argument("--precisions", type=_csv_list, default=list(PRECISIONS))
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-entries", type=int, default=200_000)
    p.add_argument("--device", default="auto")
    p.add_argument("--machine", required=True)
    p.add_argument("--preset", required=True)
    p.add_argument("--raw-dir", required=True)
    p.add_argument("--timeline-dir", required=True)
    p.add_argument("--keep-raw", type=_bool, default=True)
    p.add_argument("--out", required=True)
    p.add_argument("--allocations-out", required=True)
    args = ap.parse_args(argv)
    for m in args.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; known: {MODES}")
    for prec in args.precisions:
        if prec not in PRECISIONS:
            ap.error(f"unknown precision {prec!r}; known: {PRECISIONS}")
    t0 = time.perf_counter()
    rows, allocs = run(args)
    write_csv(rows, args.out)
    write_csv(allocs, args.allocations_out)
    print(
        f"wrote {args.out} ({len(rows)} points) and {args.allocations_out} "
        f"in {time.perf_counter() - t0:.1f} s; "
        + json.dumps(rows["status"].value_counts().to_dict()),
        flush=True,
    )


if __name__ == "__main__":
    main()
