"""The page beside each kept memory snapshot: its "Active Memory Timeline" as memory_viz draws it
(memory_snapshot.py's `stack_bands`, the figure's own computation) as inline SVG, a band per
block whose tooltip gives its size, phase, times and the top frames of its allocation, the
largest numbered, and a table of the largest allocations. One self-contained HTML file that
fetches nothing (no script, style, font or image from anywhere), so it opens offline; it needs
no JavaScript."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cs336_systems.profiling.memory_snapshot import (
    LABELLED,
    PHASE_COLORS,
    PHASE_NAMES,
    _band_polygon,
    _bottom_at,
    _trace,
    active_timeline,
    largest_bands,
    phase_times,
    size_text,
    stack_bands,
    user_frames,
)

# blocks drawn one band each on the page (the largest), the rest summed in grey as the figure
# does (it draws MAX_DRAWN): 10,000 blocks of random lifetimes make a 260 KB page, 1,000 drawn
# 640 KB
PAGE_MAX_DRAWN = 500
# rows of the table of the largest allocations
TABLE_ROWS = 20
# the SVG's user units: the plot box and the phase strip above it
WIDTH, HEIGHT = 1000, 500
LEFT, RIGHT, TOP, BOTTOM = 80, 985, 44, 450
STRIP = (18, 38)
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
TAB20 = (
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#ffbb78",
    "#2ca02c",
    "#98df8a",
    "#d62728",
    "#ff9896",
    "#9467bd",
    "#c5b0d5",
    "#8c564b",
    "#c49c94",
    "#e377c2",
    "#f7b6d2",
    "#7f7f7f",
    "#c7c7c7",
    "#bcbd22",
    "#dbdb8d",
    "#17becf",
    "#9edae5",
)  # fmt: skip  (matplotlib's tab20, the figure's colours)
STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
svg{width:100%;max-width:1200px;height:auto;display:block}
svg text{font:11px sans-serif}
polygon.band:hover,polygon.band:target{stroke:#000;stroke-width:1.5}
table{border-collapse:collapse;margin-top:1em}
td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top;text-align:left}
td.num{text-align:right}
.swatch{display:inline-block;width:1em;height:1em;vertical-align:middle;margin-right:.3em}"""


@dataclass(frozen=True)
class _Axes:
    """The plot box's mapping of the trace's axis and of bytes to SVG units."""

    x0: float
    x1: float
    top_bytes: float
    unit: tuple[str, int]

    def px(self, x):
        span = max(self.x1 - self.x0, 1e-12)
        return LEFT + (np.asarray(x, dtype=np.float64) - self.x0) / span * (RIGHT - LEFT)

    def py(self, nbytes):
        frac = np.asarray(nbytes, dtype=np.float64) / max(self.top_bytes, 1)
        return BOTTOM - frac * (BOTTOM - TOP)


def _points(xs: np.ndarray, ys: np.ndarray) -> str:
    """An SVG `points` list in whole units (a unit is about a pixel): repeated vertices dropped,
    and a vertex between two on one horizontal or vertical line (a drop of less than a unit)."""
    pts = list(zip(np.round(xs).tolist(), np.round(ys).tolist(), strict=True))
    out: list[tuple[float, float]] = []
    for p in pts:
        if out and out[-1] == p:
            continue
        if len(out) >= 2 and (out[-2][0] == out[-1][0] == p[0] or out[-2][1] == out[-1][1] == p[1]):
            out[-1] = p
        else:
            out.append(p)
    return " ".join(f"{x:g},{y:g}" for x, y in out)


def _ticks(lo: float, hi: float) -> list[float]:
    from matplotlib.ticker import MaxNLocator

    return [float(t) for t in MaxNLocator(nbins=6).tick_values(lo, hi) if lo <= t <= hi * 1.0001]


def _frame_lines(frames: list[dict] | None, k: int = 3) -> list[str]:
    """The allocation's top frames: our code's (`user_frames`), else the innermost ones, else
    a note that the stack has no Python frame."""
    if not frames:
        return ["no Python frames (autograd engine, C++)"]
    lines = user_frames(frames, k)
    if lines:
        return lines
    return [
        f"{str(fr.get('filename', '?')).rsplit('/', 1)[-1]}:{fr.get('line', '?')} "
        f"{fr.get('name', '?')}"
        for fr in frames[:k]
    ]


def _when(x: float, xlabel: str) -> str:
    return f"{x:,.4g} ms" if xlabel.startswith("time") else f"event {x:,.0f}"


def _describe(b: dict, bands: dict, phases) -> dict:
    """A block's size, phase, allocation and free times, and top frames, as words."""
    x, xlabel = bands["x"], bands["xlabel"]
    made = b["event"] >= 0
    return {
        "size": size_text(b["size"]),
        "phase": PHASE_NAMES.get(str(phases[b["event"]]), "?") if made else "before the trace",
        "alloc": _when(float(x[b["event"]]), xlabel) if made else "before the trace",
        "free": "live at the end" if b.get("live") else _when(float(b["xs"][-1]), xlabel),
        "frames": _frame_lines(b["frames"]) if made else ["allocated before the trace"],
    }


