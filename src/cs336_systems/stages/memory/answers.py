"""The memory section's answers in words, each computed from the rows it names (rows.py).

Both editions (memory_profiling (a)-(e), questions 13-17): each step's timeline phase by phase,
how the peak grows with context and the parts it splits into (rows.peak_parts: measured parts
that add up to it), bf16 autocast against fp32 with autocast's weight copies apart, the residual
stream and the activations against the analytic model, and the largest allocations of the
forward pass's snapshot. 2026: the grid with its checkpointed points (``memory.csv``), and part
(f) from the block CSV (``memory_blocks.csv``, see blocks.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import MEMORY_MODE_LABEL, plural, sig, sort_sizes
from cs336_systems.stages.memory.rows import (
    MODE_LABEL,
    PARTS,
    MiB,
    checkpointed_forward_mb,
    forward_allocation_rows,
    forward_allocations_table,
    peak_mb,
    saved_by_precision,
    saving,
)


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


def bf16_beside_fp32(d: pd.DataFrame, keys: list[str], column: str) -> pd.DataFrame:
    """Per point of `keys`: fp32's and bf16's `column`, and autocast's cached weight copies of
    the bf16 point (`casts`); points without both precisions left out."""
    a = d[d["precision"] == "fp32"].set_index(keys)[column]
    bf = d[d["precision"] == "bf16"].set_index(keys)
    return pd.concat(
        {"fp32": a, "bf16": bf[column], "casts": bf["analytic_weight_casts_mb"]}, axis=1
    ).dropna()


def precision_without_casts(d: pd.DataFrame) -> str:
    """bf16 over fp32 saved activations, with and without autocast's saved weight copies."""
    if "analytic_weight_casts_mb" not in d:
        return ""
    d = saving(d)
    both = bf16_beside_fp32(d, ["size", "context_length", "mode"], "saved_activations_mb")
    if both.empty:
        return ""
    whole = (both["bf16"] / both["fp32"]).median()
    bare = ((both["bf16"] - both["casts"]) / both["fp32"]).median()
    shares = both["casts"] / both["bf16"]
    over = "" if len(both) == 1 else f" (medians over {plural(len(both), 'point')})"
    contexts = both.index.get_level_values("context_length").nunique()
    size = f"{sig(both['casts'].iloc[0])} MiB" + (
        ", the same at every context" if contexts > 1 else ""
    )
    lo, hi = f"{shares.min():.0%}", f"{shares.max():.0%}"
    share = f"{shares.median():.0%}" + (f" (median; {lo}–{hi})" if lo != hi else "")
    return (
        f"bf16 autocast saves {whole:.2f}× the fp32 activation bytes{over}, but "
        f"{share} of what it saves are the bf16 copies of the weights that autocast casts "
        f"for each matmul and autograd keeps for backward ({size}); without them it saves "
        f"{bare:.2f}× the fp32 bytes: the matmul inputs are halved, while the residual stream, "
        "the norms and (on CUDA) the softmax probabilities stay fp32."
    )


def forward_allocations(allocs: pd.DataFrame) -> tuple[str, str]:
    """memory_profiling (e): the largest allocations of the forward pass's snapshot, at each
    context and precision (a context that ran only with checkpointing says so), and where they
    come from. (sentence, table)."""
    t = forward_allocation_rows(allocs)
    if t.empty:
        return "", ""
    sentences = []
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
    return text, forward_allocations_table(t)


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

GRID_MODE_LABEL = {**MEMORY_MODE_LABEL, "train_step": "training step"}


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


def block_sentence(t: pd.Series, top: pd.DataFrame) -> str:
    """Part (f) at one (context, precision) (`t`: its block_total row, `top`: its ops by rank):
    what the block saves, the five largest ops with their shares, and its gradients."""
    shown = ", ".join(f"`{r['op']}` {100 * r['share']:.1f}%" for _, r in top.iterrows())
    expect = 4 * t["block_params"]
    verdict = "exactly" if t["grad_bytes"] == expect else f"against {expect / MiB:,.1f} MiB"
    with_input = (t["bytes"] + t["input_bytes"]) / MiB
    return (
        f"Context {int(t['context_length'])}, {t['precision']} ({t['device']}): one block "
        f"saves {t['bytes'] / MiB:,.1f} MiB for backward besides its input "
        f"({with_input:,.1f} MiB with it; core.costs.block_saved_bytes: "
        f"{t['analytic_bytes'] / MiB:,.1f} MiB) over {int(t['ops'])} ops; the five largest: "
        f"{shown} ({100 * t['top_share']:.1f}% together). " + grads_sentence(t, expect, verdict)
    )


