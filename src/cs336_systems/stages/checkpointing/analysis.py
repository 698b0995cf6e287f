"""Report context and figures for the `checkpointing` stage (questions 29-31). rows.py holds
the tables, answers.py the sentences, figures.py the figure; each question's part of the context
is composed here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, md_table, own_model_note, plot_main
from cs336_systems.stages.checkpointing import answers
from cs336_systems.stages.checkpointing.figures import draw
from cs336_systems.stages.checkpointing.rows import (
    by_module,
    failed_table,
    is_cuda,
    saved_tables,
    saved_totals,
    strategy_table,
)

OWN_MODEL_SAYS = (
    "its repeated blocks are its largest nn.ModuleList; `every_<k>` and `sqrt` run k of them "
    "under one checkpoint call where each block feeds the next, each block alone otherwise; "
    "the nested and in-block strategies need the course's TransformerBlock (skipped rows), "
    "and no analytic model applies (its model columns are empty)."
)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return draw(results_dir, fig_dir)


def accounting_context(acc: pd.DataFrame) -> dict:
    """Q29: what one RMSNorm and one TransformerBlock save for backward, eager and compiled."""
    if len(acc) == 0:
        return {"available": False}
    totals = saved_totals(acc)
    first = acc.iloc[0]
    b, n, d = int(first["batch_size"]), int(first["context_length"]), int(first["d_model"])
    t = totals.set_index(["module", "compile"])
    return {
        "available": True,
        "shape": f"({b}, {n}, {d})",
        "size": first["size"],
        "heads": int(first["num_heads"]),
        "device": first["device"],
        "backend": ", ".join(sorted(set(acc["compile_backend"].dropna().astype(str)) - {""})),
        "totals": md_table(totals),
        "by_module": md_table(by_module(acc)),
        "failed": failed_table(acc),
        "sentences": answers.saved_sentences(acc, t),
        **saved_tables(acc, t),
    }


def strategies_context(results_dir: Path, df: pd.DataFrame) -> dict:
    """Q30-31: the strategies' peaks and step times, the nested ones against one level, the
    best block size, and the memory stage's same configurations."""
    first = df.iloc[0]
    return {
        "cuda": is_cuda(df),
        "setting": answers.setting(first),
        "num_layers": int(first["num_layers"]) if pd.notna(first["num_layers"]) else 0,
        "own_model_note": own_model_note(df, OWN_MODEL_SAYS),
        "table": md_table(strategy_table(df)),
        "nested": answers.nested_sentences(df),
        "best": [b for p in df["precision"].unique() if (b := answers.best_block_size(df, p))],
        "reconciled": answers.reconcile(df, load(results_dir, "memory")),
    }


def context(results_dir: Path) -> dict:
    df = load(results_dir, "checkpointing")
    acc = load(results_dir, "checkpointing_saved")
    out = {"accounting": accounting_context(acc), "available": len(df) > 0}
    out["sketch"] = answers.code_sketch()
    if len(df) == 0:
        return out
    out.update(strategies_context(results_dir, df))
    return out


if __name__ == "__main__":
    plot_main(plot)
