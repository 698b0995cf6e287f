"""The memory section's answers in words, each computed from the rows it names.

Both editions (memory_profiling (b), (c), (e)): a peak split into measured parts that add up to
it, the mixed-precision comparison with autocast's weight copies apart, and the largest
allocations of the forward pass's snapshot. 2026: the grid with its checkpointed points
(``memory.csv``), and part (f) from the block CSV (``memory_blocks.csv``, see blocks.py).

The parts of a step's peak (MiB, the CUDA allocator's): what the step starts with that stays
(parameters, and for a training step AdamW's state; the previous step's gradients are freed by
`zero_grad` before forward), the activations autograd saved (its distinct storages; under bf16
autocast these include the bf16 copies of every weight, `analytic_weight_casts_mb`), the rest
held at the end of forward (the loss and its buffers, the allocator's rounding), and the rest, up
to the peak: in a training step the growth from the end of forward to the peak (the gradients
made by then, less the activations already freed, plus backward's scratch), in a forward the
transient tensors above what it saves (the largest layer's scores, autocast's cached weight
copies under checkpointing). Each part is a measured number; the last
two are differences of measured allocator levels, so the parts add up to the peak exactly.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.core import costs
from cs336_systems.core.checkpoint_plans import plan_for
from cs336_systems.model import VOCAB_SIZE
from cs336_systems.planning.edition import size_table
from cs336_systems.reporting.analysis import md_table, sort_sizes

MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}
PARTS = {
    "params_mb": "parameters",
    "optimizer_state_mb": "optimizer state",
    "activations_mb": "saved activations (excl. weight copies)",
    "weight_casts_mb": "bf16 weight copies (saved)",
    "other_at_forward_end_mb": "other at the end of forward",
    "growth_to_peak_mb": "the rest, up to the peak",
}


def peak_parts(d: pd.DataFrame) -> pd.DataFrame:
    """One row per point that ran on CUDA: its parts (PARTS) and the peak they add up to."""
    need = {"peak_allocated_mb", "forward_end_mb", "params_mb", "saved_activations_mb"}
    if not need <= set(d) or d["peak_allocated_mb"].isna().all():
        return pd.DataFrame()
    rows = []
    for _, r in d.dropna(subset=["peak_allocated_mb", "forward_end_mb"]).iterrows():
        opt = float(r.get("optimizer_state_mb", 0) or 0) if r["mode"] == "train_step" else 0.0
        # autocast's bf16 weight copies are saved tensors only where the blocks are not
        # checkpointed (a checkpointed block's copies are cached, then dropped, not saved)
        plain = str(r.get("checkpoint", "none")) in ("none", "nan")
        casts = float(r.get("analytic_weight_casts_mb", 0) or 0)
        casts = (
            min(casts, float(r["saved_activations_mb"]))
            if plain and r["precision"] != "fp32"
            else 0.0
        )
        # a forward's end is its peak's baseline; the forward's growth is what it saved
        held = r["params_mb"] + opt + r["saved_activations_mb"]
        end = (
            r["forward_end_mb"]
            if r["mode"] != "forward"
            else r["baseline_mb"] + r["saved_activations_mb"]
        )
        rows.append(
            {
                "size": r["size"],
                "context_length": r["context_length"],
                "mode": MODE_LABEL.get(r["mode"], r["mode"]),
                "precision": r["precision"],
                "checkpoint": r.get("checkpoint", "none"),
                "params_mb": r["params_mb"],
                "optimizer_state_mb": opt,
                "activations_mb": r["saved_activations_mb"] - casts,
                "weight_casts_mb": casts,
                "other_at_forward_end_mb": end - held,
                "growth_to_peak_mb": r["peak_allocated_mb"] - end,
                "peak_allocated_mb": r["peak_allocated_mb"],
            }
        )
    return sort_sizes(pd.DataFrame(rows), "context_length").reset_index(drop=True)


def parts_table(parts: pd.DataFrame) -> str:
    if parts.empty:
        return ""
    t = parts.rename(columns={**PARTS, "peak_allocated_mb": "= peak allocated"})
    return md_table(t, 0)


def parts_sentence(parts: pd.DataFrame) -> str:
    """The largest training step's peak in words, each part with its share."""
    t = parts[parts["mode"] == "train step"]
    if t.empty:
        t = parts
    plain = t[t["checkpoint"].astype(str).isin(["none", "nan"])]
    t = plain if len(plain) else t
    if t.empty:
        return ""
    r = t.sort_values(["context_length", "peak_allocated_mb"]).iloc[-1]
    items = [
        f"{name} {r[col]:,.0f}"
        for col, name in PARTS.items()
        if abs(r[col]) >= 0.5 or col == "growth_to_peak_mb"
    ]
    ck = f", checkpointing {r['checkpoint']}" if str(r["checkpoint"]) not in ("none", "nan") else ""
    return (
        f"{r['size']}, context {r['context_length']}, {r['mode']}, {r['precision']}{ck}: "
        + " + ".join(items)
        + f" = {r['peak_allocated_mb']:,.0f} MiB, the peak. The previous step's gradients are "
        "not a part: `zero_grad` frees them before forward, and the ones backward has made "
        "by the peak are inside its growth (net of the activations it has freed by then)."
    )


