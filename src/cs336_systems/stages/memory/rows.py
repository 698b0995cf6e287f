"""The memory stage's rows as the report reads them: the points without checkpointing, the peak
per point and its measured parts, bf16 over fp32, the residual stream and the activations
against the analytic model, the largest allocations, the 2026 grid and part (f)'s ops; and the
section's tables of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.core import costs
from cs336_systems.core.checkpoint_plans import plan_for
from cs336_systems.planning.edition import size_table, vocab_size
from cs336_systems.reporting.analysis import MEMORY_MODE_LABEL, load, ok, sort_sizes
from cs336_systems.reporting.analysis import md_table as pipe_table

MODE_LABEL = MEMORY_MODE_LABEL
MiB = 2**20
# the point and its attributed parts, shown before the measured peaks (CUDA) or RSS (CPU)
BREAKDOWN_COLUMNS = [
    "size",
    "context_length",
    "mode",
    "precision",
    "params_mb",
    "grads_mb",
    "optimizer_state_mb",
    "saved_activations_mb",
]


# a forward under torch.inference_mode saves nothing for backward: left out of every comparison
# of saved activations (they would divide by zero or read as a 100% miss of the model)
NO_SAVED = ("inference",)


def saving(d: pd.DataFrame) -> pd.DataFrame:
    """The rows of modes that save activations for backward (all but an inference forward)."""
    return d[~d["mode"].isin(NO_SAVED)] if "mode" in d else d


def unit_headers(df: pd.DataFrame) -> pd.DataFrame:
    """Columns named for the unit they are computed in: `x_mb` (2^20 bytes) as `x (MiB)`,
    `x_gib` as `x (GiB)`; the CSVs keep their names."""

    def name(c) -> str:
        c = str(c)
        for tail, unit in (("_mb", "MiB"), ("_gib", "GiB")):
            if c.endswith(tail):
                return f"{c.removesuffix(tail).replace('_', ' ')} ({unit})"
        return c

    return df.rename(columns=name)


def md_table(df: pd.DataFrame, floatfmt: int = 2, numparse: bool = True) -> str:
    """The section's tables: reporting's pipe table with unit_headers."""
    return pipe_table(unit_headers(df) if df is not None else df, floatfmt, numparse)


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """The rows without checkpointing (the 2025 grid's; checkpointed ones: answers.py)."""
    if "checkpoint" not in df:
        return df
    return df[df["checkpoint"].fillna("none") == "none"].reset_index(drop=True)


def load_points(results_dir: Path) -> pd.DataFrame:
    """The points without checkpointing."""
    return plain(load(results_dir, "memory"))


def is_cuda(df: pd.DataFrame) -> bool:
    """Whether the rows come from a CUDA run (allocator statistics)."""
    return "peak_allocated_mb" in df and df["peak_allocated_mb"].notna().any()


def peak_column(df: pd.DataFrame) -> str:
    """CUDA: peak allocated memory. CPU: the growth of peak RSS over the step (the process's
    RSS itself mostly reflects earlier points and the interpreter)."""
    return "peak_allocated_mb" if is_cuda(df) else "rss_growth_mb"


def peak_table(df: pd.DataFrame) -> pd.DataFrame:
    """Q14/Q15: peak memory (MiB) per size and context (and checkpointing, where a point ran
    with it), one column per mode x precision."""
    d = ok(df)
    col = peak_column(df)
    index = ["size", "context_length"]
    if "checkpoint" in d and (d["checkpoint"].fillna("none") != "none").any():
        d = d.assign(checkpoint=d["checkpoint"].fillna("none"))
        index.append("checkpoint")
    t = d.pivot_table(index=index, columns=["mode", "precision"], values=col, aggfunc="first")
    # the modes in MODE_LABEL's order (inference, forward, training step), fp32 first
    order = {m: i for i, m in enumerate(MODE_LABEL)}
    t = t[sorted(t.columns, key=lambda mp: (order.get(mp[0], 99), mp[1] != "fp32", mp[1]))]
    t.columns = [f"{MODE_LABEL.get(m, m)} {p}" for m, p in t.columns]
    return sort_sizes(t.reset_index(), "context_length").reset_index(drop=True)


def precision_ratios(df: pd.DataFrame, col: str | None = None) -> pd.DataFrame:
    """Q15: bf16 / fp32 of `col` (default: the peak column) per (size, context, mode)."""
    d = ok(df)
    col = col or peak_column(df)
    keys = ["size", "context_length", "mode"]
    a = d[d["precision"] == "fp32"].set_index(keys)[col]
    b = d[d["precision"] == "bf16"].set_index(keys)[col]
    both = pd.concat({"fp32_mb": a, "bf16_mb": b}, axis=1).dropna()
    both["bf16_over_fp32"] = both["bf16_mb"] / both["fp32_mb"].where(both["fp32_mb"] > 0)
    return both.reset_index()


def timeline_files(results_dir: Path) -> list[Path]:
    """The timelines the measure jobs rendered (CUDA only)."""
    return sorted((Path(results_dir) / "memory" / "timelines").glob("memory_timeline_*.png"))


# memory_profiling (a)'s images: one per mode, in this order
TIMELINE_MODES = ("inference", "forward", "train_step")


def timeline_choice(d: pd.DataFrame) -> list[pd.Series]:
    """memory_profiling (a)'s images among the points that have a timeline (`d`: those that
    ran, checkpointed ones too): at each context the edition asks (HANDOUT_MODEL; else the
    run's smallest and largest), the inference forward, the forward with autograd on and the
    training step, each fp32 before bf16 and without checkpointing before with."""
    if d.empty or "timeline_png" not in d:
        return []
    d = d[d["timeline_png"].astype(str).str.endswith(".png")]
    if d.empty:
        return []
    d = d.assign(checkpoint=d.get("checkpoint", pd.Series("none", index=d.index)).fillna("none"))
    eds = pd.to_numeric(d.get("edition", pd.Series(dtype=float)), errors="coerce").dropna()
    asked = HANDOUT_MODEL.get(int(eds.iloc[0]) if len(eds) else 2026, HANDOUT_MODEL[2026])[1]
    have = sorted(set(d["context_length"]))
    contexts = [c for c in asked if c in have] or sorted({have[0], have[-1]})
    out = []
    for ctx in contexts:
        for mode in TIMELINE_MODES:
            g = d[(d["context_length"] == ctx) & (d["mode"] == mode)]
            if g.empty:
                continue
            rank = (g["precision"] != "fp32").astype(int) + 2 * (g["checkpoint"] != "none")
            out.append(g.loc[rank.sort_values(kind="stable").index[0]])
    return out


def peak_mb(r: pd.Series) -> float:
    """The one peak the report quotes for a point (Q13 and Q14 alike): the CUDA allocator's
    maximum allocated memory over the measured step (`torch.cuda.max_memory_allocated`). The
    snapshot's trace sees the same allocations but counts only those made while it recorded,
    so its own maximum can differ slightly; it only says *when* the peak falls."""
    return float(r.get("peak_allocated_mb", np.nan))


# ---- Q14: a peak's parts ------------------------------------------------------------------

# The parts of a step's peak (MiB, the CUDA allocator's): what the step starts with that stays
# (parameters, and for a training step AdamW's state; the previous step's gradients are freed by
# `zero_grad` before forward), the activations autograd saved (its distinct storages; under bf16
# autocast these include the bf16 copies of every weight, `analytic_weight_casts_mb`), the rest
# held at the end of forward (the loss and its buffers, the allocator's rounding), and the rest,
# up to the peak: in a training step the growth from the end of forward to the peak (the
# gradients made by then, less the activations already freed, plus backward's scratch), in a
# forward the transient tensors above what it saves (the largest layer's scores, autocast's
# cached weight copies under checkpointing). Each part is a measured number; the last two are
# differences of measured allocator levels, so the parts add up to the peak exactly.
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
            if r["mode"] not in ("forward", "inference")
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
    names = {col: f"{name} (MiB)" for col, name in PARTS.items()}
    t = parts.rename(columns={**names, "peak_allocated_mb": "= peak allocated (MiB)"})
    return md_table(t, 0)


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
    head = costs.head_saved_bytes(b, n, spec["d_model"], vocab_size(), prec)
    # what autograd saves (as `saved_activations_mb` counts it): autocast's cached weight
    # copies are held until the forward ends but are not saved tensors
    fwd = costs.checkpoint_memory(plan, blk["total"], blk["input"], head, 0)
    return fwd["forward_bytes"] / MiB


def block_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """Part (f): the ops a block saves for, ranked per (context, precision), in MiB and %."""
    if ops.empty:
        return ops
    t = ops[["context_length", "precision", "rank", "op", "bytes", "share"]].copy()
    t["MiB"] = t.pop("bytes") / MiB
    t["share %"] = 100 * t.pop("share")
    return t.sort_values(["context_length", "precision", "rank"]).reset_index(drop=True)


def grid_table(df: pd.DataFrame) -> str:
    """2026: every point of the grid, checkpointed ones included, with its status."""
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


def breakdown_table(d: pd.DataFrame) -> str:
    """Q14 where the peak has no measured parts (a CPU run): the attributed parts beside the
    process's RSS."""
    cols = [*BREAKDOWN_COLUMNS, "rss_before_mb", "peak_rss_mb", "rss_growth_mb"]
    return md_table(sort_sizes(d[[c for c in cols if c in d]], "context_length"), 1)


# ---- Q15: bf16 against fp32 ------------------------------------------------------------------


def precision_table(pr: pd.DataFrame) -> str:
    """bf16 over fp32 per point (`pr`: precision_ratios)."""
    return md_table(sort_sizes(pr, "context_length").assign(mode=pr["mode"].map(MODE_LABEL)), 2)


def saved_by_precision(d: pd.DataFrame) -> pd.DataFrame:
    """The activations saved for backward (MiB) per (size, context, mode), one column per
    precision, where every precision has one."""
    return (
        saving(d)
        .pivot_table(
            index=["size", "context_length", "mode"],
            columns="precision",
            values="saved_activations_mb",
            aggfunc="first",
        )
        .dropna()
    )


# ---- Q16: the residual stream and the activations against the analytic model ---------------


# memory_profiling (d)'s model and the contexts of the edition's memory questions (the handout's
# own: 2025's 2.7B at 128, 256 and 512; 2026's xl at 128 and 2048), at its batch of 4
HANDOUT_MODEL = {2025: ("2.7B", (128, 256, 512)), 2026: ("xl", (128, 2048))}
HANDOUT_BATCH = 4


def handout_residual_rows(edition: int) -> pd.DataFrame:
    """Part (d)'s arithmetic for the edition's own model (no run needed): one fp32
    residual-stream activation, batch·context·d_model·4 bytes, per asked context."""
    name, contexts = HANDOUT_MODEL.get(int(edition), HANDOUT_MODEL[2026])
    d_model = size_table(int(edition))[name]["d_model"]
    rows = []
    for n in contexts:
        nbytes = HANDOUT_BATCH * n * d_model * 4
        rows.append(
            {
                "size": name,
                "batch": HANDOUT_BATCH,
                "context_length": n,
                "d_model": d_model,
                "bytes": nbytes,
                "MiB": nbytes / MiB,
            }
        )
    return pd.DataFrame(rows)


def residual_rows(d: pd.DataFrame) -> pd.DataFrame:
    """One residual-stream activation's MiB per (size, context)."""
    first = sort_sizes(d, "context_length")
    return first.drop_duplicates(["size", "context_length"])[
        ["size", "context_length", "analytic_residual_stream_mb"]
    ]


def activation_rows(d: pd.DataFrame) -> pd.DataFrame:
    """Per point: what autograd saved against the analytic model (and the allocator's growth
    over forward, where measured)."""
    d = saving(d)
    cmp = d[
        [
            "size",
            "context_length",
            "mode",
            "precision",
            "saved_activations_mb",
            "analytic_activations_mb",
        ]
    ].copy()
    if "forward_growth_mb" in d:
        cmp["allocator_growth_mb"] = d["forward_growth_mb"]
    cmp["saved_over_analytic"] = cmp["saved_activations_mb"] / cmp["analytic_activations_mb"]
    return cmp


# ---- Q17: the largest allocations ------------------------------------------------------------


def forward_allocation_rows(allocs: pd.DataFrame) -> pd.DataFrame:
    """memory_profiling (e): per (context, precision, checkpointing) of the forward passes'
    snapshots, the largest allocation, how many of the top 10 share its size, what it likely
    is and where it was made (empty without forward snapshots)."""
    if allocs.empty or "mode" not in allocs:
        return pd.DataFrame()
    a = allocs[(allocs["status"] == "ok") & (allocs["mode"] == "forward")]
    if a.empty:
        return pd.DataFrame()
    a = a.assign(checkpoint=a["checkpoint"].fillna("none") if "checkpoint" in a else "none")
    rows = []
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
    return pd.DataFrame(rows)


def forward_allocations_table(t: pd.DataFrame) -> str:
    return md_table(sort_sizes(t, "context_length"), 1)


def step_allocations(allocs: pd.DataFrame) -> pd.DataFrame:
    """Where no forward pass has a snapshot: the largest allocations of one step, at the
    largest context, a training step (else any mode), fp32 (else any), by rank."""
    a = allocs[allocs["status"] == "ok"]
    ctx = a["context_length"].max()
    pick = a[(a["context_length"] == ctx)]
    mode = "train_step" if (pick["mode"] == "train_step").any() else pick["mode"].iloc[0]
    prec = "fp32" if (pick["precision"] == "fp32").any() else pick["precision"].iloc[0]
    return pick[(pick["mode"] == mode) & (pick["precision"] == prec)].sort_values("rank")


def step_allocations_table(pick: pd.DataFrame) -> str:
    show = pick[["rank", "size_mb", "phase", "likely_tensor", "frames"]].copy()
    show["likely_tensor"] = show["likely_tensor"].fillna("")
    return md_table(show, 1)
