"""The memory section's accounting: a peak split into measured parts that add up to it, the
mixed-precision comparison with autocast's weight copies apart, and the largest allocations of
the forward pass's snapshot (memory_profiling (b), (c), (e)).

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

from cs336_systems.core.analysis import md_table, sort_sizes

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
