"""Report context and figures for the `memory` stage (questions 13-17)."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import (
    empty_figure,
    failed_points,
    load,
    md_table,
    ok,
    on_axis,
    plot_main,
    save,
    sig,
    sort_sizes,
)
from cs336_systems.stages.memory import answers

MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}
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


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """The rows without checkpointing (the 2025 grid's; checkpointed ones: answers.py)."""
    if "checkpoint" not in df:
        return df
    return df[df["checkpoint"].fillna("none") == "none"].reset_index(drop=True)


def _points(results_dir: Path) -> pd.DataFrame:
    return plain(load(results_dir, "memory"))


def _cuda(df: pd.DataFrame) -> bool:
    return "peak_allocated_mb" in df and df["peak_allocated_mb"].notna().any()


def peak_column(df: pd.DataFrame) -> str:
    """CUDA: peak allocated memory. CPU: the growth of peak RSS over the step (the process's
    RSS itself mostly reflects earlier points and the interpreter)."""
    return "peak_allocated_mb" if _cuda(df) else "rss_growth_mb"


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
    both["bf16_over_fp32"] = both["bf16_mb"] / both["fp32_mb"]
    return both.reset_index()


def _timeline_files(results_dir: Path) -> list[Path]:
    return sorted((Path(results_dir) / "memory" / "timelines").glob("memory_timeline_*.png"))


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = _points(results_dir)
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"memory_{n}.png" for n in ("peak", "activations", "timelines")}
    if df.empty or ok(df).empty:
        return [empty_figure(p, "no successful memory points") for p in paths.values()]
    d = ok(df)
    out = []
    col = peak_column(df)

    fig, ax = plt.subplots(figsize=(6, 3.8))
    # every context of the grid on the axis: a context whose point did not run is a gap
    contexts = sorted(set(df["context_length"]))
    for (size, mode, prec), g in d.groupby(["size", "mode", "precision"]):
        g = g.sort_values("context_length")
        ax.plot(
            contexts,
            on_axis(list(g["context_length"]), list(g[col] / 1024), contexts),
            marker="o",
            ls="-" if prec == "fp32" else "--",
            label=f"{size} {MODE_LABEL.get(mode, mode)} {prec}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length")
    ax.set_ylabel(
        ("peak allocated" if col == "peak_allocated_mb" else "peak RSS growth in the step")
        + " (GiB)"
    )
    ax.legend(fontsize=7)
    out.append(save(fig, paths["peak"]))

    # activations: analytic model vs what autograd saved vs the allocator's growth over forward
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for (size, prec), g in d[d["mode"] != "forward"].groupby(["size", "precision"]):
        g = g.sort_values("context_length")
        line = ax.plot(
            g["context_length"], g["saved_activations_mb"], marker="o", label=f"{size} {prec} saved"
        )
        ax.plot(
            g["context_length"],
            g["analytic_activations_mb"],
            ls=":",
            marker="x",
            color=line[0].get_color(),
            label=f"{size} {prec} analytic",
        )
        if "forward_growth_mb" in g and g["forward_growth_mb"].notna().any():
            ax.plot(
                g["context_length"],
                g["forward_growth_mb"],
                ls="--",
                color=line[0].get_color(),
                alpha=0.6,
                label=f"{size} {prec} allocator growth",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length")
    ax.set_ylabel("activation memory (MiB)")
    ax.legend(fontsize=7)
    out.append(save(fig, paths["activations"]))

    timelines = _timeline_files(results_dir)
    if timelines:
        for t in timelines:  # the individual timelines go next to the report too (and PDF)
            for f in (t, t.with_suffix(".pdf")):
                if f.exists():
                    shutil.copy2(f, fig_dir / f.name)
        chosen = _montage_choice(d, timelines)
        fig, axes = plt.subplots(len(chosen), 1, figsize=(9, 3.3 * len(chosen)), squeeze=False)
        for ax, t in zip(axes[:, 0], chosen, strict=True):
            ax.imshow(plt.imread(t))
            ax.axis("off")
        out.append(save(fig, paths["timelines"]))
    else:
        out.append(empty_figure(paths["timelines"], "memory timelines need CUDA memory snapshots"))
    return out


def _montage_choice(d: pd.DataFrame, files: list[Path]) -> list[Path]:
    """The forward and training-step timelines of the largest context, fp32 (else any)."""
    names = {f.name: f for f in files}
    ctx = d["context_length"].max()
    size = d["size"].iloc[0]
    chosen = []
    for mode in ("forward", "train_step"):
        for prec in ("fp32", "bf16"):
            key = f"memory_timeline_{size}_{ctx}_{mode}_{prec}.png"
            if key in names:
                chosen.append(names[key])
                break
    return chosen or files[:2]


def peak_mb(r: pd.Series) -> float:
    """The one peak the report quotes for a point (Q13 and Q14 alike): the CUDA allocator's
    maximum allocated memory over the measured step (`torch.cuda.max_memory_allocated`). The
    snapshot's trace sees the same allocations but counts only those made while it recorded,
    so its own maximum can differ slightly; it only says *when* the peak falls."""
    return float(r.get("peak_allocated_mb", np.nan))


def _sentence_timeline(r: pd.Series) -> str:
    base = r["baseline_mb"]
    parts = [
        f"{r['size']} at context {r['context_length']}, {MODE_LABEL.get(r['mode'], r['mode'])}, "
        f"{r['precision']}: {base:,.0f} MiB are held before the step"
    ]
    if r["mode"] == "forward":
        parts.append(
            "the forward pass climbs while the saved activations accumulate and falls back "
            "when the loss is dropped"
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


def context(results_dir: Path) -> dict:
    df = _points(results_dir)
    s: dict = {"available": len(df) > 0}
    if not s["available"]:
        return s
    d = ok(df)
    allocs = plain(load(results_dir, "memory_allocations"))
    every = load(results_dir, "memory")
    s["grid_counts"] = answers.grid_counts(every)
    eds = pd.to_numeric(every.get("edition", pd.Series(dtype=float)), errors="coerce").dropna()
    s["edition"] = int(eds.iloc[0]) if len(eds) else 2026
    s["n_points"], s["n_ok"] = len(df), len(d)
    s["statuses"] = df["status"].value_counts().to_dict()
    s["failed_table"] = (
        md_table(sort_sizes(failed_points(df, ["size", "context_length", "mode", "precision"])))
        if len(d) < len(df)
        else ""
    )
    s["cuda"] = _cuda(df)
    s["peak_what"] = (
        "Peak allocated memory"
        if s["cuda"]
        else "Growth of the peak resident set size (RSS) during the measured step"
    )
    s["batch_size"] = int(df["batch_size"].iloc[0])
    s["warmup_steps"] = int(df["warmup_steps"].iloc[0])
    if d.empty:
        s["available"] = False
        return s
    s["sizes"] = sorted(set(d["size"]))
    # 2026: the checkpointed points beside the plain ones, part (f) (answers.py)
    s["y2026"] = answers.edition_2026(
        load(results_dir, "memory"), load(results_dir, "memory_blocks")
    )

    # Q13: timelines
    s["timelines"] = []
    if s["cuda"] and "trace_peak_mb" in d:
        for _, r in sort_sizes(d, "context_length").iterrows():
            if pd.isna(r.get("trace_peak_mb", np.nan)):
                continue
            s["timelines"].append(
                {"png": r["timeline_png"], "sentence": _sentence_timeline(r), "mode": r["mode"]}
            )
        big = d[d["context_length"] == d["context_length"].max()]
        s["timeline_examples"] = [
            t for t in s["timelines"] if any(str(p) == t["png"] for p in big["timeline_png"])
        ]
    else:
        reasons = sorted(set(str(x) for x in d.get("timeline_png", pd.Series(dtype=str))))
        reasons = [r.removeprefix("skipped: ") for r in reasons if r.startswith("skipped")]
        s["timeline_skipped"] = "; ".join(reasons) or "no CUDA memory snapshots"

    # Q14: every context, checkpointed points beside the plain ones (marked); a context whose
    # plain points did not run answers the question only partly
    s["peak_table"] = md_table(peak_table(every), floatfmt=0)
    missing = sorted(set(every["context_length"]) - set(d["context_length"]))
    if missing:
        s["coverage"] = {
            "memory_profiling.b": {
                "status": "partly",
                "why": f"context {', '.join(map(str, missing))} ran only with checkpointing or "
                "not at all (the table says why): its peaks without checkpointing are not "
                "measured",
                "how": "a device with more memory (the `skipped` rows give what it needs)",
            }
        }
    col = peak_column(df)
    grow = []
    # on a CPU the RSS growth is too coarse to compare points: follow the saved activations
    growth_col = col if s["cuda"] else "saved_activations_mb"
    growth_what = "peak" if s["cuda"] else "activations saved for backward"
    for (size, mode, prec), g in d.groupby(["size", "mode", "precision"]):
        g = g.sort_values("context_length")
        if len(g) > 1:
            a, b = g[growth_col].iloc[0], g[growth_col].iloc[-1]
            grow.append(
                f"{size} {MODE_LABEL.get(mode, mode)} {prec}: {growth_what} {a:,.1f} → "
                f"{b:,.1f} MiB ({b / a:.2f}×) from context {g['context_length'].iloc[0]} to "
                f"{g['context_length'].iloc[-1]}"
            )
    s["peak_growth"] = grow
    parts = answers.peak_parts(ok(every)) if s["cuda"] else pd.DataFrame()
    if len(parts):
        s["breakdown"] = answers.parts_sentence(parts)
        s["breakdown_table"] = answers.parts_table(parts)
    else:
        cols = [*BREAKDOWN_COLUMNS, "rss_before_mb", "peak_rss_mb", "rss_growth_mb"]
        s["breakdown_table"] = md_table(
            sort_sizes(d[[c for c in cols if c in d]], "context_length"), 1
        )

    # Q15
    # a CPU's RSS growth is too coarse for a ratio: compare the activations saved instead
    ratio_col = col if s["cuda"] else "saved_activations_mb"
    ratio_what = "peak allocated memory" if s["cuda"] else "activation memory saved for backward"
    pr = precision_ratios(df, ratio_col)
    if len(pr):
        s["precision_table"] = md_table(
            sort_sizes(pr, "context_length").assign(mode=pr["mode"].map(MODE_LABEL)), 2
        )
        by_mode = pr.groupby("mode")["bf16_over_fp32"].median()
        s["precision_sentence"] = (
            "; ".join(
                f"{MODE_LABEL.get(m, m)}: bf16 autocast {ratio_what} is {v:.2f}× fp32's (median)"
                for m, v in by_mode.items()
            )
            + "."
        )
        if not s["cuda"]:
            s["precision_sentence"] += (
                " (A CPU run has no allocator statistics; its RSS growth, in the table above, is "
                "too coarse to compare.)"
            )
        act = d.pivot_table(
            index=["size", "context_length", "mode"],
            columns="precision",
            values="saved_activations_mb",
            aggfunc="first",
        ).dropna()
        without = answers.precision_without_casts(d)
        if without:
            s["precision_why"] = (
                "Autocast keeps fp32 master weights, gradients and optimizer state, so those do "
                "not shrink; it changes what autograd saves. " + without
            )
        elif {"fp32", "bf16"} <= set(act.columns) and len(act):
            ratio = (act["bf16"] / act["fp32"]).median()
            s["precision_why"] = (
                f"Autocast keeps fp32 master weights, gradients and optimizer state, so those do "
                f"not shrink; it changes what autograd saves: {ratio:.2f}× the fp32 activation "
                "bytes (median). Matmul inputs are saved as bf16 copies (one per matmul that reads "
                "a tensor, plus bf16 copies of every weight), while the residual stream, the norms "
                + (
                    "and, on CUDA, the softmax probabilities stay fp32 (the probabilities then also "
                    "get a bf16 copy for the PV matmul)."
                    if s["cuda"]
                    else "and the loss stay fp32."
                )
            )
    # Q16
    first = sort_sizes(d, "context_length")
    rs = first.drop_duplicates(["size", "context_length"])[
        ["size", "context_length", "analytic_residual_stream_mb"]
    ]
    s["residual_table"] = md_table(rs, 2)
    r0 = rs.iloc[0]
    mib = float(r0["analytic_residual_stream_mb"])
    s["residual_sentence"] = (
        f"One residual-stream activation of {r0['size']} (batch {s['batch_size']} × context "
        f"{r0['context_length']} × d_model, fp32) is batch·context·d_model·4 = "
        f"{round(mib * MiB):,} bytes, {sig(mib)} MiB (MiB = 2^20 bytes)."
    )
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
    s["activation_table"] = md_table(sort_sizes(cmp, "context_length"), 2)
    dev = (cmp["saved_over_analytic"] - 1).abs()
    s["activation_sentence"] = (
        f"The analytic model (`memory.activation_memory`) matches what autograd saved to within "
        f"{100 * dev.max():.2f}% at every point (median deviation {100 * dev.median():.3f}%)."
    )
    if "allocator_growth_mb" in cmp and cmp["allocator_growth_mb"].notna().any():
        g = (cmp["allocator_growth_mb"] / cmp["analytic_activations_mb"]).dropna()
        if len(g):
            s["activation_sentence"] += (
                f" The allocator's growth from the start of forward to the start of backward is "
                f"{g.median():.2f}× the model (median): it also holds the loss's gradient buffers "
                "being made at the moment backward starts and allocator rounding."
            )

    # Q17: the forward pass's snapshot, as the handout asks (every context, checkpointed ones
    # included: allocations_of_all); a run without forward snapshots: the step's largest
    fwd_text, fwd_table = answers.forward_allocations(load(results_dir, "memory_allocations"))
    if fwd_text:
        s["alloc_sentence"], s["alloc_table"] = fwd_text, fwd_table
        s["alloc_point"] = "forward passes"
    elif len(allocs) and "size_mb" in allocs and (allocs["status"] == "ok").any():
        a = allocs[allocs["status"] == "ok"]
        ctx = a["context_length"].max()
        pick = a[(a["context_length"] == ctx)]
        mode = "train_step" if (pick["mode"] == "train_step").any() else pick["mode"].iloc[0]
        prec = "fp32" if (pick["precision"] == "fp32").any() else pick["precision"].iloc[0]
        pick = pick[(pick["mode"] == mode) & (pick["precision"] == prec)].sort_values("rank")
        s["alloc_point"] = (
            f"{pick['size'].iloc[0]}, context {ctx}, {MODE_LABEL.get(mode, mode)}, {prec}"
        )
        show = pick[["rank", "size_mb", "phase", "likely_tensor", "frames"]].copy()
        show["likely_tensor"] = show["likely_tensor"].fillna("")
        s["alloc_table"] = md_table(show, 1)
        top = pick.iloc[0]
        s["alloc_sentence"] = (
            f"The largest allocation is {top['size_mb']:,.1f} MiB during {top['phase']}"
            + (
                f", the size of the {top['likely_tensor']}"
                if str(top.get("likely_tensor", "")) not in ("", "nan")
                else ""
            )
            + f"; its stack: {top['frames']}."
        )
    else:
        st = (
            sorted(set(allocs.get("status", pd.Series(dtype=str)).astype(str)))
            if len(allocs)
            else []
        )
        s["alloc_skipped"] = "; ".join(x.removeprefix("skipped: ") for x in st) or "no data"
    return s


if __name__ == "__main__":
    plot_main(plot)
