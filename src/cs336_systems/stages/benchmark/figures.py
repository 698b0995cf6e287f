"""The benchmark stage's figures: latency, backward over forward, warm-up, speedups, MFU. A line
runs over the sizes of one axis and breaks where a size has no trusted point (failed, skipped or
suspect): it never bridges a missing point."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import (
    FormatStrFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
)

from cs336_systems.reporting.analysis import (
    empty_figure,
    load,
    ok,
    on_axis,
    ordered_sizes,
    save,
    sort_sizes,
)
from cs336_systems.stages.benchmark.rows import (
    MODE_LABEL,
    backward_ratios,
    eager_naive,
    load_benchmark,
    speedups,
    warmup_summary,
)


def _size_axis(ax, sizes) -> None:
    """Model sizes in size order on a categorical x axis (matplotlib orders categories by first
    appearance, so lines with different sizes would scramble it)."""
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlim(-0.5, len(sizes) - 0.5)


def _line(ax, g, all_sizes, col, **kw):
    """One series over the size axis, NaN (a break) at the sizes it lacks."""
    g = sort_sizes(g)
    y = on_axis(list(g["size"]), list(g[col]), all_sizes)
    return ax.plot(range(len(all_sizes)), y, **kw), y


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load_benchmark(results_dir)
    w = load(results_dir, "benchmark_warmup")
    fig_dir = Path(fig_dir)
    names = ["latency", "bwd_fwd", "warmup", "speedups", "mfu"]
    paths = {n: fig_dir / f"benchmark_{n}.png" for n in names}
    d = ok(df) if len(df) else df
    if len(d) == 0:
        return [empty_figure(p, "no successful benchmark points") for p in paths.values()]
    all_sizes = ordered_sizes(d["size"])
    e = eager_naive(d)
    return [
        _latency_figure(e, all_sizes, paths["latency"]),
        _bwd_fwd_figure(e, all_sizes, paths["bwd_fwd"]),
        _warmup_figure(w, paths["warmup"]),
        _speedup_figure(d, all_sizes, paths["speedups"]),
        _mfu_figure(d, all_sizes, paths["mfu"]),
    ]


def _latency_figure(e, all_sizes, path: Path) -> Path:
    """Latency vs model size, one panel per mode, one line per context length (eager, naive);
    a size whose point failed or was flagged leaves a gap."""
    modes = [m for m in MODE_LABEL if m in set(e["mode"])]
    fig, axes = plt.subplots(
        1, max(len(modes), 1), figsize=(4.2 * max(len(modes), 1), 3.6), squeeze=False
    )
    for ax, mode in zip(axes[0], modes, strict=False):
        for (ctx, prec), g in e[e["mode"] == mode].groupby(["context_length", "precision"]):
            g = sort_sizes(g)
            y = on_axis(list(g["size"]), list(g["step_ms_mean"]), all_sizes)
            err = on_axis(list(g["size"]), list(g["step_ms_std"]), all_sizes)
            ax.errorbar(
                range(len(all_sizes)),
                y,
                yerr=err,
                marker="o",
                capsize=2,
                label=f"ctx {ctx} {prec}",
                linestyle="-" if prec == "fp32" else "--",
            )
        ax.set_yscale("log")
        _size_axis(ax, all_sizes)
        ax.set_title(MODE_LABEL[mode])
        ax.set_xlabel("model size")
        ax.set_ylabel("ms per step (mean ± std)")
    axes[0][-1].legend(fontsize=7)
    return save(fig, path)


def _bwd_fwd_figure(e, all_sizes, path: Path) -> Path:
    """Backward / forward ratio per size, one line per context and precision."""
    r = backward_ratios(e)
    if not len(r):
        return empty_figure(path, "no size with both a forward and a forward+backward point "
                            "that passed the checks")  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for (ctx, prec), g in r.groupby(["context_length", "precision"]):
        _line(ax, g, all_sizes, "ratio", marker="o", label=f"ctx {ctx} {prec}")
    ax.axhline(2.0, color="grey", lw=0.8, ls=":", label="2× (matmul FLOP ratio)")
    ax.legend(fontsize=7)
    _size_axis(ax, all_sizes)
    ax.set_ylabel("backward time / forward time")
    ax.set_xlabel("model size")
    return save(fig, path)


def _warmup_figure(w, path: Path) -> Path:
    """Warm-up effect: per-step times and their std for each warm-up count."""
    if not (len(w) and len(ok(w))):
        return empty_figure(path, "no warm-up sweep data")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r_ in ok(w).itertuples():
        times = json.loads(r_.warmup_times_ms) + json.loads(r_.step_times_ms)
        x = np.arange(1, len(times) + 1)
        a1.plot(x, times, marker=".", label=f"{r_.size}, {r_.warmup_steps} warm-up")
        a1.axvline(r_.warmup_steps + 0.5, color=a1.lines[-1].get_color(), lw=0.6, ls=":")
    a1.set_yscale("log")
    # whole steps from the first; the log axis labelled at 1, 2 and 5 of each decade in plain
    # numbers (its minor labels, "4×10^1", met the step ticks)
    a1.set_xlim(left=0.5)
    a1.xaxis.set_major_locator(MaxNLocator(integer=True))
    a1.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    a1.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    a1.yaxis.set_minor_formatter(NullFormatter())
    a1.set_xlabel("step (dotted: first measured step)")
    a1.set_ylabel("ms")
    a1.legend(fontsize=7)
    s = warmup_summary(w)
    for size, g in s.groupby("size"):
        a2.bar([f"{size}\n{k} w" for k in g["warmup_steps"]], g["std_ms"])
    a2.set_ylabel("std of measured steps (ms)")
    return save(fig, path)


def _mfu_figure(d, all_sizes, path: Path) -> Path:
    """MFU of the training step, best context per size, a gap where a size has none."""
    t = d[d["mode"] == "train_step"].dropna(subset=["mfu"]) if "mfu" in d else d.iloc[:0]
    if not len(t):
        return empty_figure(path, "no training step with an MFU that passed the checks")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for (prec, comp), g in t.groupby(["precision", "compile"]):
        best = g.loc[g.groupby("size")["mfu"].idxmax()]
        _line(ax, best.assign(mfu=100 * best["mfu"]), all_sizes, "mfu", marker="o",
              label=f"{prec} {comp}")  # fmt: skip
        if "mfu_datasheet" in best and best["mfu_datasheet"].notna().any():
            # the same points against the datasheet's peak: dashed, in the same colour
            sheet = best.assign(mfu_datasheet=100 * best["mfu_datasheet"])
            _line(ax, sheet, all_sizes, "mfu_datasheet", marker="x", ls="--",
                  color=ax.lines[-1].get_color(), label=f"{prec} {comp} (datasheet)")  # fmt: skip
    ax.legend(fontsize=7)
    _size_axis(ax, all_sizes)
    ax.set_ylabel("train-step MFU (%, best context)")
    ax.set_title("solid: against the measured ceiling; dashed: against the datasheet", fontsize=8)
    ax.set_xlabel("model size")
    return save(fig, path)


SPEEDUP_PANELS = (
    ("bf16 autocast over fp32 (eager, naive attention)", "precision", "fp32", "bf16"),
    ("torch.compile over eager (naive attention)", "compile", "eager", "compiled"),
)


def _speedup_figure(d, all_sizes, path: Path) -> Path:
    """Bars per size and mode, one panel per speedup (the pairs the report's Q3 tables hold);
    a size or mode without a trusted pair has no bar."""
    naive = d[d["attention"] == "naive"]
    panels = []
    for title, axis, base, fast in SPEEDUP_PANELS:
        sub = naive[naive["compile"] == "eager"] if axis == "precision" else naive
        sp = speedups(sub, axis, base, fast)
        if len(sp):
            panels.append((title, sp))
    if not panels:
        return empty_figure(path, "no pair of points to compare")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    modes = [m for m in MODE_LABEL if any(m in set(sp["mode"]) for _, sp in panels)]
    width = 0.8 / max(len(modes), 1)
    for ax, (title, sp) in zip(axes[0], panels, strict=True):
        sizes = [s for s in all_sizes if s in set(sp["size"])]
        for i, mode in enumerate(modes):
            g = sp[sp["mode"] == mode].groupby("size", as_index=False)["speedup"].median()
            y = on_axis(list(g["size"]), list(g["speedup"]), sizes)
            x = np.arange(len(sizes)) + (i - (len(modes) - 1) / 2) * width
            ax.bar(x, np.nan_to_num(y), width, label=MODE_LABEL[mode])
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("speedup (×)")
        ax.set_xlabel("model size")
        ax.legend(fontsize=7)
    return save(fig, path)
