"""The fsdp section's figures: memory per rank and time per step (analysis.py plots them)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import empty_figure, load, ok, save, stacked_bars
from cs336_systems.reporting.timelines import Panel, panel_from_rows
from cs336_systems.reporting.timelines import draw as draw_timelines
from cs336_systems.stages.fsdp.rows import LABELS, analytic


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "fsdp")
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"fsdp_{n}.png" for n in ("memory", "time")}
    # fsdp_accounting (b): the profiled steps on a timeline (their own files)
    timeline = _timeline(results_dir, fig_dir / "fsdp_timeline.png")
    d = ok(df) if len(df) else pd.DataFrame()
    if len(d) == 0:
        why = "no successful FSDP runs" + (
            f" ({df['status'].iloc[0]})" if len(df) and "status" in df else ""
        )
        return [empty_figure(p, why) for p in paths.values()] + [timeline]
    labels = [LABELS.get(v, v) for v in d["variant"]]
    return [_memory(df, d, labels, paths["memory"]), _time(d, labels, paths["time"]), timeline]


# a legend right of its panel, clear of the bars and of every label whatever the panel's height
BESIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}


def _height(n: int) -> float:
    """A figure's height for `n` runs as horizontal bars: their labels never collide."""
    return 2.4 + 0.38 * n


def _memory(df: pd.DataFrame, d: pd.DataFrame, labels: list[str], path: Path) -> Path:
    """The tensors each rank holds (against the analytic count) and the allocator's peak by
    phase, one row per run."""
    fig, axes = plt.subplots(1, 2, figsize=(15, _height(len(d))))
    held = (
        ("params_mb", "parameters"),
        ("grads_mb", "gradients"),
        ("optimizer_state_mb", "optimizer state"),
        ("gathered_peak_mb", "gathered weights (peak)"),
    )
    stacked_bars(axes[0], labels, d, held, fill=0, horizontal=True)
    a = analytic(df)
    if len(a):
        axes[0].plot(a["analytic (MiB)"], list(a["run"]), "k|", ms=14, mew=2, label="analytic")
    axes[0].set_xlabel("MiB per rank (max over ranks)")
    axes[0].set_title("tensors each rank holds")
    axes[0].legend(fontsize=7, **BESIDE)
    peaks = [
        ("mem_init_peak_mb", "construction"),
        ("mem_forward_peak_mb", "forward"),
        ("mem_backward_peak_mb", "backward"),
        ("mem_step_peak_mb", "optimizer step"),
    ]
    if d["mem_step_peak_mb"].notna().any():
        y = np.arange(len(d))
        height = 0.8 / len(peaks)
        for i, (column, name) in enumerate(peaks):
            axes[1].barh(y + height * i, d[column], height, label=name)
        axes[1].set_yticks(y + 0.4 - height / 2, [""] * len(d))
        axes[1].invert_yaxis()
        axes[1].set_xlabel("peak allocated MiB (max over ranks)")
        axes[1].legend(fontsize=7, **BESIDE)
    else:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, "allocator peaks need a GPU (the CUDA allocator's)", ha="center")
    axes[1].set_title("peak memory by phase (runs as on the left)")
    fig.tight_layout(w_pad=4)  # the panels' end tick labels apart
    return save(fig, path, tight=False)


def _time(d: pd.DataFrame, labels: list[str], path: Path) -> Path:
    """Where a step's time goes per run, and the weight all-gathers hidden behind compute or
    not (one profiled step)."""
    fig, axes = plt.subplots(1, 2, figsize=(15, _height(len(d))), sharey=True)
    phases = (
        ("fwd_ms_mean", "forward"),
        ("bwd_ms_mean", "backward"),
        ("comm_ms_mean", "sync after backward"),
        ("opt_ms_mean", "optimizer step"),
    )
    stacked_bars(axes[0], labels, d, phases, horizontal=True)
    axes[0].errorbar(d["step_ms_mean"], labels, xerr=d["step_ms_std"], fmt="k.", label="step")
    axes[0].set_xlabel("ms per step (slowest rank)")
    axes[0].set_title("time per training step")
    axes[0].legend(fontsize=7, **BESIDE)
    if "prof_all_gather_ms" in d:
        hidden = d["prof_all_gather_overlapped_ms"].fillna(0).to_numpy()
        total = d["prof_all_gather_ms"].fillna(0).to_numpy()
        axes[1].barh(labels, hidden, label="during compute")
        axes[1].barh(labels, total - hidden, left=hidden, label="exposed")
        axes[1].set_xlabel("all-gather ms in the profiled step")
        axes[1].legend(fontsize=7, **BESIDE)
    axes[1].set_title("weight all-gathers: hidden behind compute or not")
    fig.tight_layout(w_pad=4)  # the panels' end tick labels apart
    return save(fig, path, tight=False)


# ---- fsdp_accounting (b): the all-gathers beside the forward's compute -------------------------

TIMELINE_RUNS = ("fsdp", "fsdp_bf16")


def timeline_panels(results_dir: Path) -> list[Panel]:
    """The forward of FSDP's profiled steps, fp32 and bf16 compute (measure.py keeps each
    step's window with its phases as ranges)."""
    df = load(results_dir, "fsdp")
    runs = df if len(df) and "variant" in df else pd.DataFrame(columns=["variant"])
    return [
        panel_from_rows(
            results_dir,
            "fsdp",
            runs[runs["variant"] == v],
            f"{LABELS.get(v, v)}: the forward of one profiled step",
            window="forward",
        )
        for v in TIMELINE_RUNS
    ]


def _timeline(results_dir: Path, path: Path) -> Path:
    return draw_timelines(
        timeline_panels(results_dir), path, "FSDP: weight all-gathers beside the forward's compute"
    )
