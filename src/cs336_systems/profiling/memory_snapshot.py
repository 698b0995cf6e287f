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


# ---- memory_viz's "Active Memory Timeline": every live block a band, stacked -----------------

# blocks drawn one band each (the largest; memory_viz's `max_entries`), the rest summed into one
# grey band on top, as memory_viz summarizes them
MAX_DRAWN = 3000
# the largest allocations of the step numbered on their bands and named beside the plot
LABELLED = 5
PHASE_COLORS = {
    "before": "#eeeeee",
    "forward": "#9fc5e8",
    "backward": "#f9cb9c",
    "optimizer": "#b6d7a8",
    "optimizer_end": "#d9d9d9",
}
PHASE_NAMES = {
    "before": "before forward",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "optimizer_end": "after the optimizer",
}


def event_axis(trace: list[dict]) -> tuple[np.ndarray, str]:
    """The x value of every event and the axis's label: milliseconds since the first event
    where every event has `time_us` (the host clock of the allocator's call), else the event's
    index (memory_viz's own axis: the allocator's event order)."""
    times = [e.get("time_us") for e in trace]
    if trace and all(isinstance(t, int | float) and t > 0 for t in times):
        t = np.asarray(times, dtype=np.float64)
        t = np.maximum.accumulate(t)  # the allocator's threads may log a microsecond apart
        return (t - t[0]) / 1e3, "time since the first allocator event (ms, host clock)"
    return np.arange(len(trace), dtype=np.float64), "allocator event (order: no time_us)"


def _elements(snapshot: dict, trace: list[dict]) -> tuple[list[dict], list[tuple]]:
    """The blocks (memory_viz's "elements"): those live before the trace (freed in it without
    an allocation, or active at its end without one), then one per allocation; and the events
    as (index, 'alloc' | 'free', element id)."""
    free = _free_action(trace)
    live: dict = {}
    elements: list[dict] = []
    before: list[dict] = []
    events: list[tuple] = []
    for i, e in enumerate(trace):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = len(elements)
            elements.append({"size": int(e.get("size", 0)), "event": i, "frames": e.get("frames")})
            events.append((i, "alloc", live[addr]))
        elif action == free:
            if addr in live:
                events.append((i, "free", live.pop(addr)))
            else:
                before.append({"size": int(e.get("size", 0)), "event": -1, "frames": None})
                events.append((i, "free", -len(before)))
    for seg in snapshot.get("segments", ()):
        for blk in seg.get("blocks", ()):
            active = blk.get("state") in ("active_allocated", "active_pending_free")
            if active and blk.get("address") not in live:
                before.append({"size": int(blk.get("size", 0)), "event": -1, "frames": None})
    # the blocks live before the trace sit at the bottom, in the order found
    n = len(before)
    events = [(i, kind, eid + n if eid >= 0 else -eid - 1) for i, kind, eid in events]
    return before + elements, events


def stack_bands(snapshot: dict, device: int | None = None, max_drawn: int = MAX_DRAWN) -> dict:
    """memory_viz's stacked layout of the trace: each block a band whose bottom is the sum of
    the live drawn blocks allocated before it (a freed block's band ends, those above it drop by
    its size); the `max_drawn` largest blocks drawn, the rest summed in one band on top.

    Returns {x (per event), xlabel, end (the axis's end), bands: [{element, size, event (its
    allocation's, -1 before the trace), frames, xs, ys (its bottom's vertices), live (at the
    end, where it is)}], summary:
    (xs, bottoms, sizes) of the summed band, baseline_bytes}."""
    trace = _trace(snapshot, device)
    x, xlabel = event_axis(trace)
    elements, events = _elements(snapshot, trace)
    order = sorted(range(len(elements)), key=lambda k: -elements[k]["size"])
    drawn = set(order[:max_drawn])
    start = x[0] if len(x) else 0.0
    end = x[-1] if len(x) else 1.0
    bands: dict[int, dict] = {}
    stack: list[int] = []
    total = summed = 0

    def push(k: int, at: float) -> None:
        nonlocal total, summed
        el = elements[k]
        if k in drawn:
            bands[k] = {"element": k, **el, "xs": [at], "ys": [total]}
            stack.append(k)
            total += el["size"]
        else:
            summed += el["size"]

    def pop(k: int, at: float) -> None:
        nonlocal total, summed
        size = elements[k]["size"]
        if k not in drawn:
            summed -= size
            return
        j = stack.index(k)
        stack.pop(j)
        b = bands[k]
        b["xs"].append(at)
        b["ys"].append(b["ys"][-1])
        for above in stack[j:]:
            a = bands[above]
            a["xs"] += [at, at]
            a["ys"] += [a["ys"][-1], a["ys"][-1] - size]
        total -= size

    n_before = sum(1 for el in elements if el["event"] < 0)
    for k in range(n_before):
        push(k, start)
    sx, sb, ss = [start], [total], [summed]
    for i, kind, k in events:
        (push if kind == "alloc" else pop)(k, float(x[i]))
        sx.append(float(x[i]))
        sb.append(total)
        ss.append(summed)
    for k in stack:  # live at the end
        bands[k]["live"] = True
        bands[k]["xs"].append(end)
        bands[k]["ys"].append(bands[k]["ys"][-1])
    baseline = sum(el["size"] for el in elements[:n_before])
    return {
        "x": x,
        "xlabel": xlabel,
        "end": end,
        "bands": [bands[k] for k in sorted(bands)],
        "summary": (np.asarray(sx), np.asarray(sb), np.asarray(ss)),
        "summarized": len(elements) - len(drawn & set(range(len(elements)))),
        "baseline_bytes": baseline,
    }


