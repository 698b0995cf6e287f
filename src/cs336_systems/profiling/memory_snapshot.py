"""CUDA memory snapshots (`torch.cuda.memory._record_memory_history`): the active-memory
timeline, its phases (from marker frames), the largest allocations with the user code that made
them, and the rendered timeline figure."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd

MiB = 2**20
# allocations listed per point by default
TOP_ALLOCATIONS = 10


MARK_PREFIX = "_memory_mark_"


def write_viz_page(snapshot: dict, path: str | Path) -> Path:
    """`path` as torch's memory_viz page of `snapshot` (torch.cuda._memory_viz.trace_plot: the
    active-memory timeline, stack frames on hover; the snapshot embedded, the viewer's script
    loaded from its CDN when the page opens); returns `path`."""
    from torch.cuda import _memory_viz

    path = Path(path)
    path.write_text(_memory_viz.trace_plot(snapshot))
    return path


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


def render_timeline(timeline: pd.DataFrame, png: str | Path, title: str) -> Path:
    """Active memory (GiB) against allocator events, each phase shaded and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

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
    shown = []
    for phase, a, b in phase_spans(timeline):
        if phase in colors:
            ax.axvspan(a, b, color=colors[phase], alpha=0.8, lw=0)
            shown.append(phase)
    base = timeline.attrs.get("baseline_bytes", 0) / 2**30
    ax.axhline(base, color="grey", lw=0.8, ls="--")
    ax.set_ylim(0, top * 1.12 if top > 0 else 1)
    # the phases named in a legend, not over their spans: a short phase (the optimizer's end)
    # would print its name over its neighbour's
    handles = [Patch(color=colors[p], label=p) for p in dict.fromkeys(shown)]
    handles.append(Line2D([], [], color="grey", lw=0.8, ls="--", label="before the step"))
    ax.legend(handles=handles, fontsize=7, loc="lower right", ncol=len(handles))
    ax.set_xlabel("allocator event")
    ax.set_ylabel("allocated (GiB)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    fig.savefig(Path(png).with_suffix(".pdf"), metadata={"CreationDate": None})  # for write-ups
    plt.close(fig)
    return png