def _band_svg(b: dict, ax: _Axes, color: str, words: dict) -> str:
    poly = _band_polygon(b, 1)
    title = (
        f"{words['size']} ({b['size']:,} bytes), {words['phase']}\n"
        f"allocated: {words['alloc']}; freed: {words['free']}\n" + "\n".join(words["frames"])
    )
    return (
        f'<polygon class="band" id="block-{b["element"]}" fill="{color}" '
        f'points="{_points(ax.px(poly[:, 0]), ax.py(poly[:, 1]))}">'
        f"<title>{html.escape(title)}</title></polygon>"
    )


def _summary_svg(bands: dict, ax: _Axes) -> str:
    """The blocks past PAGE_MAX_DRAWN, summed in one grey band on top (a step after each
    event)."""
    sx, sb, ss = bands["summary"]
    if not len(ss) or ss.max() <= 0:
        return ""
    xs = np.r_[np.repeat(sx, 2)[1:], bands["end"]]
    bottom, top = np.repeat(sb, 2), np.repeat(sb + ss, 2)
    pts = _points(ax.px(np.r_[xs, xs[::-1]]), ax.py(np.r_[bottom, top[::-1]]))
    n = bands["summarized"]
    return (
        f'<polygon class="summed" fill="#999999" points="{pts}">'
        f"<title>{n:,} smaller blocks, summed</title></polygon>"
    )


def _numbers_svg(largest: list[dict], ax: _Axes) -> str:
    """The largest blocks numbered on their bands, each at the first point along its life (its
    middle first) clear of the numbers placed; a number that fits nowhere is left off."""
    placed: list[tuple[float, float]] = []
    out = []
    for rank, b in enumerate(largest[:LABELLED], start=1):
        x0, x1 = b["xs"][0], b["xs"][-1]
        for frac in (0.5, 0.3, 0.7, 0.15, 0.85, 0.05, 0.95):
            x = x0 + frac * (x1 - x0)
            u = float(ax.px(x))
            v = float(ax.py(_bottom_at(b, x) + b["size"] / 2))
            if all(abs(u - pu) > 16 or abs(v - pv) > 16 for pu, pv in placed):
                placed.append((u, v))
                out.append(
                    f'<g class="number"><circle cx="{u:.1f}" cy="{v:.1f}" r="7" fill="#fff" '
                    f'stroke="#000" stroke-width=".7"/><text x="{u:.1f}" y="{v + 4:.1f}" '
                    f'text-anchor="middle" font-weight="bold">{rank}</text></g>'
                )
                break
    return "".join(out)


def _axes_svg(ax: _Axes, xlabel: str) -> str:
    """The frame, the grid and the ticks of both axes, their labels."""
    name, unit = ax.unit
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" '
           'fill="none" stroke="#444"/>']  # fmt: skip
    for t in _ticks(0, ax.top_bytes / unit):
        y = float(ax.py(t * unit))
        out.append(f'<line x1="{LEFT - 4}" x2="{RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in _ticks(ax.x0, ax.x1):
        x = float(ax.px(t))
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{BOTTOM}" y2="{BOTTOM + 4}" stroke="#444"/>'
        )
        out.append(f'<text x="{x:.1f}" y="{BOTTOM + 17}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{(LEFT + RIGHT) / 2}" y="{BOTTOM + 38}" text-anchor="middle">'
               f"{html.escape(xlabel)}</text>")  # fmt: skip
    out.append(f'<text transform="translate(18 {(TOP + BOTTOM) / 2}) rotate(-90)" '
               f'text-anchor="middle">active memory ({name})</text>')  # fmt: skip
    return "".join(out)


def _phases_svg(spans, ax: _Axes) -> str:
    """The phases as a strip above the plot with their real width, named where wide enough."""
    out = []
    for phase, a, b in spans:
        u0, u1 = float(ax.px(a)), float(ax.px(b))
        name = html.escape(PHASE_NAMES.get(phase, phase))
        out.append(
            f'<rect x="{u0:.1f}" y="{STRIP[0]}" width="{max(u1 - u0, 1):.1f}" '
            f'height="{STRIP[1] - STRIP[0]}" fill="{PHASE_COLORS.get(phase, "#cccccc")}">'
            f"<title>{name}</title></rect>"
        )
        if u1 - u0 > 8 * len(name):
            out.append(f'<text x="{(u0 + u1) / 2:.1f}" y="{STRIP[1] - 6}" '
                       f'text-anchor="middle">{name}</text>')  # fmt: skip
    return "".join(out)


def _unit(top_bytes: float) -> tuple[str, int]:
    return next(((n, u) for n, u in UNITS if top_bytes >= u), UNITS[-1])


