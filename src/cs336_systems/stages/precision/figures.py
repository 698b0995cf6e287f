"""The precision section's figures: the accumulations' errors per device, and LayerNorm's
errors per input, dtype and quantity (analysis.py plots them)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import empty_figure, load, ok, save
from cs336_systems.stages.precision.rows import QUANTITY_LABEL


def _accumulation_figure(acc: pd.DataFrame, path: Path) -> Path:
    if acc.empty:
        return empty_figure(path, "no accumulation data")
    devices = sorted(acc["device"].unique())
    variants = list(dict.fromkeys(acc["variant"]))
    # horizontal bars: the variants' names read on the y axis, none crossing another or the
    # error axis's tick labels (slanted x labels did)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(variants) + 1.2))
    height = 0.8 / len(devices)
    for i, dev in enumerate(devices):
        a = acc[acc["device"] == dev].set_index("variant").reindex(variants)
        err = a["abs_error"].clip(lower=1e-16)
        ax.barh(np.arange(len(variants)) + i * height, err, height, label=dev)
    ax.set_yticks(np.arange(len(variants)) + height * (len(devices) - 1) / 2)
    ax.set_yticklabels(variants, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("|sum − 10|")
    ax.set_title("0.01 added 1000 times", fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, path)


def _layernorm_figure(ln: pd.DataFrame, path: Path) -> Path:
    if ln.empty:
        return empty_figure(path, "no LayerNorm data")
    d = ln[ln["device"] == sorted(ln["device"].unique())[-1]]
    cases = list(dict.fromkeys(zip(d["offset"], d["spread"], strict=True)))
    fig, axes = plt.subplots(1, len(cases), figsize=(3.4 * len(cases), 3.6), sharey=True)
    axes = np.atleast_1d(axes)
    quantities = list(QUANTITY_LABEL)
    dtypes = ["fp32", "bf16", "fp16"]
    width = 0.8 / len(dtypes)
    for ax, (off, spread) in zip(axes, cases, strict=True):
        c = d[(d["offset"] == off) & (d["spread"] == spread)]
        for j, dt in enumerate(dtypes):
            cd = c[c["dtype"] == dt].set_index("quantity").reindex(quantities)
            vals = cd["max_error"].fillna(1e3).clip(lower=1e-9)
            x = np.arange(len(quantities)) + j * width
            ax.bar(x, vals, width, label=dt)
            for xi, nf in zip(x, cd["nonfinite_fraction"], strict=True):
                if nf and nf > 0:
                    ax.text(xi, 2e3, "inf/nan", rotation=90, fontsize=6, ha="center")
        ax.set_xticks(np.arange(len(quantities)) + width)
        ax.set_xticklabels(["mean", "var", "var naive", "output"], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(1e-9, 1e6)
        ax.set_title(f"x ~ {off:g} + {spread:g}·N(0,1)", fontsize=9)
    axes[0].set_ylabel("max error vs fp64")
    axes[-1].legend(fontsize=8)
    return save(fig, path)


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    acc = ok(load(results_dir, "precision"))
    ln = ok(load(results_dir, "precision_layernorm"))
    fig_dir = Path(fig_dir)
    return [
        _accumulation_figure(acc, fig_dir / "precision_accumulation.png"),
        _layernorm_figure(ln, fig_dir / "precision_layernorm.png"),
    ]