def nsys_capture_line(r: pd.Series) -> str:
    """Part (f)'s Nsight capture at one (context, precision): its status and where it is."""
    where = f": `{r['capture']}`" if r["status"] == "ok" else ""
    return f"context {int(r['context_length'])}, {r['precision']}: {r['status']}{where}"


def no_allocator_why(t: pd.Series) -> str:
    """Why part (f)'s block row `t` has no allocator readings of its gradients."""
    if str(t.get("device")) == "cuda":
        return "these rows have no allocator readings (they predate that measurement)"
    return "this run has none"


def block_coverage(captures: pd.DataFrame, totals: pd.DataFrame) -> dict:
    """Part (f)'s coverage where what it needs a GPU for is missing: an Nsight capture of one
    block (`captures`: the nsys_capture rows) and the gradients' size from the allocator's
    changes (`totals`: the block_total rows that ran); {} where both are there or nothing ran."""
    if totals.empty:
        return {}
    gaps, ran = [], captures.get("status", pd.Series(dtype=str))
    captured = (ran == "ok").any()
    if not captured:
        said = ", ".join(sorted(set(ran.astype(str)))) or "none in this run"
        gaps.append(f"its Nsight capture did not run ({said})")
    grads = totals.get("grads_from_memory_bytes", pd.Series(np.nan, index=totals.index))
    if grads.isna().all():
        gaps.append(
            "the gradients' size from the allocator's changes needs a CUDA device "
            f"({no_allocator_why(totals.iloc[0])})"
        )
    if not gaps:
        return {}
    nsys = "" if captured else " with Nsight Systems (`nsys`) installed"
    return {
        "memory_profiling.f": {
            "status": "partly",
            "why": "only what one block saves for backward is measured: " + " and ".join(gaps),
            "how": f"`snakemake --cores 1 report` on a CUDA GPU{nsys} (the gpu preset)",
        }
    }


