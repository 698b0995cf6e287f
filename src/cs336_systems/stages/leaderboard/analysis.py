"""The leaderboard section: every number and sentence from leaderboard.csv, and the figure of
one profiled step's breakdown per (config, variant). rows.py holds the rows and tables as the
report reads them, answers.py the sentences, figures.py the figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import failed_points, md_table, plot_main, ran
from cs336_systems.stages.leaderboard import answers
from cs336_systems.stages.leaderboard.figures import draw
from cs336_systems.stages.leaderboard.rows import (
    ablation_table,
    breakdown_table,
    breakdown_unsound,
    load_rows,
    results_table,
    run_label,
)


def _overview(df: pd.DataFrame, d: pd.DataFrame) -> dict:
    """The configuration, how many rows ran, those that did not with the commands that run
    them, and Q37."""
    first = df.iloc[0]
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    return {
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
        "q37": answers.q37(df),
    }


def _breakdown(r: pd.Series, results_dir: Path) -> dict:
    """The engine row `r`'s profiled step (withheld where unsound), its top kernels, the
    optimizer's kernels against their byte floor, and the engine's measured choices."""
    table, off = breakdown_table(r)
    ctx: dict = {}
    if breakdown_unsound(r):
        table, off = pd.DataFrame(), []
        ctx["breakdown_unsound"] = answers.breakdown_withheld(r)
    ctx["breakdown_run"] = run_label(r)
    ctx["breakdown_table"] = md_table(table) if len(table) else ""
    ctx["breakdown_off"] = off
    ctx["top_kernels"] = str(r.get("breakdown_top_kernels", "") or "")
    if ctx["top_kernels"] == "nan":
        ctx["top_kernels"] = ""
    ceilings = Path(results_dir) / "ceilings.csv"
    ceil = pd.read_csv(ceilings) if ceilings.exists() else pd.DataFrame()
    ctx["optimizer_floor"] = "" if breakdown_unsound(r) else answers.optimizer_floor(r, ceil)
    ctx["choices"] = answers.choices(r)
    return ctx


def _runs(df: pd.DataFrame, d: pd.DataFrame, results_dir: Path) -> dict:
    """The rows that ran (`d`): their table, the engine's breakdown, and the ablation."""
    if not len(d):
        return {}
    ctx = {
        "results_table": md_table(results_table(d)),
        "device_time": bool((d["backend"] == "nccl").any()),
    }
    full = d[(d["config"].isin(["full", "reduced"])) & (d["variant"] == "engine")]
    if len(full):
        ctx.update(_breakdown(full.iloc[0], results_dir))
    abl, buys = ablation_table(df)
    ctx["ablation_table"] = md_table(abl) if len(abl) else ""
    ctx["ablation_buys"] = buys
    return ctx


def context(results_dir: Path) -> dict:
    df = load_rows(results_dir)
    if len(df) == 0:
        return {"available": False}
    d = ran(df)
    ctx = {**_overview(df, d), **_runs(df, d, results_dir)}
    for key in ("breakdown_unsound", "breakdown_table", "top_kernels", "optimizer_floor"):
        ctx.setdefault(key, "")
    ctx.setdefault("choices", [])
    ctx.setdefault("breakdown_off", [])
    return ctx


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """Rank by rank, the engine's profiled step on its timeline (stages/leaderboard/figures.py):
    the compute parts, exposed communication and idle time (GPU) or the host's rest (CPU),
    adding up to the step."""
    return draw(results_dir, fig_dir)


if __name__ == "__main__":
    plot_main(plot)
