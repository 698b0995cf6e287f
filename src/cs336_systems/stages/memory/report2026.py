"""The memory section's 2026 answers: the grid with its checkpointed points, and part (f).

Every sentence is computed from the rows: the points CSV (``memory.csv``: one row per size,
context, mode, precision and checkpointing strategy) and the block CSV (``memory_blocks.csv``:
part (f), see blocks.py).
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.core import costs
from cs336_systems.core.analysis import md_table, sort_sizes
from cs336_systems.core.checkpoint_plans import plan_for
from cs336_systems.core.edition import size_table
from cs336_systems.model import VOCAB_SIZE

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
        fwd_model = checkpointed_forward_mb(r)
        out.append(
            f"{r['size']}, context {r['context_length']}, {MODE_LABEL.get(r['mode'], r['mode'])}, "
            f"{r['precision']}: without checkpointing {before}; with {r['checkpoint']}"
            + (
                " (the one-level k whose peak core.costs.checkpoint_memory puts lowest)"
                if r.get("checkpoint_choice") == "best"
                else ""
            )
            + f" {_outcome(r)}"
            + (
                f" (the model of a forward under {r['checkpoint']}, what it saves: "
                f"{fwd_model:,.1f} MiB"
                if pd.notna(fwd_model)
                else " ("
            )
            + (
                f"{'; ' if pd.notna(fwd_model) else ''}the model's peak of saved activations, "
                f"reached inside backward as segments are recomputed: {model:,.1f} MiB)"
                if pd.notna(model) and r["mode"] != "forward"
                else ")"
            )
            + "."
        )
    return [x.replace(" ()", "") for x in out]


def checkpointed_forward_mb(r: pd.Series) -> float:
    """core.costs.checkpoint_memory's forward bytes (what a forward under the row's strategy
    saves: the segments' inputs and the head) for the row's model, in MiB; NaN where the row
    lacks what it needs."""
    try:
        spec = size_table(int(r["edition"]))[r["size"]]
        plan = plan_for(str(r["checkpoint"]), spec["num_layers"])
    except (KeyError, ValueError, TypeError):
        return float("nan")
    b, n, prec = int(r["batch_size"]), int(r["context_length"]), str(r["precision"])
    blk = costs.block_saved_bytes(
        b, n, spec["d_model"], spec["num_heads"], spec["d_ff"], prec, str(r.get("device", "cuda"))
    )
    head = costs.head_saved_bytes(b, n, spec["d_model"], VOCAB_SIZE, prec)
    # what autograd saves (as `saved_activations_mb` counts it): autocast's cached weight
    # copies are held until the forward ends but are not saved tensors
    fwd = costs.checkpoint_memory(plan, blk["total"], blk["input"], head, 0)
    return fwd["forward_bytes"] / MiB


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
            f"{shown} ({100 * t['top_share']:.1f}% together). " + grads_sentence(t, expect, verdict)
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


def grads_sentence(t: pd.Series, expect: float, verdict: str) -> str:
    """Part (f)'s calculation: the block's gradients from the allocator's changes (forward's
    growth, backward's change), against 4 bytes a parameter; the hooks' count beside it."""
    hooks = (
        f"(hooks on the parameters count {t['grad_bytes'] / MiB:,.1f} MiB made, 4 bytes × "
        f"{int(t['block_params']):,} parameters {verdict})"
    )
    g = t.get("grads_from_memory_bytes", float("nan"))
    if pd.isna(g):
        why = (
            "these rows have no allocator readings (they predate that measurement)"
            if str(t.get("device")) == "cuda"
            else "this run has none"
        )
        return (
            f"The gradients' size from the allocator's changes needs a CUDA device ({why}) "
            f"{hooks}: `snakemake --cores 1 report` on a GPU measures it."
        )
    saved = t["forward_alloc_bytes"] - t["output_bytes"]
    off = g / expect - 1
    return (
        f"From the allocator: forward adds {t['forward_alloc_bytes'] / MiB:,.1f} MiB (what the "
        f"block saves and its {t['output_bytes'] / MiB:,.1f} MiB output); backward changes "
        f"allocated memory by {t['backward_alloc_change_bytes'] / MiB:+,.1f} MiB while it frees "
        f"the {saved / MiB:,.1f} MiB saved and makes dx ({t['input_grad_bytes'] / MiB:,.1f} MiB), "
        f"so its parameter gradients take {t['backward_alloc_change_bytes'] / MiB:+,.1f} + "
        f"{saved / MiB:,.1f} − {t['input_grad_bytes'] / MiB:,.1f} = {g / MiB:,.1f} MiB, "
        f"{'as' if abs(off) < 0.02 else 'not as'} expected: {expect / MiB:,.1f} MiB, 4 bytes per "
        f"fp32 parameter ({off:+.1%}) {hooks}."
    )


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