def grads_sentence(t: pd.Series, expect: float, verdict: str) -> str:
    """Part (f)'s calculation: the block's gradients from the allocator's changes (forward's
    growth, backward's change), against 4 bytes a parameter; the hooks' count beside it."""
    hooks = (
        f"(hooks on the parameters count {t['grad_bytes'] / MiB:,.1f} MiB made, 4 bytes × "
        f"{int(t['block_params']):,} parameters {verdict})"
    )
    g = t.get("grads_from_memory_bytes", float("nan"))
    if pd.isna(g):
        return (
            "The gradients' size from the allocator's changes needs a CUDA device "
            f"({no_allocator_why(t)}) {hooks}: `snakemake --cores 1 report` on a GPU measures it."
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


# ---- Q13-Q17: the timelines, peaks, precisions, activations and allocations -----------------


def timeline_sentence(r: pd.Series) -> str:
    """Q13: one point's timeline in words, phase by phase, and where its peak falls."""
    base = r["baseline_mb"]
    ck = str(r.get("checkpoint", "none"))
    ck = "" if ck in ("none", "nan") else f", checkpointing {ck}"
    parts = [
        f"{r['size']} at context {r['context_length']}, {MODE_LABEL.get(r['mode'], r['mode'])}, "
        f"{r['precision']}{ck}: {base:,.0f} MiB are held before the step"
    ]
    if r["mode"] == "inference":
        rise = peak_mb(r) - base
        parts.append(
            "under torch.inference_mode nothing is kept for backward: each layer's "
            f"intermediates are freed once the next has read them, so memory rises only "
            f"{rise:,.0f} MiB above that (one layer at work, the logits"
            + (", a weight's bf16 copy while its matmul runs" if r["precision"] == "bf16" else "")
            + ")"
        )
    elif r["mode"] == "forward":
        parts.append(
            "the forward pass climbs while the saved activations accumulate "
            f"({r['saved_activations_mb']:,.0f} MiB saved for backward) and falls back when the "
            "loss is dropped"
        )
    else:
        fwd_end = r.get("forward_end_mb", np.nan)
        grads = r.get("grads_mb", np.nan)
        if fwd_end == fwd_end and fwd_end < base:
            parts.append(
                "`zero_grad` first frees the previous step's gradients"
                + (f" ({grads:,.0f} MiB)" if grads == grads and grads > 0 else "")
                + f", so forward, though it keeps activations for backward, ends at "
                f"{fwd_end:,.0f} MiB, below that baseline"
            )
        else:
            parts.append(f"forward raises it to {fwd_end:,.0f} MiB (activations kept for backward)")
        if not pd.isna(r.get("backward_end_mb", np.nan)):
            parts.append(
                f"backward frees activations as it makes gradients and ends at "
                f"{r['backward_end_mb']:,.0f} MiB"
            )
        if not pd.isna(r.get("optimizer_end_mb", np.nan)):
            parts.append(f"the optimizer step ends at {r['optimizer_end_mb']:,.0f} MiB")
    peak = peak_mb(r)
    if peak == peak:
        parts.append(
            f"the peak, {peak:,.0f} MiB (the allocator's maximum, as in Q14), falls in "
            f"{r['peak_phase']}"
        )
    else:
        parts.append(f"the trace's peak, {r['trace_peak_mb']:,.0f} MiB, falls in {r['peak_phase']}")
    return "; ".join(parts) + "."


def timeline_skipped(d: pd.DataFrame) -> str:
    """Q13 without CUDA snapshots: why the points have no timeline."""
    reasons = sorted(set(str(x) for x in d.get("timeline_png", pd.Series(dtype=str))))
    reasons = [r.removeprefix("skipped: ") for r in reasons if r.startswith("skipped")]
    return "; ".join(reasons) or "no CUDA memory snapshots"


def partly_measured(missing: list) -> dict:
    """Q14's coverage where the contexts `missing` have no plain point that ran."""
    return {
        "memory_profiling.b": {
            "status": "partly",
            "why": f"context {', '.join(map(str, missing))} ran only with checkpointing or "
            "not at all (the table says why): its peaks without checkpointing are not "
            "measured",
            "how": "a device with more memory (the `skipped` rows give what it needs)",
        }
    }


def peak_growth(d: pd.DataFrame, col: str, what: str) -> list[str]:
    """Q14: per (size, mode, precision), `col` (`what`) from the smallest context to the
    largest."""
    grow = []
    for (size, mode, prec), g in d.groupby(["size", "mode", "precision"]):
        g = g.sort_values("context_length")
        if len(g) > 1 and g[col].iloc[0] > 0:  # an inference forward saves nothing: no ratio
            a, b = g[col].iloc[0], g[col].iloc[-1]
            grow.append(
                f"{size} {MODE_LABEL.get(mode, mode)} {prec}: {what} {a:,.1f} → "
                f"{b:,.1f} MiB ({b / a:.2f}×) from context {g['context_length'].iloc[0]} to "
                f"{g['context_length'].iloc[-1]}"
            )
    return grow


def precision_sentence(pr: pd.DataFrame, what: str, cuda: bool) -> str:
    """Q15: bf16 autocast's `what` over fp32's, per mode (`pr`: rows.precision_ratios)."""
    by_mode = pr.groupby("mode")["bf16_over_fp32"].median()
    text = (
        "; ".join(
            f"{MODE_LABEL.get(m, m)}: bf16 autocast {what} is {v:.2f}× fp32's (median)"
            for m, v in by_mode.items()
        )
        + "."
    )
    if not cuda:
        text += (
            " (A CPU run has no allocator statistics; its RSS growth, in the table above, is "
            "too coarse to compare.)"
        )
    return text


def precision_why(d: pd.DataFrame, cuda: bool) -> str | None:
    """Q15: why bf16 saves what it saves (autocast's weight copies apart where known); None
    without both precisions' activations."""
    act = saved_by_precision(d)
    without = precision_without_casts(d)
    if without:
        return (
            "Autocast keeps fp32 master weights, gradients and optimizer state, so those do "
            "not shrink; it changes what autograd saves. " + without
        )
    if not ({"fp32", "bf16"} <= set(act.columns) and len(act)):
        return None
    ratio = (act["bf16"] / act["fp32"]).median()
    return (
        f"Autocast keeps fp32 master weights, gradients and optimizer state, so those do "
        f"not shrink; it changes what autograd saves: {ratio:.2f}× the fp32 activation "
        "bytes (median). Matmul inputs are saved as bf16 copies (one per matmul that reads "
        "a tensor, plus bf16 copies of every weight), while the residual stream, the norms "
        + (
            "and, on CUDA, the softmax probabilities stay fp32 (the probabilities then also "
            "get a bf16 copy for the PV matmul)."
            if cuda
            else "and the loss stay fp32."
        )
    )


def handout_residual_sentence(hr: pd.DataFrame, measured: set[str]) -> str:
    """Part (d) for the edition's own model (`hr`: rows.handout_residual_rows), with its
    one-sentence justification; `measured`: the sizes this run measured."""
    r0 = hr.iloc[0]
    text = (
        f"A residual-stream activation holds one fp32 number (4 bytes) per sequence, position "
        f"and feature, so its size is batch × context × d_model × 4 bytes: for {r0['size']} "
        f"(d_model {r0['d_model']:,}) at batch {r0['batch']}, "
        + "; ".join(
            f"context {r['context_length']}: {r['batch']}·{r['context_length']}·"
            f"{r['d_model']}·4 = {r['bytes']:,} bytes = {sig(r['MiB'])} MiB"
            for _, r in hr.iterrows()
        )
        + " (MiB = 2^20 bytes)."
    )
    if r0["size"] not in measured:
        text += (
            f" This is arithmetic, no run needed: this run measured "
            f"{', '.join(sorted(measured))}, whose own residual stream the table below gives."
        )
    return text


def residual_sentence(rs: pd.DataFrame, batch_size: int) -> str:
    """Q16: one residual-stream activation of the first point, in bytes and MiB."""
    r0 = rs.iloc[0]
    mib = float(r0["analytic_residual_stream_mb"])
    return (
        f"One residual-stream activation of {r0['size']} (batch {batch_size} × context "
        f"{r0['context_length']} × d_model, fp32) is batch·context·d_model·4 = "
        f"{round(mib * MiB):,} bytes, {sig(mib)} MiB (MiB = 2^20 bytes)."
    )


def activation_sentence(cmp: pd.DataFrame) -> str:
    """Q16: what autograd saved against the analytic model, and the allocator's growth."""
    dev = (cmp["saved_over_analytic"] - 1).abs()
    text = (
        f"The analytic model (`memory.activation_memory`) matches what autograd saved to within "
        f"{100 * dev.max():.2f}% at every point (median deviation {100 * dev.median():.3f}%)."
    )
    if "allocator_growth_mb" in cmp and cmp["allocator_growth_mb"].notna().any():
        g = (cmp["allocator_growth_mb"] / cmp["analytic_activations_mb"]).dropna()
        if len(g):
            text += (
                f" The allocator's growth from the start of forward to the start of backward is "
                f"{g.median():.2f}× the model (median): it also holds the loss's gradient buffers "
                "being made at the moment backward starts and allocator rounding."
            )
    return text


def step_allocation_point(pick: pd.DataFrame) -> str:
    """Q17 without forward snapshots: the point whose step's allocations are shown."""
    mode, prec = pick["mode"].iloc[0], pick["precision"].iloc[0]
    ctx = pick["context_length"].iloc[0]
    return f"{pick['size'].iloc[0]}, context {ctx}, {MODE_LABEL.get(mode, mode)}, {prec}"


def step_allocation_sentence(pick: pd.DataFrame) -> str:
    """Q17 without forward snapshots: the step's largest allocation, its phase and stack."""
    top = pick.iloc[0]
    return (
        f"The largest allocation is {top['size_mb']:,.1f} MiB during {top['phase']}"
        + (
            f", the size of the {top['likely_tensor']}"
            if str(top.get("likely_tensor", "")) not in ("", "nan")
            else ""
        )
        + f"; its stack: {top['frames']}."
    )


def allocations_skipped(allocs: pd.DataFrame) -> str:
    """Q17 without any snapshot: the statuses that say why."""
    st = sorted(set(allocs.get("status", pd.Series(dtype=str)).astype(str))) if len(allocs) else []
    return "; ".join(x.removeprefix("skipped: ") for x in st) or "no data"


# ---- the inference forward beside the forward with autograd on (Q14, Q15) ------------------


def _point(g: pd.DataFrame, mode: str) -> pd.Series | None:
    m = g[g["mode"] == mode]
    return m.iloc[0] if len(m) else None


def inference_sentence(inf: pd.Series, fwd: pd.Series | None, cuda: bool) -> str:
    """One (size, context, precision): the inference forward's peak beside the forward's with
    autograd on, and their difference against what autograd saved."""
    head = f"{inf['size']}, context {inf['context_length']}, {inf['precision']}: "
    if inf["status"] != "ok":
        return head + f"the inference forward (torch.inference_mode) {inf['status']}."
    col, what = ("peak_allocated_mb", "peaks at") if cuda else ("rss_growth_mb", "grows RSS by")
    a = float(inf[col])
    text = head + f"the inference forward (torch.inference_mode) {what} {a:,.0f} MiB"
    if fwd is None:
        return text + " (no forward with autograd on ran)."
    if fwd["status"] != "ok":
        return (
            text + f"; the forward with autograd on: {fwd['status']}. What does not fit is "
            "what autograd keeps for backward, not the forward's computation."
        )
    b, saved = float(fwd[col]), float(fwd["saved_activations_mb"])
    text += f", the forward with autograd on {what} {b:,.0f} MiB"
    if not cuda:
        return text + (
            f" (coarse: the CPU allocator keeps freed pages); exactly, the inference forward "
            f"saves {float(inf['saved_activations_mb']):,.0f} MiB for backward, the forward "
            f"with autograd on {saved:,.0f} MiB."
        )
    gap = b - a
    if gap <= 0:
        return text + (
            f" ({b / a:.2f}×) ⚠: a forward that keeps {saved:,.0f} MiB for backward cannot "
            "peak below one that keeps nothing; these two points need checking, and no "
            "conclusion is drawn from them."
        )
    share = f" ({saved / gap:.0%} of it)"
    return text + (
        f" ({b / a:.2f}×): the {gap:,.0f} MiB between them is what autograd keeps for "
        f"backward, {saved:,.0f} MiB of saved activations by our count{share}, which the "
        "inference forward frees layer by layer."
    )


def inference_sentences(df: pd.DataFrame, cuda: bool) -> list[str]:
    """Q14: per (size, context, precision) with an inference point, that point beside the
    forward with autograd on (`df`: every point without checkpointing, failed ones too)."""
    out = []
    keys = ["size", "context_length", "precision"]
    for _, g in sort_sizes(df, "context_length").groupby(keys, sort=False):
        inf = _point(g, "inference")
        if inf is not None:
            out.append(inference_sentence(inf, _point(g, "forward"), cuda))
    return out


def inference_precision(d: pd.DataFrame) -> str:
    """Q15 for an inference forward (CUDA): bf16's peak beside fp32's at each context, against
    autocast's cached bf16 weight copies (`d`: the points that ran)."""
    inf = d[d["mode"] == "inference"]
    if "peak_allocated_mb" not in inf or inf["peak_allocated_mb"].isna().all():
        return ""
    both = bf16_beside_fp32(inf, ["size", "context_length"], "peak_allocated_mb")
    if both.empty:
        return ""
    items = [
        f"context {ctx}: {r['bf16']:,.0f} against {r['fp32']:,.0f} MiB ({r['bf16'] / r['fp32']:.2f}×, "
        f"{r['bf16'] - r['fp32']:+,.0f} MiB)"
        for (_, ctx), r in both.iterrows()
    ]
    casts = float(both["casts"].iloc[0])
    extra = both["bf16"] - both["fp32"]
    near = ((extra - casts).abs() <= 0.25 * casts).to_numpy()
    if near.all():
        verdict = (
            "yet the difference is within 25% of those copies at every context: bf16's higher "
            "peak looks like copies kept, which this run should check"
        )
    elif not near.any():
        verdict = "the difference is not within 25% of them at any context, as no copy is kept"
    else:
        verdict = "yet the difference is within 25% of them at some contexts"
    return (
        "In an inference forward, bf16 autocast's peak against fp32's: "
        + "; ".join(items)
        + f". Under torch.inference_mode autocast keeps no bf16 copy of the weights (it casts "
        "each again where it is used; with autograd on, or under torch.no_grad, it keeps one "
        f"of every weight, {casts:,.0f} MiB): {verdict}."
    )
