"""The memory section's 2026 answers: the grid with its checkpointed points, and part (f).

Every sentence is computed from the rows: the points CSV (``memory.csv``: one row per size,
context, mode, precision and checkpointing strategy) and the block CSV (``memory_blocks.csv``:
part (f), see blocks.py).
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.core.analysis import md_table, sort_sizes

MiB = 2**20
MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "training step",
}


def _peak(r: pd.Series) -> str:
    for col, what in (("peak_allocated_mb", "peak allocated"), ("rss_growth_mb", "RSS growth")):
        if col in r and pd.notna(r[col]):
            return f"{what} {r[col] + 0.0:,.0f} MiB"
    return "no peak recorded"


def _outcome(r: pd.Series) -> str:
    if r["status"] != "ok":
        return str(r["status"])
    return f"{_peak(r)}, saved for backward {r['saved_activations_mb']:,.1f} MiB"


def checkpoint_sentences(df: pd.DataFrame) -> list[str]:
    """For each point measured with checkpointing, the same point without, beside it."""
    if "checkpoint" not in df:
        return []
    keys = ["size", "context_length", "mode", "precision"]
    out = []
    ck = df[df["checkpoint"].fillna("none") != "none"]
    for _, r in sort_sizes(ck, "context_length").iterrows():
        plain = df[(df[keys] == r[keys]).all(axis=1) & (df["checkpoint"].fillna("none") == "none")]
        before = _outcome(plain.iloc[0]) if len(plain) else "not run"
        model = r.get("analytic_checkpoint_peak_mb")
        out.append(
            f"{r['size']}, context {r['context_length']}, {MODE_LABEL.get(r['mode'], r['mode'])}, "
            f"{r['precision']}: without checkpointing {before}; with {r['checkpoint']}"
            + (
                " (the one-level k whose peak core.costs.checkpoint_memory puts lowest)"
                if r.get("checkpoint_choice") == "best"
                else ""
            )
            + f" {_outcome(r)}"
            + (f" (model: {model:,.1f} MiB)" if pd.notna(model) else "")
            + "."
        )
    return out


def block_answers(blocks: pd.DataFrame) -> dict:
    """Part (f) per (context, precision): the top ops with shares, total, gradient bytes."""
    s: dict = {"block_sentences": [], "nsys_captures": []}
    if blocks.empty:
        return s
    ok = blocks[blocks["status"] == "ok"]
    tot = ok[ok["part"] == "block_total"]
    ops = ok[ok["part"] == "saved_by_op"]
    for _, t in tot.sort_values(["context_length", "precision"]).iterrows():
        at = (ops["context_length"] == t["context_length"]) & (ops["precision"] == t["precision"])
        top = ops[at].sort_values("rank")
        shown = ", ".join(f"`{r['op']}` {100 * r['share']:.1f}%" for _, r in top.iterrows())
        expect = 4 * t["block_params"]
        verdict = "exactly" if t["grad_bytes"] == expect else f"against {expect / MiB:,.1f} MiB"
        with_input = (t["bytes"] + t["input_bytes"]) / MiB
        s["block_sentences"].append(
            f"Context {int(t['context_length'])}, {t['precision']} ({t['device']}): one block "
            f"saves {t['bytes'] / MiB:,.1f} MiB for backward besides its input "
            f"({with_input:,.1f} MiB with it; core.costs.block_saved_bytes: "
            f"{t['analytic_bytes'] / MiB:,.1f} MiB) over {int(t['ops'])} ops; the five largest: "
            f"{shown} ({100 * t['top_share']:.1f}% together). Its parameter gradients in backward: "
            f"{t['grad_bytes'] / MiB:,.1f} MiB, 4 bytes × {int(t['block_params']):,} parameters "
            f"{verdict}"
            + (
                " (gradients take the fp32 parameters' dtype under autocast too)."
                if t["precision"] != "fp32" and verdict == "exactly"
                else "."
            )
        )
    table = top_table(ops)
    s["block_table"] = md_table(table, 3) if len(table) else ""
    cap = blocks[blocks["part"] == "nsys_capture"]
    for _, r in cap.iterrows():
        where = f": `{r['capture']}`" if r["status"] == "ok" else ""
        s["nsys_captures"].append(
            f"context {int(r['context_length'])}, {r['precision']}: {r['status']}{where}"
        )
    return s


def top_table(ops: pd.DataFrame) -> pd.DataFrame:
    if ops.empty:
        return ops
    t = ops[["context_length", "precision", "rank", "op", "bytes", "share"]].copy()
    t["MiB"] = t.pop("bytes") / MiB
    t["share %"] = 100 * t.pop("share")
    return t.sort_values(["context_length", "precision", "rank"]).reset_index(drop=True)


def grid_table(df: pd.DataFrame) -> str:
    cols = [
        "size",
        "context_length",
        "mode",
        "precision",
        "checkpoint",
        "status",
        "peak_allocated_mb",
        "rss_growth_mb",
        "saved_activations_mb",
        "analytic_need_gib",
    ]
    t = df[[c for c in cols if c in df]]
    return md_table(sort_sizes(t, "context_length").reset_index(drop=True), 1)


def context(df: pd.DataFrame, blocks: pd.DataFrame) -> dict:
    s = {"checkpoint_sentences": checkpoint_sentences(df), "grid_table": grid_table(df)}
    s.update(block_answers(blocks))
    return s
