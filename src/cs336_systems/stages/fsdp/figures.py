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
    out = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    held = (
        ("params_mb", "parameters"),
        ("grads_mb", "gradients"),
        ("optimizer_state_mb", "optimizer state"),
        ("gathered_peak_mb", "gathered weights (peak)"),
    )
    stacked_bars(axes[0], labels, d, held, fill=0)
    a = analytic(df)
    if len(a):
        axes[0].plot(list(a["run"]), a["analytic (MiB)"], "k_", ms=30, mew=2, label="analytic")
    axes[0].set_ylabel("MiB per rank (max over ranks)")
    axes[0].set_title("tensors each rank holds")
    axes[0].tick_params(axis="x", labelrotation=15)
    axes[0].legend(fontsize=7)
    peaks = [
        ("mem_init_peak_mb", "construction"),
        ("mem_forward_peak_mb", "forward"),
        ("mem_backward_peak_mb", "backward"),
        ("mem_step_peak_mb", "optimizer step"),
    ]
    if d["mem_step_peak_mb"].notna().any():
        x = np.arange(len(peaks))
        width = 0.8 / len(d)
        for i, r in enumerate(d.itertuples()):
            axes[1].bar(x + width * i, [getattr(r, c) for c, _ in peaks], width, label=labels[i])
        axes[1].set_xticks(x + 0.4 - width / 2, [name for _, name in peaks])
        axes[1].set_ylabel("peak allocated MiB (max over ranks)")
        axes[1].legend(fontsize=7)
    else:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, "allocator peaks are measured on CUDA only", ha="center")
    axes[1].set_title("peak memory by phase")
    out.append(save(fig, paths["memory"]))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    phases = (
        ("fwd_ms_mean", "forward"),
        ("bwd_ms_mean", "backward"),
        ("comm_ms_mean", "sync after backward"),
        ("opt_ms_mean", "optimizer step"),
    )
    stacked_bars(axes[0], labels, d, phases)
    axes[0].errorbar(labels, d["step_ms_mean"], yerr=d["step_ms_std"], fmt="k.", label="step")
    axes[0].set_ylabel("ms per step (slowest rank)")
    axes[0].set_title("time per training step")
    axes[0].tick_params(axis="x", labelrotation=15)
    axes[0].legend(fontsize=7)
    if "prof_all_gather_ms" in d:
        hidden = d["prof_all_gather_overlapped_ms"].fillna(0).to_numpy()
        total = d["prof_all_gather_ms"].fillna(0).to_numpy()
        axes[1].bar(labels, hidden, label="during compute")
        axes[1].bar(labels, total - hidden, bottom=hidden, label="exposed")
        axes[1].set_ylabel("all-gather ms in the profiled step")
        axes[1].legend(fontsize=7)
    axes[1].set_title("weight all-gathers: hidden behind compute or not")
    axes[1].tick_params(axis="x", labelrotation=15)
    out.append(save(fig, paths["time"]))
    return [*out, timeline]


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