def phase_times(timeline: pd.DataFrame, x: np.ndarray) -> list[tuple[str, float, float]]:
    """(phase, start, end) on the figure's axis `x`: a phase runs from its first event to the
    next phase's first (its real width: a phase that allocates little still takes its time)."""
    spans = phase_spans(timeline)
    out = []
    for j, (phase, a, b) in enumerate(spans):
        stop = spans[j + 1][1] if j + 1 < len(spans) else b
        out.append((phase, float(x[a]), float(x[stop])))
    return out


def _band_polygon(b: dict, gib: float) -> np.ndarray:
    xs = np.asarray(b["xs"], dtype=np.float64)
    ys = np.asarray(b["ys"], dtype=np.float64) / gib
    top = ys + b["size"] / gib
    return np.column_stack([np.r_[xs, xs[::-1]], np.r_[ys, top[::-1]]])


def _draw_bands(ax, bands: dict) -> None:
    """Each drawn block a filled band (memory_viz's categorical colours), the summed small
    blocks one grey band on top."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    cmap = plt.get_cmap("tab20")
    polys = [_band_polygon(b, 2**30) for b in bands["bands"]]
    colors = [cmap(b["element"] % 20) for b in bands["bands"]]
    ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="none"))
    sx, sb, ss = bands["summary"]
    if len(ss) and ss.max() > 0:
        ax.fill_between(sx, sb / 2**30, (sb + ss) / 2**30, step="post", color="#999999", lw=0)
    top = (sb + ss).max() / 2**30 if len(sb) else 1.0
    ax.set_xlim(bands["x"][0] if len(bands["x"]) else 0, max(bands["end"], 1e-9))
    ax.set_ylim(0, top * 1.05 if top > 0 else 1)


def _draw_phases(ax_phase, ax, spans: list[tuple[str, float, float]]) -> list:
    """The phases as a strip above the plot with their real width (a name inside a span wide
    enough for it), a dotted line at each start; returns the legend's handles (name and
    duration)."""
    from matplotlib.patches import Patch

    lo, hi = ax.get_xlim()
    width = max(hi - lo, 1e-12)
    unit = "ms" if "ms" in ax.get_xlabel() else "events"
    handles = []
    for phase, a, b in spans:
        color = PHASE_COLORS.get(phase, "#cccccc")
        ax_phase.axvspan(a, max(b, a + width * 2e-3), color=color, lw=0)
        if phase != "before":
            ax.axvline(a, color="#555555", lw=0.6, ls=":")
        name = PHASE_NAMES.get(phase, phase)
        if (b - a) / width > 0.12:
            ax_phase.text((a + b) / 2, 0.5, name, ha="center", va="center", fontsize=7)
        handles.append(Patch(color=color, label=f"{name}: {b - a:,.4g} {unit}"))
    ax_phase.set_yticks([])
    ax_phase.tick_params(labelbottom=False, bottom=False)
    return handles


def _bottom_at(b: dict, x: float) -> float:
    """The band's bottom (bytes) at `x`: its last vertex at or before `x`."""
    j = int(np.searchsorted(np.asarray(b["xs"]), x, side="right")) - 1
    return float(b["ys"][max(j, 0)])


