"""The leaderboard section: every number and sentence from leaderboard.csv, and the figure of
one profiled step's breakdown per (config, variant)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.core.analysis import (
    empty_figure,
    failed_points,
    fmt,
    load,
    mark_suspect,
    md_table,
    pct,
    plot_main,
    ran,
    save,
)
from cs336_systems.core.sanity import is_suspect
from cs336_systems.stages.leaderboard.measure import with_path_mfu

PARTS = ("attention", "matmul", "loss", "optimizer", "communication", "other")


def _label(r) -> str:
    return f"{r['config']} / {r['variant']} (W={int(r['world_size'])}, L={int(r['num_layers'])})"


def results_table(d: pd.DataFrame) -> pd.DataFrame:
    """Every run that ran; a rate the sanity checks doubt (core/sanity.py) carries the flag."""
    rows = []
    doubted = is_suspect(d, "rate")
    for i, r in d.iterrows():
        rows.append(
            {
                "run": _label(r),
                "checkpointing": r.get("checkpointing", ""),
                "step (s)": fmt(r["step_ms_median"] / 1e3, 3),
                "tokens/s": fmt(r["tokens_per_s"], 0),
                "TFLOP/s": fmt(r["tflops"], 1),
                "MFU": mark_suspect(pct(r["mfu"]), bool(doubted[i]))
                if pd.notna(r["mfu"])
                else "n/a (no bf16 ceiling)",
                "peak GB/rank": fmt(r["peak_mem_gb_per_rank"], 1),
                "setup (s)": fmt(r["setup_s"], 1),
                "benchmark (s)": fmt(r["benchmark_s"], 0),
                "10-min rule": "fits" if bool(r["fits_10_min"]) else "over",
            }
        )
    return pd.DataFrame(rows)


def breakdown_table(d: pd.DataFrame) -> pd.DataFrame:
    cols = [f"breakdown_{p}_ms" for p in PARTS]
    if not all(c in d for c in cols):
        return pd.DataFrame()
    out = []
    for _, r in d.iterrows():
        total = sum(float(r[c]) for c in cols)
        out.append({"run": _label(r), **{p: pct(float(r[c]) / total) for p, c in zip(PARTS, cols)}})
    return pd.DataFrame(out)


def q37(df: pd.DataFrame) -> str:
    d = ran(df)
    full = d[(d["config"] == "full") & (d["variant"] == "engine")]
    if not len(full):
        why = df[(df["config"] == "full") & (df["variant"] == "engine")]["status"]
        reason = why.iloc[0] if len(why) else "not run"
        return f"The full configuration's engine step was not measured here ({reason})."
    r = full.iloc[0]
    mfu = f", {pct(r['mfu'])} MFU" if pd.notna(r["mfu"]) else ""
    if bool(is_suspect(full, "rate").iloc[0]):
        mfu = f"; its MFU is left out: {r['sanity']}"
    rule = "within" if bool(r["fits_10_min"]) else "over"
    return (
        f"The engine's step takes {fmt(r['step_ms_median'] / 1e3, 3)} s on "
        f"{int(r['world_size'])} ranks ({fmt(r['tflops'], 1)} TFLOP/s{mfu}); the whole benchmark "
        f"from an empty process would take {fmt(r['benchmark_s'], 0)} s, {rule} the 10 minutes."
    )


def _load(results_dir: Path) -> pd.DataFrame:
    """leaderboard.csv with MFU against the peak of each row's matmul path (rows written before
    the path was recorded get it inferred: measure.py with_path_mfu)."""
    ceilings = Path(results_dir) / "ceilings.csv"
    return load(results_dir, "leaderboard", derive=lambda df: with_path_mfu(df, ceilings))


def context(results_dir: Path) -> dict:
    df = _load(results_dir)
    if len(df) == 0:
        return {"available": False}
    d = ran(df)
    first = df.iloc[0]
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    ctx: dict = {
        "available": True,
        "setup": (
            f"d_model {int(first['d_model'])}, d_ff {int(first['d_ff'])}, "
            f"{int(first['num_layers'])} layers, {int(first['num_heads'])} heads, context "
            f"{int(first['context_length'])}, vocab {int(first['vocab'])}, batch "
            f"{int(first['batch'])}, bf16, backend {first['backend']}"
        ),
        "n_points": len(df),
        "n_ok": len(d),
        "skipped_table": md_table(failed_points(df, ["config", "variant"]).drop_duplicates())
        if len(d) < len(df)
        else "",
        "commands": sorted(set(skipped["command"].dropna().astype(str))),
        "q37": q37(df),
    }
    if len(d):
        ctx["results_table"] = md_table(results_table(d))
        b = breakdown_table(d)
        ctx["breakdown_table"] = md_table(b) if len(b) else ""
        ctx["device_time"] = bool((d["backend"] == "nccl").any())
    return ctx


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = _load(results_dir)
    path = Path(fig_dir) / "leaderboard_breakdown.png"
    d = ran(df) if len(df) else pd.DataFrame()
    cols = [f"breakdown_{p}_ms" for p in PARTS]
    if len(d) == 0 or not all(c in d for c in cols):
        why = "no profiled leaderboard step" + (
            f" ({df['status'].iloc[0]})" if len(df) and "status" in df else ""
        )
        return [empty_figure(path, why)]
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [_label(r) for _, r in d.iterrows()]
    bottom = np.zeros(len(d))
    for p, c in zip(PARTS, cols):
        vals = d[c].fillna(0).to_numpy() / 1e3
        ax.barh(labels, vals, left=bottom, label=p)
        bottom += vals
    ax.set_xlabel("seconds in one profiled step (self time per kernel / operator)")
    ax.set_title("where a leaderboard step goes")
    ax.legend(fontsize=7)
    if not math.isfinite(float(bottom.max())):  # pragma: no cover - a profile without times
        ax.set_xlim(0, 1)
    return [save(fig, path)]


if __name__ == "__main__":
    plot_main(plot)
