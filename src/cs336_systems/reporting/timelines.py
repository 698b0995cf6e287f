"""Nsight-style timeline figures from `profiling/nsys_timeline.py`'s `Timeline`s: per panel, the
NVTX ranges by nesting depth, a row per compute stream, the communication row, and the memory
track under them, on a time axis in ms from the window's start. Panels side by side in time
share one scale (DDP naive beside overlapped: a longer step is a longer row).

The longest kernels of each row are labelled with their short names (templates and arguments
dropped) where the box is wide enough for the text, so no two labels meet; each panel's title
says where its data came from (Nsight Systems, or torch.profiler where nsys was absent), and a
panel without a memory track says why in the track's place.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.profiling.nsys_timeline import TORCH, Timeline
from cs336_systems.profiling.overlap import overlap_stats
from cs336_systems.reporting.analysis import empty_figure, pct, save

WIDTH_IN = 11.0
LABEL_PT = 6.5
# the longest boxes of a row labelled (where they fit)
LABELLED = 8
NVTX_DEPTHS = 3
PALETTE = plt.get_cmap("tab20").colors


@dataclass
class Panel:
    """One timeline panel: `timeline` clipped to its window (`nsys_timeline.clip`), or None with
    the `reason` it is missing."""

    title: str
    timeline: Timeline | None
    reason: str = ""


def short_name(name: str) -> str:
    """A kernel's or operator's name without return type, templates, arguments, namespaces:
    ``void at::native::elementwise_kernel<128, 4, ...>(int, ...)`` -> ``elementwise_kernel``."""
    text = str(name)
    previous = None
    while previous != text:  # innermost brackets first
        previous = text
        text = re.sub(r"<[^<>]*>|\([^()]*\)", "", text)
    text = text.strip().split(" ")[-1] if text.strip() else str(name)
    return text.split("::")[-1] or str(name)


def _color(name: str, comm: bool = False) -> tuple:
    if comm:
        return (0.85, 0.33, 0.1)
    h = int(hashlib.md5(name.encode()).hexdigest()[:6], 16)
    return PALETTE[h % len(PALETTE)]


def nvtx_depths(ranges: pd.DataFrame) -> pd.Series:
    """Each range's row: the first whose boxes all end by its start, ranges taken by start
    (the longer first). Nested ranges get their nesting depth; ranges of two threads that
    overlap without nesting (a backward range on autograd's thread) get rows apart, so no two
    boxes of a row, nor their labels, meet."""
    depth = pd.Series(0, index=ranges.index, dtype=int)
    ends: list[float] = []  # the last end in each row
    for i, r in ranges.sort_values(["start_ns", "end_ns"], ascending=[True, False]).iterrows():
        row = next((n for n, e in enumerate(ends) if e <= r["start_ns"]), len(ends))
        if row == len(ends):
            ends.append(r["end_ns"])
        ends[row] = r["end_ns"]
        depth[i] = row
    return depth


def lanes(tl: Timeline) -> list[tuple[str, pd.DataFrame]]:
    """(label, boxes) per row, top to bottom: NVTX by depth, compute streams (busiest first;
    beyond two, the rest share a row), then communication (always a row, empty or not)."""
    out = []
    if len(tl.ranges):
        depth = nvtx_depths(tl.ranges)
        for d in range(min(int(depth.max()) + 1, NVTX_DEPTHS)):
            out.append((f"NVTX {d}" if d else "NVTX", tl.ranges[depth == d]))
    compute = tl.compute
    busy = (compute["end_ns"] - compute["start_ns"]).groupby(compute["stream"]).sum()
    streams = list(busy.sort_values(ascending=False).index)
    gpu = tl.compute_what == "CUDA kernels"
    for s in streams[:2]:
        label = f"compute\nstream {int(s)}" if gpu else "CPU ops\n(main thread)"
        out.append((label, compute[compute["stream"] == s]))
    if len(streams) > 2:
        out.append(("compute\nother streams", compute[compute["stream"].isin(streams[2:])]))
    if not streams:
        out.append(("compute", compute))
    out.append((_comm_label(tl), tl.communication))
    return out


def _comm_label(tl: Timeline) -> str:
    comm = tl.communication
    if tl.comm_what != "NCCL kernels":
        return "gloo\n(worker threads)"
    if comm.empty:
        return "NCCL"
    streams = sorted(int(s) for s in comm["stream"].dropna().unique())
    return "NCCL\nstream " + ",".join(str(s) for s in streams[:3])


def _labels(ax, boxes: pd.DataFrame, y: float, t0: float, ms_per_pt: float, nvtx: bool) -> None:
    """Names on the longest boxes, each cut to its box's width (none where under 4 chars fit)
    and left out where it would meet a label already placed (boxes of a row overlap where
    several threads or streams share it)."""
    dur = boxes["end_ns"] - boxes["start_ns"]
    placed: list[tuple[float, float]] = []  # (left, right) of each label, in ms
    char_ms = 0.62 * LABEL_PT * ms_per_pt
    for i in dur.sort_values(ascending=False).index[:LABELLED]:
        r = boxes.loc[i]
        width_ms = (r["end_ns"] - r["start_ns"]) / 1e6
        fits = int(width_ms / char_ms) - 1
        if fits < 4:
            continue
        name = str(r["name"]) if nvtx else short_name(r["name"])
        text = name if len(name) <= fits else name[: fits - 1] + "…"
        mid = ((r["start_ns"] + r["end_ns"]) / 2 - t0) / 1e6
        half = (len(text) + 1) * char_ms / 2
        if any(mid - half < b and a < mid + half for a, b in placed):
            continue
        placed.append((mid - half, mid + half))
        ax.text(mid, y, text, ha="center", va="center", fontsize=LABEL_PT, clip_on=True)


def _within(boxes: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    """The boxes cut at the window's edges (a range begun before it starts at its start)."""
    out = boxes.copy()
    out["start_ns"] = out["start_ns"].clip(lower=lo)
    out["end_ns"] = out["end_ns"].clip(upper=hi)
    return out[out["end_ns"] > out["start_ns"]]


def _draw_lanes(ax, tl: Timeline, t0: float, span_ms: float) -> None:
    lo, hi = _extent(tl)
    rows = [(label, _within(boxes, lo, hi)) for label, boxes in lanes(tl)]
    ms_per_pt = span_ms / (ax.get_position().width * ax.figure.get_figwidth() * 72)
    for n, (label, boxes) in enumerate(rows):
        y = len(rows) - 1 - n
        nvtx = label.startswith("NVTX")
        if boxes.empty:
            ax.text(
                span_ms / 2,
                y,
                "none in this window",
                ha="center",
                va="center",
                fontsize=7,
                color="0.4",
            )
            continue
        colors = [
            (0.46, 0.72, 0.33) if nvtx else _color(short_name(r["name"]), bool(r["comm"]))
            for _, r in boxes.iterrows()
        ]
        starts = (boxes["start_ns"] - t0) / 1e6
        widths = ((boxes["end_ns"] - boxes["start_ns"]) / 1e6).clip(lower=span_ms * 1e-4)
        ax.barh(
            [y] * len(boxes),
            widths,
            left=starts,
            height=0.8,
            color=colors,
            edgecolor="white" if not nvtx else "0.3",
            linewidth=0.3,
        )
        _labels(ax, boxes, y, t0, ms_per_pt, nvtx)
    ax.set_yticks(range(len(rows)), [label for label, _ in reversed(rows)], fontsize=7)
    ax.set_ylim(-0.6, len(rows) - 0.4)


def _draw_memory(ax, tl: Timeline, t0: float, span_ms: float) -> None:
    if tl.memory is None or tl.memory.empty:
        ax.text(span_ms / 2, 0.5, tl.memory_what, ha="center", va="center", fontsize=7)
        ax.set_yticks([])
        return
    mem = tl.memory
    big = mem["bytes"].max() >= 2**30
    unit, scale = ("GiB", 2**30) if big else ("MiB", 2**20)
    t = (mem["t_ns"] - t0) / 1e6
    end = tl.window[1] if tl.window else mem["t_ns"].max()
    ax.step(
        [*t, (end - t0) / 1e6],
        [*(mem["bytes"] / scale), mem["bytes"].iloc[-1] / scale],
        where="post",
        color="0.2",
        lw=1,
    )
    ax.set_ylabel(unit, fontsize=7)
    ax.tick_params(labelsize=7)
    ax.text(
        0.005,
        0.95,
        tl.memory_what,
        transform=ax.transAxes,
        ha="left",
        va="top",
        fontsize=6.5,
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
    )


def _extent(tl: Timeline) -> tuple[float, float]:
    if tl.window is not None:
        return tl.window
    starts = pd.concat([tl.ranges["start_ns"], tl.kernels["start_ns"]])
    ends = pd.concat([tl.ranges["end_ns"], tl.kernels["end_ns"]])
    return float(starts.min()), float(ends.max())


def panel_title(p: Panel) -> str:
    tl = p.timeline
    where = "Nsight Systems" if tl.source != TORCH else "torch.profiler trace (no nsys capture)"
    notes = "; ".join(tl.notes)
    return f"{p.title} — from {where}" + (f" ({notes})" if notes else "")


def draw(panels: list[Panel], path: Path, title: str) -> Path:
    """The panels stacked, one time scale; a placeholder saying why when none has data."""
    have = [p for p in panels if p.timeline is not None]
    if not have:
        reasons = "; ".join(f"{p.title}: {p.reason}" for p in panels)
        return empty_figure(path, f"{title}: no capture ({reasons})")
    spans = {id(p): _extent(p.timeline) for p in have}
    span_ms = max((b - a) / 1e6 for a, b in spans.values()) or 1.0
    heights = [0.3 * len(lanes(p.timeline)) + 1.6 if p.timeline else 0.5 for p in panels]
    total = sum(heights) + 0.9  # inches: the panels, the title above, the axis label below
    fig = plt.figure(figsize=(WIDTH_IN, total))
    outer = fig.add_gridspec(
        len(panels),
        1,
        height_ratios=heights,
        hspace=0.35,
        left=0.1,
        right=0.98,
        top=1 - 0.45 / total,
        bottom=0.45 / total,
    )
    fig.suptitle(title, fontsize=10)
    for p, cell in zip(panels, outer, strict=True):
        if p.timeline is None:
            ax = fig.add_subplot(cell)
            ax.axis("off")
            ax.text(0.5, 0.5, f"{p.title}: {p.reason}", ha="center", va="center", fontsize=8)
            continue
        t0 = spans[id(p)][0]
        n = len(lanes(p.timeline))
        inner = cell.subgridspec(2, 1, height_ratios=[0.3 * n + 0.3, 0.8], hspace=0.08)
        ax = fig.add_subplot(inner[0])
        ax.set_xlim(0, span_ms)
        _draw_lanes(ax, p.timeline, t0, span_ms)
        ax.set_title(panel_title(p), fontsize=8, loc="left")
        ax.tick_params(labelbottom=False, labelsize=7)
        mem = fig.add_subplot(inner[1], sharex=ax)
        _draw_memory(mem, p.timeline, t0, span_ms)
        mem.tick_params(labelsize=7)
        mem.set_xlabel("time from the window's start (ms)", fontsize=7)
    return save(fig, path, tight=False)


def capture_path(results_dir: Path, stage: str, value) -> Path | None:
    """A row's `timeline` file: as written, else by its name under `<stage>/timelines/` of
    `results_dir` (a results folder moved since); None when neither exists."""
    if value is None or pd.isna(value) or not str(value).strip():
        return None
    path = Path(str(value))
    for candidate in (path, Path(results_dir) / stage / "timelines" / path.name):
        if candidate.exists():
            return candidate
    return None


def _spans_us(df: pd.DataFrame) -> list[tuple[float, float]]:
    return list(zip(df["start_ns"] / 1e3, df["end_ns"] / 1e3, strict=True))


def summary(tl: Timeline) -> str:
    """The panel in numbers: window, compute boxes, communication (its busy time and the share
    of it that ran while compute ran: the overlap the figure shows), memory range."""
    lo, hi = _extent(tl)
    comm = tl.communication
    what = "kernels" if tl.compute_what == "CUDA kernels" else "operators"
    text = f"{(hi - lo) / 1e6:.3g} ms window, {len(tl.compute)} compute {what}"
    if len(comm):  # none: a capture without collectives (one block) says nothing of them
        text += f", {len(comm)} {tl.comm_what.split(' (')[0]}"
        st = overlap_stats(_spans_us(comm), _spans_us(tl.compute))
        text += (
            f" busy {st['prof_comm_kernel_ms']:.3g} ms, {pct(st['prof_overlap_share'])} of it"
            " while compute ran"
        )
    if tl.memory is not None and len(tl.memory):
        m = tl.memory["bytes"]
        unit, scale = ("GiB", 2**30) if m.max() >= 2**30 else ("MiB", 2**20)
        text += f"; memory {m.iloc[0] / scale:.3g} → peak {m.max() / scale:.3g} {unit}"
    return text


def panel_from_rows(
    results_dir: Path, stage: str, rows: pd.DataFrame, title: str, window: str | None = None
) -> Panel:
    """The panel of the first of `rows` whose `timeline` file exists (a stage's profiled
    step), clipped to the ranges `window` names where given and present; else None with the
    rows' statuses, or that no step was profiled, as the reason."""
    from cs336_systems.profiling.nsys_timeline import clip, read, window_of

    if rows.empty:
        return Panel(title, None, "no such run in this results folder")
    for _, r in rows.iterrows():
        path = capture_path(results_dir, stage, r.get("timeline"))
        if path is None:
            continue
        tl = read(path)
        found = window_of(tl, window) if window else None
        if found is not None:
            tl = clip(tl, found)
            tl.notes.append(f"the {window} range of the profiled step")
        return Panel(title, tl)
    statuses = sorted(set(rows["status"].astype(str))) if "status" in rows else []
    bad = [s for s in statuses if s != "ok"]
    why = "; ".join(bad) if bad else f"no profiled step kept (the {stage} block's `profile` off?)"
    return Panel(title, None, why)


def describe(panels: list[Panel]) -> list[str]:
    """One line per panel for the report: its source and `summary`, or why it is missing."""
    return [
        f"{panel_title(p)}: {summary(p.timeline)}." if p.timeline else f"{p.title}: {p.reason}."
        for p in panels
    ]