def _mark_spot(ax, b: dict, placed: list[tuple[float, float]]):
    """Where the band's number goes: the first point along its life (its middle first) at
    least a label's size from every number placed; None where every point would collide."""
    x0, x1 = b["xs"][0], b["xs"][-1]
    to_axes = ax.transAxes.inverted().transform
    for frac in (0.5, 0.3, 0.7, 0.15, 0.85, 0.05, 0.95):
        x = x0 + frac * (x1 - x0)
        y = (_bottom_at(b, x) + b["size"] / 2) / 2**30
        u, v = to_axes(ax.transData.transform((x, y)))
        if all(abs(u - pu) > 0.035 or abs(v - pv) > 0.06 for pu, pv in placed):
            return x, y, (u, v)
    return None


def largest_bands(bands: dict, trace: list[dict], n: int) -> list[dict]:
    """The bands of the `n` largest blocks allocated in the trace (phase markers aside), largest
    first (ties: earliest first): the ones the figure and the page number."""
    made = [b for b in bands["bands"] if b["event"] >= 0]
    made = [b for b in made if _marker_phase(trace[b["event"]].get("frames")) is None]
    made.sort(key=lambda b: (-b["size"], b["event"]))
    return made[:n]


def size_text(size: int) -> str:
    """A block's size as the figure and the page write it: MiB from a tenth of one, else KiB."""
    return f"{size / MiB:,.1f} MiB" if size >= MiB / 10 else f"{size / 1024:,.1f} KiB"


def _label_largest(ax, bands: dict, timeline: pd.DataFrame, trace: list[dict], n: int) -> list:
    """The `n` largest blocks allocated in the trace (phase markers aside) numbered on their
    bands; returns the lines naming them (size, phase, the innermost frames of our code)."""
    placed: list[tuple[float, float]] = []
    lines = []
    for rank, b in enumerate(largest_bands(bands, trace, n), start=1):
        spot = _mark_spot(ax, b, placed)
        where = "; not marked: its band is covered by the numbers above"
        if spot is not None:
            x, y, uv = spot
            placed.append(uv)
            ax.text(x, y, str(rank), fontsize=7, ha="center", va="center", fontweight="bold",
                    bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "ec": "black", "lw": 0.5})  # fmt: skip
            where = ""
        users = user_frames(b["frames"] or [], k=1) or ["no Python frames (autograd engine, C++)"]
        phase = PHASE_NAMES.get(str(timeline["phase"].iloc[b["event"]]), "?")
        lines.append(f"{rank}: {size_text(b['size'])}, in {phase}, at {users[0][:70]}{where}")
    return lines


def render_active_memory(
    snapshot: dict, png: str | Path, title: str, device: int | None = None
) -> Path:
    """memory_viz's "Active Memory Timeline" of `snapshot` as a PNG and its PDF twin: every
    live block a band stacked in allocation order on the trace's time axis (event_axis), the
    largest allocations numbered and named below, the phases as a strip above with their real
    width. Returns `png`."""
    from cs336_systems.core.style import use_figure_style

    use_figure_style()
    import matplotlib.pyplot as plt

    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    trace = _trace(snapshot, device)
    bands = stack_bands(snapshot, device)
    timeline = active_timeline(snapshot, device)
    fig, (ax_phase, ax) = plt.subplots(
        2, 1, figsize=(10, 6.4), sharex=True, gridspec_kw={"height_ratios": [1, 14]}
    )
    _draw_bands(ax, bands)
    ax.set_xlabel(bands["xlabel"])
    ax.set_ylabel("active memory (GiB)")
    spans = phase_times(timeline, bands["x"])
    if all(p == "before" for p, _, _ in spans):  # no phase marker in the trace: none drawn
        spans = []
    handles = _draw_phases(ax_phase, ax, spans)
    summed = bands["summarized"]
    note = f"; {summed:,} smaller ones summed in grey" if summed else ""
    ax_phase.set_title(
        f"{title}\nActive memory timeline, as memory_viz draws it: {len(bands['bands']):,} "
        f"blocks in allocation order{note}",
        fontsize=9,
    )
    bottom = 0.1
    fig.subplots_adjust(left=0.07, right=0.77, top=0.9)
    if handles:  # no phase marker in the trace: no legend (an empty one cannot be laid out)
        fig.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(0.78, 0.86),
                   ncol=1, title="phase: duration", title_fontsize=7)  # fmt: skip
    lines = _label_largest(ax, bands, timeline, trace, LABELLED) if len(trace) else []
    if lines:
        bottom = 0.1 + 0.024 * len(lines)
        fig.text(0.07, 0.015, "The largest allocations of the step:\n" + "\n".join(lines),
                 fontsize=7, va="bottom", family="monospace")  # fmt: skip
    fig.subplots_adjust(bottom=bottom)
    fig.savefig(png, dpi=110)
    fig.savefig(png.with_suffix(".pdf"), metadata={"CreationDate": None})  # for write-ups
    plt.close(fig)
    return png
