"""Report context for the `attention` stage: naive attention time and memory over head dim x
length, out-of-memory points and their memory accounting, torch.compile speedups (and the whole
model's, from the benchmark stage)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import (
    empty_figure,
    fmt,
    load,
    md_table,
    plot_main,
    save,
    status_counts,
)
from cs336_systems.reporting.analysis import ok as trusted

MIB = 2**20


IMPL_ORDER = {"naive_eager": 0, "naive_compiled": 1}


def _points(df: pd.DataFrame) -> pd.DataFrame:
    order = df["impl"].map(lambda i: IMPL_ORDER.get(i, 9))
    return df.assign(_o=order).sort_values(["_o", "d_head", "seq_len"]).drop(columns="_o")


def _log2_x(ax, values) -> None:
    """Base-2 log x axis labelled at the measured lengths only."""
    from matplotlib.ticker import NullFormatter

    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _per_d_colors(ds):
    cmap = plt.get_cmap("viridis")
    ds = sorted(ds)
    return {d: cmap(i / max(len(ds) - 1, 1)) for i, d in enumerate(ds)}


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "attention")
    fig_dir = Path(fig_dir)
    names = ["time", "memory", "compile"]
    if len(df) == 0:
        return [empty_figure(fig_dir / f"attention_{n}.png", "attention: no data") for n in names]
    df = _points(df)
    colors = _per_d_colors(df["d_head"].unique())
    out = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, col, title in zip(
        axes, ["fwd_ms_mean", "bwd_ms_mean"], ["forward", "backward"], strict=True
    ):
        for (impl, d), g in df.groupby(["impl", "d_head"]):
            style = "-" if impl == "naive_eager" else "--"
            good = g[g[col].notna()] if col in g else g.iloc[:0]
            ax.plot(
                good["seq_len"],
                good[col],
                style,
                marker="o",
                color=colors[d],
                label=f"{impl.removeprefix('naive_')} d={d}",
            )
            oom = g[g["status"] == "oom"]
            if len(oom) and len(good):
                ax.scatter(
                    oom["seq_len"], [good[col].max()] * len(oom), marker="x", s=80, color=colors[d]
                )
        ax.set(yscale="log", xlabel="sequence length n", title=f"{title} (x: OOM)")
        _log2_x(ax, df["seq_len"])
    axes[0].set_ylabel("ms per pass (mean)")
    axes[1].legend(fontsize=7, ncol=2)
    out.append(save(fig, fig_dir / "attention_time.png"))

    fig, ax = plt.subplots(figsize=(6.5, 4))
    eager = df[df["impl"] == "naive_eager"]
    have_mem = "mem_before_backward_mb" in eager and eager["mem_before_backward_mb"].notna().any()
    for d, g in eager.groupby("d_head"):
        if have_mem:
            good = g[g["mem_before_backward_mb"].notna()]
            ax.plot(
                good["seq_len"],
                good["mem_before_backward_mb"],
                "-o",
                color=colors[d],
                label=f"measured d={d}",
            )
        ax.plot(
            g["seq_len"],
            g["expected_before_backward_mb"],
            ":",
            color=colors[d],
            label=f"counted d={d}",
        )
        oom = g[g["status"] == "oom"]
        if len(oom):
            ax.scatter(
                oom["seq_len"],
                oom["expected_before_backward_mb"],
                marker="x",
                s=80,
                color=colors[d],
            )
    if "device_memory_mb" in df and df["device_memory_mb"].notna().any():
        ax.axhline(df["device_memory_mb"].max(), color="red", lw=0.8, label="device memory")
    ax.set(
        yscale="log",
        xlabel="sequence length n",
        ylabel="MiB",
        title="Memory in use before backward (eager; x: OOM)",
    )
    _log2_x(ax, df["seq_len"])
    ax.legend(fontsize=7)
    out.append(save(fig, fig_dir / "attention_memory.png"))

    sp = speedups(df)
    if len(sp) == 0:
        out.append(
            empty_figure(
                fig_dir / "attention_compile.png", "attention: no point ran both eager and compiled"
            )
        )
    else:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for d, g in sp.groupby("d_head"):
            ax.plot(g["seq_len"], g["fwd_speedup"], "-o", color=colors[d], label=f"forward d={d}")
            ax.plot(g["seq_len"], g["bwd_speedup"], "--s", color=colors[d], label=f"backward d={d}")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(
            xlabel="sequence length n",
            ylabel="eager time / compiled time",
            title="torch.compile speedup on naive attention",
        )
        _log2_x(ax, sp["seq_len"])
        ax.legend(fontsize=7, ncol=2)
        out.append(save(fig, fig_dir / "attention_compile.png"))
    return out


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    ok = trusted(df)
    eager = ok[ok["impl"] == "naive_eager"].set_index(["d_head", "seq_len"])
    comp = ok[ok["impl"] == "naive_compiled"].set_index(["d_head", "seq_len"])
    both = eager.index.intersection(comp.index)
    if len(both) == 0:
        return pd.DataFrame(columns=["d_head", "seq_len", "fwd_speedup", "bwd_speedup"])
    out = pd.DataFrame(
        {
            "fwd_speedup": eager.loc[both, "fwd_ms_mean"] / comp.loc[both, "fwd_ms_mean"],
            "bwd_speedup": eager.loc[both, "bwd_ms_mean"] / comp.loc[both, "bwd_ms_mean"],
        }
    )
    return out.reset_index().sort_values(["d_head", "seq_len"])


def _cell(row, col) -> str:
    if row["status"] == "ok" or (isinstance(row.get(col), float) and not math.isnan(row.get(col))):
        value = row.get(col, float("nan"))
        suspect = str(row.get("sanity", "")).startswith("suspect")
        return (fmt(value, 3) + (" ⚠" if suspect else "")) if value == value else "–"
    return str(row["status"]).split(":")[0].upper()


def timing_table(df: pd.DataFrame) -> str:
    rows = []
    for (d, n), g in df.groupby(["d_head", "seq_len"]):
        row = {"d": d, "n": n}
        memory = {}
        ordered = g.sort_values("impl", key=lambda x: x.map(lambda i: IMPL_ORDER.get(i, 9)))
        for _, r in ordered.iterrows():
            tag = r["impl"].removeprefix("naive_")
            row[f"{tag} fwd ms"] = _cell(r, "fwd_ms_mean")
            row[f"{tag} bwd ms"] = _cell(r, "bwd_ms_mean")
            if tag == "eager":
                mem = r.get("mem_before_backward_mb", float("nan"))
                memory["MiB before bwd (measured)"] = fmt(mem, 1) if mem == mem else "–"
                memory["MiB before bwd (counted)"] = fmt(r["expected_before_backward_mb"], 1)
        rows.append({**row, **memory})
    return md_table(pd.DataFrame(rows))


def oom_accounting(df: pd.DataFrame) -> dict:
    """The smallest configuration that ran out of memory (fewest bytes of score matrix, then
    smallest d) and what its tensors need; or, when nothing ran out, where it would start."""
    eager = df[df["impl"] == "naive_eager"] if "naive_eager" in set(df["impl"]) else df
    oom = eager[eager["status"] == "oom"]
    device_mb = float(df["device_memory_mb"].max()) if "device_memory_mb" in df else float("nan")
    if len(oom):
        r = oom.sort_values(["seq_len", "d_head"]).iloc[0]
        b, n, d = int(r["batch_size"]), int(r["seq_len"]), int(r["d_head"])
        return {
            "any": True,
            "config": f"batch {b}, d = {d}, n = {n}",
            "phase": r.get("oom_phase", ""),
            "lines": accounting_lines(b, n, d, device_mb),
        }
    ok = trusted(eager, scope="memory")
    if len(ok) == 0:
        return {
            "any": False,
            "projection": "No point ran and passed the sanity checks, so there is nothing to "
            "project from.",
        }
    b = int(ok["batch_size"].iloc[0])
    d = int(ok["d_head"].min())
    n_max = int(ok["seq_len"].max())
    if device_mb != device_mb:
        return {
            "any": False,
            "projection": f"This device reports no memory size (CPU); the largest point, n = {n_max}, "
            f"counted {fmt(float(ok['expected_backward_peak_mb'].max()), 0)} MiB at backward's peak.",
        }
    n = n_max
    while _backward_peak_mb(b, n, d) < device_mb:
        n *= 2
    return {
        "any": False,
        "projection": (
            f"No configuration ran out of the device's {fmt(device_mb / 1024, 1)} GiB. By the count "
            f"below, batch {b} at d = {d} would first fail at n = {n}:"
        ),
        "lines": accounting_lines(b, n, d, device_mb),
    }


def _backward_peak_mb(b: int, n: int, d: int) -> float:
    return (8 * b * n * d + 3 * b * n * n) * 4 / MIB


def accounting_lines(b: int, n: int, d: int, device_mb: float) -> list[str]:
    nn = b * n * n * 4 / MIB
    nd = b * n * d * 4 / MIB
    lines = [
        f"one (batch x n x n) fp32 matrix: {b} x {n}² x 4 B = {fmt(nn, 0)} MiB",
        f"forward: the scores S and the probabilities P are both alive inside softmax: "
        f"2 x {fmt(nn, 0)} = {fmt(2 * nn, 0)} MiB (+ Q, K, V, O: {fmt(4 * nd, 1)} MiB)",
        f"kept for backward: P ({fmt(nn, 0)} MiB; softmax saves its output, and P V needs it) "
        f"plus Q, K, V; with O and dO that is {fmt(nn + 5 * nd, 0)} MiB before backward starts",
        f"backward: dP = dO Vᵀ and dS = P ∘ (dP − rowsum(dP ∘ P)) are two more n x n buffers: "
        f"≈ {fmt(3 * nn + 8 * nd, 0)} MiB at its peak",
    ]
    if device_mb == device_mb:
        lines.append(f"device memory: {fmt(device_mb, 0)} MiB")
    return lines


def growth_sentence(df: pd.DataFrame) -> str:
    eager = trusted(df[df["impl"] == "naive_eager"], scope="memory")
    col = "mem_before_backward_mb"
    if col not in eager or eager[col].notna().sum() < 2:
        col = "expected_before_backward_mb"
        source = "counted (no device memory counters on this machine)"
    else:
        source = "measured"
    d = eager["d_head"].max() if len(eager) else None
    g = eager[(eager["d_head"] == d) & eager[col].notna()].sort_values("seq_len")
    if len(g) < 2:
        return "Too few successful points to see how saved memory grows."
    x, y = np.log(g["seq_len"].to_numpy(float)), np.log(g[col].to_numpy(float))
    slope = float(np.polyfit(x[-3:], y[-3:], 1)[0])
    if slope >= 1.5:
        why = (
            "close to quadratic, because the saved probability matrix P is n x n per batch "
            "element; the O(n d) tensors only matter at short lengths"
        )
    else:
        why = (
            "not yet quadratic at these lengths: the O(n d) tensors (Q, K, V, O and their "
            "gradients) and fixed allocations still weigh as much as the n x n matrix P; the n² "
            "term takes over at longer lengths"
        )
    return (
        f"Memory in use before backward ({source}, d = {d}) grows as n^{slope:.2f} over the longest "
        f"lengths: {why}."
    )


def _compile_why(df: pd.DataFrame, median_fwd: float) -> str:
    """Why compiling changes attention's time, as far as the run's device and mask say."""
    causal = bool(df["causal"].iloc[0]) if "causal" in df and len(df) else False
    fused = "the scaling, masking and softmax" if causal else "the scaling and softmax"
    cuda = str(df["device"].iloc[0]) == "cuda" if "device" in df and len(df) else False
    if median_fwd < 1:
        return (
            "compiling does not pay at these sizes: the generated code's launch and guard "
            "overheads outweigh the memory traffic that fusing saves"
        )
    if cuda:
        return (
            f"Inductor fuses {fused} into generated Triton kernels, so the (n x n) matrix is "
            "read and written fewer times, while the two matmuls stay cuBLAS calls"
        )
    return (
        f"Inductor fuses {fused} into generated C++ loops, so the (n x n) matrix is read and "
        "written fewer times, while the two matmuls stay calls into the CPU's BLAS"
    )


def compile_summary(df: pd.DataFrame) -> dict:
    sp = speedups(df)
    if len(sp) == 0:
        return {"available": False}
    loses = sp[(sp["fwd_speedup"] < 1) | (sp["bwd_speedup"] < 1)]
    shown = sp.assign(
        fwd_speedup=sp["fwd_speedup"].map(lambda v: f"{v:.2f}×"),
        bwd_speedup=sp["bwd_speedup"].map(lambda v: f"{v:.2f}×"),
    )
    return {
        "available": True,
        "table": md_table(shown.rename(columns={"d_head": "d", "seq_len": "n"})),
        "sentence": (
            f"torch.compile speeds naive attention's forward by {sp['fwd_speedup'].median():.2f}× "
            f"(median; {sp['fwd_speedup'].min():.2f}–{sp['fwd_speedup'].max():.2f}×) and its "
            f"backward by {sp['bwd_speedup'].median():.2f}× "
            f"({sp['bwd_speedup'].min():.2f}–{sp['bwd_speedup'].max():.2f}×) over "
            f"{len(sp)} points; {_compile_why(df, float(sp['fwd_speedup'].median()))}."
        ),
        "losers": (
            "Compiled is slower at "
            + ", ".join(f"d={r.d_head} n={r.seq_len}" for r in loses.itertuples())
            + " (launch and guard overheads dominate tiny problems)."
            if len(loses)
            else "Compiled is never slower here."
        ),
    }


def whole_model_compile(results_dir: Path) -> dict:
    """Eager vs compiled end-to-end step time from the benchmark stage, if it ran."""
    bench = load(results_dir, "benchmark")
    if len(bench) == 0 or "compile" not in bench:
        return {"available": False}
    ok = trusted(bench)
    keys = ["size", "context_length", "mode", "precision"]
    if "attention" in ok:
        ok = ok[ok["attention"] == "naive"]
    eager = ok[ok["compile"] == "eager"].set_index(keys)["step_ms_mean"]
    comp = ok[ok["compile"] == "compiled"].set_index(keys)["step_ms_mean"]
    both = eager.index.intersection(comp.index)
    if len(both) == 0:
        return {"available": False}
    table = pd.DataFrame({"eager ms": eager.loc[both], "compiled ms": comp.loc[both]}).reset_index()
    table["speedup"] = table["eager ms"] / table["compiled ms"]
    sentence = (
        f"On the whole model (benchmark stage), compiling speeds it up by "
        f"{table['speedup'].median():.2f}× "
        + (
            f"(median over {len(table)} points, "
            f"{table['speedup'].min():.2f}–{table['speedup'].max():.2f}×)."
            if len(table) > 1
            else f"(one point: {table['mode'].iloc[0] if 'mode' in table else 'one mode'})."
        )
    )
    table["speedup"] = table["speedup"].map(lambda v: f"{v:.2f}×")
    return {"available": True, "table": md_table(table), "sentence": sentence}


def context(results_dir: Path) -> dict:
    df = load(results_dir, "attention")
    if len(df) == 0:
        return {"available": False}
    df = _points(df)
    first = df.iloc[0]
    statuses = status_counts(df)
    failed = df[df["status"] != "ok"]
    return {
        "available": True,
        "device": first.get("device", "?"),
        "dtypes": sorted(str(x) for x in df["dtype"].dropna().unique()) if "dtype" in df else [],
        "batch_size": int(first["batch_size"]),
        "causal": bool(first["causal"]),
        "warmup_steps": int(first["warmup_steps"]),
        "fwd_steps": int(first["fwd_steps"]),
        "bwd_steps": int(first["bwd_steps"]),
        "head_dims": sorted(int(x) for x in df["d_head"].unique()),
        "seq_lens": sorted(int(x) for x in df["seq_len"].unique()),
        "impls": sorted(df["impl"].unique()),
        "n_points": len(df),
        "statuses": statuses,
        "timing_table": timing_table(df),
        "failed_table": md_table(
            failed[[c for c in ["impl", "d_head", "seq_len", "status", "oom_phase"] if c in failed]]
        )
        if len(failed)
        else "",
        "oom": oom_accounting(df),
        "growth": growth_sentence(df),
        "compile": compile_summary(df),
        "model_compile": whole_model_compile(results_dir),
        "bwd_fwd": _bwd_fwd_sentence(df),
    }


def _bwd_fwd_sentence(df: pd.DataFrame) -> str:
    ok = trusted(df[df["impl"] == "naive_eager"])
    if len(ok) == 0:
        return ""
    ratio = ok["bwd_ms_mean"] / ok["fwd_ms_mean"]
    return (
        f"Backward takes {ratio.median():.2f}× the forward time "
        + (
            f"(median over {len(ok)} eager points, {ratio.min():.2f}–{ratio.max():.2f}×)"
            if len(ok) > 1
            else "(one eager point)"
        )
        + ": it runs twice the matmul work (dQ, dK from dS; dV, "
        "dP from dO) and reads P besides writing two (n x n) buffers."
    )


if __name__ == "__main__":
    plot_main(plot)