def timeline_svg(snapshot: dict, device: int | None = None) -> tuple[str, dict]:
    """The Active Memory Timeline as one inline `<svg>` (a band per drawn block, the summed
    ones in grey, the largest numbered, the phases above) and what the page says beside it:
    {bands, largest, words (per drawn element), spans, unit}."""
    trace = _trace(snapshot, device)
    bands = stack_bands(snapshot, device, max_drawn=PAGE_MAX_DRAWN)
    phases = active_timeline(snapshot, device)["phase"].to_numpy()
    sx, sb, ss = bands["summary"]
    top = float((sb + ss).max()) if len(sb) else 0.0
    top = max(top, max((float(max(b["ys"])) + b["size"] for b in bands["bands"]), default=0))
    x = bands["x"]
    ax = _Axes(float(x[0]) if len(x) else 0.0, max(float(bands["end"]), 1e-9), top * 1.05 or 1,
               _unit(top))  # fmt: skip
    spans = phase_times(active_timeline(snapshot, device), x) if len(trace) else []
    if all(p == "before" for p, _, _ in spans):  # no phase marker in the trace: none drawn
        spans = []
    words = {b["element"]: _describe(b, bands, phases) for b in bands["bands"]}
    parts = [
        _band_svg(b, ax, TAB20[b["element"] % 20], words[b["element"]]) for b in bands["bands"]
    ]
    largest = largest_bands(bands, trace, TABLE_ROWS) if len(trace) else []
    svg = (
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="active memory timeline">'
        f"{_phases_svg(spans, ax)}{_axes_svg(ax, bands['xlabel'])}"
        f'<g class="bands">{"".join(parts)}{_summary_svg(bands, ax)}</g>'
        f"{_numbers_svg(largest, ax)}</svg>"
    )
    return svg, {"bands": bands, "largest": largest, "words": words, "spans": spans}


def _table_html(drawn: dict) -> str:
    """The largest allocations: size, phase, allocation and free times, top frames; a row links
    to its band (highlighted while it is the page's target)."""
    rows = []
    for rank, b in enumerate(drawn["largest"], start=1):
        w = drawn["words"][b["element"]]
        frames = "<br>".join(html.escape(f) for f in w["frames"])
        rows.append(
            f'<tr><td class="num"><a href="#block-{b["element"]}">{rank}</a></td>'
            f'<td class="num">{w["size"]}</td><td>{html.escape(w["phase"])}</td>'
            f"<td>{w['alloc']}</td><td>{w['free']}</td><td><code>{frames}</code></td></tr>"
        )
    if not rows:
        return "<p>The trace allocated nothing.</p>"
    head = "<tr><th>#</th><th>size</th><th>phase</th><th>allocated</th><th>freed</th>"
    return f"<table>{head}<th>top frames</th></tr>{''.join(rows)}</table>"


def _legend_html(spans, xlabel: str) -> str:
    if not spans:
        return ""
    items = [
        f'<span class="swatch" style="background:{PHASE_COLORS.get(p, "#cccccc")}"></span>'
        f"{html.escape(PHASE_NAMES.get(p, p))}: {_when(b - a, xlabel)}"
        for p, a, b in spans
    ]
    return "<p>Phases, with their duration: " + "; ".join(items) + ".</p>"


def viz_page(snapshot: dict, title: str, pickle_name: str, device: int | None = None) -> str:
    """The page of `snapshot` as one self-contained HTML document."""
    svg, drawn = timeline_svg(snapshot, device)
    bands = drawn["bands"]
    n, summed = len(bands["bands"]), bands["summarized"]
    note = f"; the {summed:,} smallest summed in grey on top" if summed else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>
<h1>Active Memory Timeline: {html.escape(title)}</h1>
<p>Every block the CUDA caching allocator held during the step is a band, stacked in
allocation order ({n:,} blocks{note}): a freed block's band ends and those above it drop by its
size, as memory_viz draws it. Hover a band for its size, phase, times and the top frames of its
allocation; the {min(LABELLED, len(drawn["largest"]))} largest allocations are numbered.</p>
{svg}
{_legend_html(drawn["spans"], bands["xlabel"])}
<h2>The largest allocations</h2>
{_table_html(drawn)}
<p>This page fetches nothing and opens offline. For the full interactive viewer (allocator
state, segments, every frame), open the snapshot beside it, <code>{html.escape(pickle_name)}</code>,
in pytorch.org/memory_viz when online.</p>
</body></html>
"""


def write_viz_page(snapshot: dict, path: str | Path, title: str | None = None) -> Path:
    """`path` as the page of `snapshot` (`viz_page`), beside the snapshot's `.pickle` of the
    same name; returns `path`."""
    path = Path(path)
    page = viz_page(snapshot, title or path.stem, path.with_suffix(".pickle").name)
    path.write_text(page, encoding="utf-8")
    return path
