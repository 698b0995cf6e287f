"""The memory stage's figures: peak memory against context length, the activations (the analytic
model, what autograd saved, the allocator's growth), and a montage of the step's timelines (the
individual timelines are copied beside the report)."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.planning.log import get_logger
from cs336_systems.profiling.nsys_timeline import NSYS, clip, read, window_of
from cs336_systems.reporting.analysis import empty_figure, load, ok, on_axis, save
from cs336_systems.reporting.timelines import Panel, capture_path
from cs336_systems.reporting.timelines import draw as draw_timelines
from cs336_systems.stages.memory.rows import (
    MODE_LABEL,
    load_points,
    peak_column,
    timeline_choice,
    timeline_files,
)

log = get_logger(__name__)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load_points(results_dir)
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"memory_{n}.png" for n in ("peak", "activations", "timelines")}
    # part (f)'s timeline has rows of its own (memory_blocks.csv)
    block = _block_timeline_figure(results_dir, fig_dir / "memory_block_timeline.png")
    if df.empty or ok(df).empty:
        return [empty_figure(p, "no successful memory points") for p in paths.values()] + [block]
    d = ok(df)
    return [
        _peak_figure(df, d, paths["peak"]),
        _activations_figure(d, paths["activations"]),
        _timelines_figure(
            results_dir, ok(load(results_dir, "memory")), fig_dir, paths["timelines"]
        ),
        block,
    ]


def _peak_figure(df: pd.DataFrame, d: pd.DataFrame, path: Path) -> Path:
    """Peak memory against context length, one line per size, mode and precision; a grouped
    bar chart (each bar's value on it) where the grid has one context, where a line would be a
    dot. The legend sits outside the axes."""
    col = peak_column(df)
    contexts = sorted(set(df["context_length"]))
    ylabel = (
        "peak allocated" if col == "peak_allocated_mb" else "peak RSS growth in the step"
    ) + " (GiB)"
    if len(contexts) == 1:
        return _peak_bars(d, col, contexts[0], ylabel, path)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    # every context of the grid on the axis: a context whose point did not run is a gap
    for (size, mode, prec), g in d.groupby(["size", "mode", "precision"]):
        g = g.sort_values("context_length")
        ax.plot(
            contexts,
            on_axis(list(g["context_length"]), list(g[col] / 1024), contexts),
            marker="o",
            ls="-" if prec == "fp32" else "--",
            label=f"{size} {MODE_LABEL.get(mode, mode)} {prec}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    ax.set_xlabel("context length")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def _peak_bars(d: pd.DataFrame, col: str, context: int, ylabel: str, path: Path) -> Path:
    """The one context's peaks as bars: one group per mode, one bar per size and precision."""
    modes = [m for m in MODE_LABEL if m in set(d["mode"])]
    series = sorted({(s, p) for s, p in zip(d["size"], d["precision"], strict=True)})
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for j, (size, prec) in enumerate(series):
        g = d[(d["size"] == size) & (d["precision"] == prec)].set_index("mode")[col]
        vals = [g.get(m, float("nan")) / 1024 for m in modes]
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(modes))]
        bars = ax.bar(xs, vals, width=width * 0.95, label=f"{size} {prec}")
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
    ax.set_xticks(range(len(modes)), [MODE_LABEL[m] for m in modes], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(f"one context in this grid: {context}", fontsize=9)
    ax.margins(y=0.12)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def _activations_figure(d: pd.DataFrame, path: Path) -> Path:
    """Activations: the analytic model vs what autograd saved vs the allocator's growth over
    forward."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    # one curve per size and precision: a training step saves what its forward saves
    steps = d[~d["mode"].isin(["forward", "inference"])]
    for (size, prec), g in steps.groupby(["size", "precision"]):
        g = g.sort_values("context_length")
        line = ax.plot(
            g["context_length"], g["saved_activations_mb"], marker="o", label=f"{size} {prec} saved"
        )
        # an own model has no analytic curve (docs/own-model.md)
        if "analytic_activations_mb" in g and g["analytic_activations_mb"].notna().any():
            ax.plot(
                g["context_length"],
                g["analytic_activations_mb"],
                ls=":",
                marker="x",
                color=line[0].get_color(),
                label=f"{size} {prec} analytic",
            )
        if "forward_growth_mb" in g and g["forward_growth_mb"].notna().any():
            ax.plot(
                g["context_length"],
                g["forward_growth_mb"],
                ls="--",
                color=line[0].get_color(),
                alpha=0.6,
                label=f"{size} {prec} allocator growth",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length")
    ax.set_ylabel("activation memory (MiB)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def _timelines_figure(results_dir: Path, d: pd.DataFrame, fig_dir: Path, path: Path) -> Path:
    """The chosen timelines (rows.timeline_choice: the forward and the training step at each
    asked context) side by side; every timeline copied into `fig_dir` (PNG and PDF)."""
    timelines = timeline_files(results_dir)
    if not timelines:
        return empty_figure(path, "memory timelines need CUDA memory snapshots")
    for t in timelines:  # the individual timelines go next to the report too (and PDF)
        for f in (t, t.with_suffix(".pdf")):
            if f.exists():
                shutil.copy2(f, fig_dir / f.name)
    names = {f.name: f for f in timelines}
    picked = timeline_choice(d)
    chosen = [names.get(str(r["timeline_png"])) for r in picked]
    chosen = [c for c in chosen if c is not None] or timelines[:2]
    cols = min(len({r["mode"] for r in picked}) or 1, len(chosen))
    rows_n = -(-len(chosen) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(8 * cols, 5.2 * rows_n), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, t in zip(axes.flat, chosen, strict=False):
        ax.imshow(plt.imread(t))  # the PNG for the report
    save(fig, path)
    pdfs = [t.with_suffix(".pdf") for t in chosen]
    if all(f.exists() for f in pdfs):  # the PDF from the timelines' own PDFs: vector, not a raster
        join_pdfs(pdfs, path.with_suffix(".pdf"))
    return path


def join_pdfs(pdfs: list[Path], out: Path) -> Path:
    """The first pages of `pdfs` as the pages of one PDF, in order: vector drawings stay vector
    (the timelines' PDFs, drawn by profiling/memory_snapshot.py). Whole pages are copied, never
    parsed: a real timeline's page holds more drawing operators than a PDF library will merge
    onto another page. Without pypdf the composite `save` wrote (the PNGs, rasters) stays."""
    try:
        from pypdf import PdfReader, PdfWriter
    except ImportError:
        log.warning(
            "%s keeps the timelines as rasters: pypdf is not installed (each timeline's own "
            "vector PDF lies beside it)", out.name
        )  # fmt: skip
        return out
    writer = PdfWriter()
    for f in pdfs:
        writer.add_page(PdfReader(f).pages[0])
    with open(out, "wb") as fh:
        writer.write(fh)
    return out


# ---- part (f): one TransformerBlock's forward and backward on Nsight's timeline -----------------

# the ranges memory's blocks.py puts around the block's forward and backward
BLOCK_WINDOW = r"block\.(forward|backward)"


def block_timeline_choice(results_dir: Path) -> tuple[pd.Series | None, str]:
    """The part (f) capture to draw (an Nsight one first, fp32, the largest context), or None
    with why none can be drawn."""
    blocks = load(results_dir, "memory_blocks")
    if blocks.empty or "part" not in blocks:
        return None, "no part (f) rows (a 2026 question; this run has no block captures)"
    caps = blocks[blocks["part"] == "nsys_capture"].copy()
    if caps.empty:
        return None, "no block capture in this run (memory.nsys_contexts is empty)"
    caps["path"] = caps.get("timeline", pd.Series(index=caps.index, dtype=object)).map(
        lambda v: capture_path(results_dir, "memory", v)
    )
    have = caps[caps["path"].notna()]
    if have.empty:
        why = [
            f"nsys {r['status']}, torch.profiler {r.get('timeline_status', 'kept no file')}"
            for _, r in caps.iterrows()
        ]
        return None, "; ".join(sorted(set(why)))
    have = have.assign(
        nsys=have["timeline_source"] == NSYS, fp32=have["precision"] == "fp32"
    ).sort_values(["nsys", "fp32", "context_length"])
    return have.iloc[-1], ""


def block_timeline_panel(results_dir: Path) -> Panel:
    r, why = block_timeline_choice(results_dir)
    title = "one TransformerBlock, forward then backward"
    if r is None:
        return Panel(title, None, why)
    tl = read(r["path"])
    window = window_of(tl, BLOCK_WINDOW)
    if window is None and tl.window is None:
        return Panel(title, None, f"no block.forward/backward range in {r['path'].name}")
    tl = clip(tl, window) if window is not None else tl
    size = r.get("size", "")
    return Panel(f"{size} block, context {int(r['context_length'])}, {r['precision']}", tl)


def _block_timeline_figure(results_dir: Path, path: Path) -> Path:
    """Part (f)'s Nsight-style timeline of one block (reporting/timelines.py)."""
    panel = block_timeline_panel(results_dir)
    return draw_timelines([panel], path, "Memory (f): one TransformerBlock's forward and backward")