def precision_without_casts(d: pd.DataFrame) -> str:
    """bf16 over fp32 saved activations, with and without autocast's saved weight copies."""
    if "analytic_weight_casts_mb" not in d:
        return ""
    keys = ["size", "context_length", "mode"]
    a = d[d["precision"] == "fp32"].set_index(keys)["saved_activations_mb"]
    bf = d[d["precision"] == "bf16"].set_index(keys)
    both = pd.concat(
        {"fp32": a, "bf16": bf["saved_activations_mb"], "casts": bf["analytic_weight_casts_mb"]},
        axis=1,
    ).dropna()
    if both.empty:
        return ""
    whole = (both["bf16"] / both["fp32"]).median()
    bare = ((both["bf16"] - both["casts"]) / both["fp32"]).median()
    share = (both["casts"] / both["bf16"]).median()
    return (
        f"bf16 autocast saves {whole:.2f}× the fp32 activation bytes (median), but "
        f"{share:.0%} of what it saves are the bf16 copies of the weights that autocast casts "
        f"for each matmul and autograd keeps for backward ({both['casts'].iloc[0]:,.0f} MiB, "
        f"the same at every context); without them it saves {bare:.2f}× the fp32 bytes: the "
        "matmul inputs are halved, while the residual stream, the norms and (on CUDA) the "
        "softmax probabilities stay fp32."
    )


def forward_allocations(allocs: pd.DataFrame) -> tuple[str, str]:
    """memory_profiling (e): the largest allocations of the forward pass's snapshot, at each
    context and precision (a context that ran only with checkpointing says so), and where they
    come from. (sentence, table)."""
    if allocs.empty or "mode" not in allocs:
        return "", ""
    a = allocs[(allocs["status"] == "ok") & (allocs["mode"] == "forward")]
    if a.empty:
        return "", ""
    a = a.assign(checkpoint=a["checkpoint"].fillna("none") if "checkpoint" in a else "none")
    rows, sentences = [], []
    for (ctx, prec, ck), g in a.groupby(["context_length", "precision", "checkpoint"]):
        g = g.sort_values("rank")
        top = g.iloc[0]
        same = int((g["size_mb"] == top["size_mb"]).sum())
        tensor = str(top.get("likely_tensor", "")) if pd.notna(top.get("likely_tensor")) else ""
        rows.append(
            {
                "size": top["size"],
                "context_length": int(ctx),
                "precision": prec,
                "checkpoint": ck,
                "largest (MiB)": top["size_mb"],
                "of that size in the top 10": same,
                "likely tensor": tensor or "–",
                "allocated at": top["frames"],
            }
        )
    t = pd.DataFrame(rows)
    fp = t[t["precision"] == "fp32"] if (t["precision"] == "fp32").any() else t
    for _, r in fp.iterrows():
        ck = (
            f" (run with checkpointing {r['checkpoint']}: without it this forward does not fit)"
            if str(r["checkpoint"]) not in ("none", "nan")
            else ""
        )
        sentences.append(
            f"at context {r['context_length']}{ck} the largest are {r['largest (MiB)']:,.0f} MiB "
            f"({r['of that size in the top 10']} of the ten largest), "
            + (f"the {r['likely tensor']}, " if r["likely tensor"] != "–" else "")
            + f"allocated at {r['allocated at']}"
        )
    bf = t[t["precision"] == "bf16"]
    extra = ""
    if len(bf) and len(fp) and fp is not bf:
        b = bf.iloc[0]
        extra = (
            f" Under bf16 autocast the largest at context {b['context_length']} are "
            f"{b['largest (MiB)']:,.0f} MiB: "
            + (f"the {b['likely tensor']}" if b["likely tensor"] != "–" else "see the table")
            + "."
        )
    first = fp.iloc[0]
    text = (
        f"In the forward pass's snapshot of {first['size']} ({first['precision']}): "
        + "; ".join(sentences)
        + "."
        + extra
    )
    return text, md_table(sort_sizes(t, "context_length"), 1)


def grid_counts(df: pd.DataFrame) -> str:
    """'12 points: 4 ran without checkpointing, 4 skipped (...), 4 ran with checkpointing'."""
    ck = df.get("checkpoint", pd.Series("none", index=df.index)).fillna("none")
    status = df["status"].astype(str)
    parts = []
    plain_ok = int(((ck == "none") & (status == "ok")).sum())
    parts.append(f"{plain_ok} ran without checkpointing")
    bad = df[status != "ok"]
    for kind, g in bad.groupby(status[status != "ok"].str.split(":").str[0]):
        parts.append(f"{len(g)} {kind}")
    ck_ok = int(((ck != "none") & (status == "ok")).sum())
    if (ck != "none").any():
        parts.append(f"{ck_ok} ran with one level of checkpointing")
    return f"{len(df)} points: " + ", ".join(parts)


# ---- 2026: the checkpointed grid and part (f) ---------------------------------------------

MiB = 2**20
GRID_MODE_LABEL = {
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
            f"{r['size']}, context {r['context_length']}, {GRID_MODE_LABEL.get(r['mode'], r['mode'])}, "
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


def edition_2026(df: pd.DataFrame, blocks: pd.DataFrame) -> dict:
    """The 2026 answers: the checkpointed points beside the plain ones, and part (f)."""
    s = {"checkpoint_sentences": checkpoint_sentences(df), "grid_table": grid_table(df)}
    s.update(block_answers(blocks))
    return s
