"""Report context and figures for the `checkpointing` stage (questions 29-31)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.core import checkpoint_plans, costs
from cs336_systems.reporting.analysis import (
    empty_figure,
    fmt,
    load,
    md_table,
    ok,
    plot_main,
    plural,
    save,
)

MiB = 2**20
GiB_PER_MiB = 1 / 1024
STRATEGY_LABEL = {
    "none": "no checkpointing",
    "sqrt": "one level, ~sqrt(N) segments",
    "halving": "nested: recursive halving",
    "chain": "nested: prefixes (chain)",
}


def mem(mib: float) -> str:
    """MiB as prose: GiB from 1 GiB up."""
    return f"{fmt(mib / 1024)} GiB" if mib >= 1024 else f"{fmt(mib)} MiB"


def label(name: str) -> str:
    k = checkpoint_plans.block_size_of(name)
    return f"one level, every {k} block{'s' if k > 1 else ''}" if k else STRATEGY_LABEL[name]


def _cuda(df: pd.DataFrame) -> bool:
    return "peak_activation_mb" in df and df["peak_activation_mb"].notna().any()


def peak_column(df: pd.DataFrame) -> str:
    """What a strategy adds to memory during a step: on CUDA the allocator's peak above the
    memory before the step (parameters, gradients, optimizer state); elsewhere the peak of
    live tensors the step created (LiveTensorBytes)."""
    return "peak_activation_mb" if _cuda(df) else "peak_live_mb"


# ---- Q29: saved-tensor accounting ------------------------------------------------------------


def saved_totals(acc: pd.DataFrame) -> pd.DataFrame:
    """Per module and compile mode: saves, activation MiB (each storage once; every save, the
    handout's sum), the input, parameter and buffer saves."""
    d = ok(acc)
    out = []
    for (mod, comp), g in d.groupby(["module_kind", "compile"], sort=False):
        act = g[g["kind"] == "activation"]
        out.append(
            {
                "module": mod,
                "compile": comp,
                "saved tensors": len(g),
                "activation saves": len(act),
                "activations MiB": act.loc[act["first"], "storage_bytes"].sum() / MiB,
                "sum of every save MiB": act["bytes"].sum() / MiB,
                "input MiB": g.loc[(g["kind"] == "input") & g["first"], "storage_bytes"].sum()
                / MiB,
                "parameter saves": int((g["kind"] == "parameter").sum()),
                "buffer saves": int((g["kind"] == "buffer").sum()),
            }
        )
    return pd.DataFrame(out)


def tensor_table(acc: pd.DataFrame, module: str, compile_: str) -> pd.DataFrame:
    d = ok(acc)
    g = d[(d["module_kind"] == module) & (d["compile"] == compile_)]
    return pd.DataFrame(
        {
            "#": g["index"].astype(int),
            "shape": g["shape"],
            "dtype": g["dtype"],
            "MiB": g["bytes"] / MiB,
            "kind": g["kind"] + g["first"].map({True: "", False: " (again)"}),
            "module": g["module"].fillna(""),
            "saved by": g["op"],
        }
    )


def by_op(acc: pd.DataFrame, compile_: str, top: int = 8) -> pd.DataFrame:
    """The block's activation bytes (each storage once) by the op that first saved them."""
    d = ok(acc)
    g = d[(d["module_kind"] == "block") & (d["compile"] == compile_)]
    g = g[(g["kind"] == "activation") & g["first"]]
    total = g["storage_bytes"].sum()
    t = (
        g.assign(where=g["module"].fillna("") + " " + g["op"])
        .groupby("where", sort=False)["storage_bytes"]
        .sum()
        .sort_values(ascending=False)
    )
    return pd.DataFrame(
        {"saved by": t.index, "MiB": t.values / MiB, "share": [f"{v / total:.1%}" for v in t]}
    ).head(top)


def by_module(acc: pd.DataFrame) -> pd.DataFrame:
    """The block's activation MiB (each storage once) per top-level part, eager and compiled:
    where fusion saves memory."""
    d = ok(acc)
    g = d[(d["module_kind"] == "block") & (d["kind"] == "activation") & d["first"]]
    part = g["module"].fillna("").astype(str).str.split(".").str[0].replace("", "(unattributed)")
    t = g.assign(part=part).pivot_table(
        index="part", columns="compile", values="storage_bytes", aggfunc="sum", fill_value=0
    )
    t = (t / MiB).reset_index().rename(columns={"part": "part of the block"})
    cols = [c for c in ("eager", "compiled") if c in t]
    return t[["part of the block", *cols]]


def accounting_context(acc: pd.DataFrame) -> dict:
    if len(acc) == 0:
        return {"available": False}
    totals = saved_totals(acc)
    first = acc.iloc[0]
    b, n, d = int(first["batch_size"]), int(first["context_length"]), int(first["d_model"])
    h, f = int(first["num_heads"]), int(first["d_ff"])
    layers = int(checkpointing_size_layers(first["size"], first.get("edition")))
    model = costs.block_saved_bytes(b, n, d, h, f, "fp32", "cuda")
    failed = acc[acc["status"] != "ok"][["module_kind", "compile", "status"]]
    out = {
        "available": True,
        "shape": f"({b}, {n}, {d})",
        "size": first["size"],
        "heads": h,
        "device": first["device"],
        "backend": ", ".join(sorted(set(acc["compile_backend"].dropna().astype(str)) - {""})),
        "totals": md_table(totals),
        "by_module": md_table(by_module(acc)),
        "failed": md_table(failed) if len(failed) else "",
        "sentences": [],
    }
    t = totals.set_index(["module", "compile"])
    for mod in ("rmsnorm", "block"):
        key = "rmsnorm_table" if mod == "rmsnorm" else "block_by_op"
        if (mod, "eager") in t.index:
            out[key] = (
                md_table(tensor_table(acc, mod, "eager"))
                if mod == "rmsnorm"
                else md_table(by_op(acc, "eager"))
            )
        if (mod, "compiled") in t.index:
            out[key + "_compiled"] = (
                md_table(tensor_table(acc, mod, "compiled"))
                if mod == "rmsnorm"
                else md_table(by_op(acc, "compiled"))
            )
        if (mod, "eager") in t.index and (mod, "compiled") in t.index:
            e, c = t.loc[(mod, "eager")], t.loc[(mod, "compiled")]
            name = "One RMSNorm" if mod == "rmsnorm" else "One TransformerBlock"
            out["sentences"].append(
                f"{name} saves {fmt(e['activations MiB'])} MiB of activations eager "
                f"({plural(int(e['activation saves']), 'save')}, {fmt(e['sum of every save MiB'])} MiB "
                f"if every save is counted as the handout's hook does) besides its "
                f"{fmt(e['input MiB'])} MiB input; compiled, {fmt(c['activations MiB'])} MiB "
                f"({plural(int(c['activation saves']), 'save')}): fusion removes "
                f"{fmt(e['activations MiB'] - c['activations MiB'])} MiB "
                f"({(1 - c['activations MiB'] / e['activations MiB']):.0%})."
            )
    if ("block", "eager") in t.index:
        e = t.loc[("block", "eager")]
        per_block = e["activations MiB"] + e["input MiB"]
        out["sentences"].append(
            f"With its input, an eager block holds {fmt(per_block)} MiB; the analytic model "
            f"(core/costs.py: block_saved_bytes) predicts {fmt(model['total'] / MiB)} MiB. "
            f"Over the {layers} layers: {fmt(layers * per_block * GiB_PER_MiB)} GiB"
            + (
                f" eager, {fmt(layers * (t.loc[('block', 'compiled')]['activations MiB'] + e['input MiB']) * GiB_PER_MiB)} GiB compiled"
                if ("block", "compiled") in t.index
                else ""
            )
            + " of activations saved for one backward pass."
        )
    return out


def checkpointing_size_layers(size: str, edition=None) -> int:
    from cs336_systems.model import size_spec

    edition = None if pd.isna(edition) else int(edition)
    return size_spec(size, edition)["num_layers"]


# ---- Q30-31: strategies ----------------------------------------------------------------------


def strategy_table(df: pd.DataFrame) -> pd.DataFrame:
    col = peak_column(df)
    rows = []
    for r in df.itertuples():
        measured = getattr(r, col, math.nan) if r.status == "ok" else math.nan
        rows.append(
            {
                "precision": r.precision,
                "strategy": label(r.strategy),
                "status": r.status,
                "peak MiB (measured)": measured,
                "peak MiB (model)": r.model_peak_mb,
                "measured − model": measured - r.model_peak_mb,
                "total peak MiB": getattr(r, "peak_allocated_mb", math.nan),
                "step ms": getattr(r, "step_ms_mean", math.nan),
                "recomputed blocks": r.recomputed_blocks,
                "compute ×": r.compute_factor,
            }
        )
    return pd.DataFrame(rows)


def best_block_size(df: pd.DataFrame, precision: str) -> dict | None:
    """Q31: the one-level block size with the lowest measured peak, its neighbours (the next
    smaller and larger block sizes run), with their peaks, step times and statuses."""
    col = peak_column(df)
    d = df[(df["precision"] == precision) & df["block_size"].notna()].copy()
    d["block_size"] = d["block_size"].astype(int)
    d = d.sort_values("block_size")
    good = d[d["status"] == "ok"]
    if len(good) == 0:
        return None
    best = good.loc[good[col].idxmin()]
    ks = list(d["block_size"])
    i = ks.index(int(best["block_size"]))

    def describe(r) -> str:
        k = int(r["block_size"])
        if r["status"] != "ok":
            return f"k = {k}: {r['status']}"
        total = r.get("peak_allocated_mb", math.nan)
        extra = f" ({mem(total)} in all)" if total == total else ""
        return (
            f"k = {k}: peak {mem(r[col])} above the step's start{extra}, "
            f"{fmt(r['step_ms_mean'])} ms per step"
        )

    neighbours = [d.iloc[j] for j in (i - 1, i + 1) if 0 <= j < len(d)]
    n_layers = int(best["num_layers"])
    a, B = best["model_boundary_mb"], best["model_block_mb"]
    times = good["step_ms_mean"]
    return {
        "precision": precision,
        "k": int(best["block_size"]),
        "best": describe(best),
        "neighbours": [describe(r) for r in neighbours],
        "none_smaller": i == 0,
        "none_larger": i == len(d) - 1,
        "k_star": math.sqrt(n_layers * a / B),
        "model_k": int(d.loc[d["model_peak_mb"].idxmin(), "block_size"]),
        "boundary_mb": a,
        "block_mb": B,
        "num_layers": n_layers,
        "time_spread": time_spread(
            times, int(best["recomputed_blocks"]), int(best.get("measure_steps", 1))
        ),
    }


def time_spread(times: pd.Series, recomputed: int, steps: int = 1) -> str:
    """Step times over the block sizes, which all recompute the same blocks."""
    ratio = times.max() / times.min()
    text = (
        f"the step takes {fmt(times.min())}-{fmt(times.max())} ms over the {len(times)} block "
        f"sizes that ran ({fmt(ratio)}× apart; "
        + (f"means of {steps} measured steps" if steps > 1 else "one measured step each")
        + f"), each recomputing the same {recomputed} blocks"
    )
    if steps == 1:
        text += ": one step each, so differences this small are not evidence either way"
    if ratio > 1.25:
        text += (
            ": a spread this large for the same work comes from elsewhere (other load on the "
            "machine, or an allocator working near its limit), not from the block size"
        )
    return text


def nested_sentences(df: pd.DataFrame) -> list[str]:
    """Q30 from the rows: the nested strategies' peaks and step times against one level."""
    col = peak_column(df)
    out = []
    for prec, g in df.groupby("precision", sort=False):
        rows = g.set_index("strategy")
        if "every_1" not in rows.index or rows.loc["every_1", "status"] != "ok":
            continue
        base = rows.loc["every_1"]
        for name in ("halving", "chain", "sqrt"):
            if name not in rows.index:
                continue
            r = rows.loc[name]
            if r["status"] != "ok":
                out.append(f"{prec}, {label(name)}: {r['status']}.")
                continue
            out.append(
                f"{prec}, {label(name)}: peak {mem(r[col])} against {mem(base[col])} "
                f"checkpointing every block (model: {mem(r['model_peak_mb'])} against "
                f"{mem(base['model_peak_mb'])}); {int(r['recomputed_blocks'])} recomputed block "
                f"forwards against {int(base['recomputed_blocks'])}, "
                f"{fmt(r['step_ms_mean'] / base['step_ms_mean'])}× the step time "
                f"(model: {fmt(r['compute_factor'] / base['compute_factor'])}×)."
            )
    return out


def code_sketch() -> str:
    """The builders and the runner of core/checkpoint_plans.py, as the report's code sketch."""
    parts = [checkpoint_plans._halving, checkpoint_plans._chain, checkpoint_plans.run_plan]
    return "\n\n".join(inspect.getsource(p).rstrip() for p in parts)


def context(results_dir: Path) -> dict:
    df = load(results_dir, "checkpointing")
    acc = load(results_dir, "checkpointing_saved")
    out = {"accounting": accounting_context(acc), "available": len(df) > 0}
    out["sketch"] = code_sketch()
    if len(df) == 0:
        return out
    first = df.iloc[0]
    out.update(
        {
            "cuda": _cuda(df),
            "setting": (
                f"{first['size']} ({int(first['d_model'])}/{int(first['d_ff'])}/"
                f"{int(first['num_layers'])} layers/{int(first['num_heads'])} heads, vocabulary "
                f"{int(first['vocab_size'])}), batch {int(first['batch_size'])}, sequence "
                f"{int(first['context_length'])}, {first['device']}"
            ),
            "num_layers": int(first["num_layers"]),
            "table": md_table(strategy_table(df)),
            "nested": nested_sentences(df),
            "best": [b for p in df["precision"].unique() if (b := best_block_size(df, p))],
            "reconciled": reconcile(df, load(results_dir, "memory")),
        }
    )
    return out


def reconcile(df: pd.DataFrame, memory: pd.DataFrame) -> list[str]:
    """The memory stage's same configuration (size, context, precision, strategy, a training
    step) beside this stage's peak, and why the two differ: this stage keeps the gradients
    allocated through the step (zeroed in place), the memory stage's step frees them before
    forward and makes them again in backward."""
    if memory.empty or "checkpoint" not in memory or "peak_allocated_mb" not in df:
        return []
    out = []
    m = memory[(memory["mode"] == "train_step") & (memory["status"] == "ok")]
    for _, r in df[(df["status"] == "ok") & df["peak_allocated_mb"].notna()].iterrows():
        same = m[
            (m["size"] == r["size"])
            & (m["context_length"] == r["context_length"])
            & (m["precision"] == r["precision"])
            & (m["checkpoint"].fillna("none") == r["strategy"])
            & (m["batch_size"] == r["batch_size"])
        ]
        if same.empty:
            continue
        o = same.iloc[0]
        diff = r["peak_allocated_mb"] - o["peak_allocated_mb"]
        grads = o.get("grads_mb", math.nan)
        out.append(
            f"{r['precision']}, {label(r['strategy'])}: {mem(r['peak_allocated_mb'])} here, "
            f"{mem(o['peak_allocated_mb'])} in the memory stage's same configuration (a "
            f"difference of {mem(diff)}). This stage's step keeps the gradients allocated "
            f"(zeroed in place: {mem(grads)} held from its start), the memory stage's frees them "
            "before forward and makes them again in backward, so at its peak only the "
            "gradients made by then are held"
            + (
                "; the difference is below the gradients' size, as it must be."
                if 0 <= diff <= grads * 1.02
                else f"; a difference outside 0 to {mem(grads)} is not explained by that."
            )
        )
    return out


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "checkpointing")
    path = Path(fig_dir) / "checkpointing_strategies.png"
    if len(df) == 0:
        return [empty_figure(path, "no checkpointing data")]
    col = peak_column(df)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for prec, g in df.groupby("precision", sort=False):
        x = range(len(g))
        measured = g[col].where(g["status"] == "ok")
        axes[0].plot(x, measured * GiB_PER_MiB, "o-", label=f"{prec} measured")
        axes[0].plot(x, g["model_peak_mb"] * GiB_PER_MiB, "x--", label=f"{prec} model")
        axes[1].plot(x, g["step_ms_mean"].where(g["status"] == "ok"), "o-", label=prec)
        for ax in axes:
            ax.set_xticks(list(x), list(g["strategy"]), rotation=45, ha="right")
    axes[0].set_ylabel("peak above parameters, grads, optimizer (GiB)")
    axes[1].set_ylabel("training step (ms)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    return [save(fig, path)]


if __name__ == "__main__":
    plot_main(plot)
