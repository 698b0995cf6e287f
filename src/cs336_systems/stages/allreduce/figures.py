"""The allreduce section's figures (analysis.py plots them): bus bandwidth and time per
all-reduce against the message size, one curve per world size (and buffers kind), one panel per
backend."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from cs336_systems.reporting.analysis import empty_figure, load, ok, save
from cs336_systems.stages.allreduce.rows import with_defaults


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = with_defaults(load(results_dir, "allreduce"))
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"allreduce_{n}.png" for n in ("bandwidth", "time")}
    d = ok(df) if len(df) else df
    if len(d) == 0:
        return [empty_figure(p, "no successful all-reduce points") for p in paths.values()]
    out = []
    for name, column, ylabel in (
        ("bandwidth", "busbw_gbps", "bus bandwidth (GB/s)"),
        ("time", "time_ms_median", "time per all-reduce (ms, median)"),
    ):
        backends = sorted(set(d["backend"]))
        fig, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 3.8), squeeze=False)
        for ax, backend in zip(axes[0], backends, strict=True):
            g = d[d["backend"] == backend]
            for (buffers, n), h in g.groupby(["buffers", "world_size"]):
                h = h.sort_values("size_mb")
                style = "-" if buffers == "default" else "--"
                label = f"n = {n}" + ("" if buffers == "default" else f", {buffers}")
                ax.plot(h["size_mb"], h[column], style, marker="o", label=label)
            ax.set_xscale("log")
            if name == "time":
                ax.set_yscale("log")
            ax.set_xlabel("message size (MiB, float32)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{backend} ({'GPU' if backend == 'nccl' else 'CPU'})")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        out.append(save(fig, paths[name]))
    return out
