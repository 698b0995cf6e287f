"""The `checkpointing` section's answers in words: what one RMSNorm and one block save, eager
and compiled, against the analytic model (Q29); the nested strategies against one level and the
code that builds them (Q30); the best one-level block size and its neighbours (Q31); the run's
setting; and this stage's peak beside the memory stage's same configuration."""

from __future__ import annotations

import inspect
import math

import pandas as pd

from cs336_systems.core import checkpoint_plans, costs
from cs336_systems.planning.edition import DEFAULT_EDITION, size_table
from cs336_systems.reporting.analysis import fmt, plural
from cs336_systems.stages.checkpointing.rows import GiB_PER_MiB, MiB, label, peak_column


def mem(mib: float) -> str:
    """MiB as prose: GiB from 1 GiB up."""
    return f"{fmt(mib / 1024)} GiB" if mib >= 1024 else f"{fmt(mib)} MiB"


# ---- Q29: saved-tensor accounting ------------------------------------------------------------


def saved_sentences(acc: pd.DataFrame, t: pd.DataFrame) -> list[str]:
    """Per module run eager and compiled: what it saves and what fusion removes; then an eager
    block with its input against the analytic model, over every layer. `t`: the totals by
    module and compile mode (rows.py `saved_totals`)."""
    out = []
    for mod in ("rmsnorm", "block"):
        if (mod, "eager") in t.index and (mod, "compiled") in t.index:
            e, c = t.loc[(mod, "eager")], t.loc[(mod, "compiled")]
            name = "One RMSNorm" if mod == "rmsnorm" else "One TransformerBlock"
            out.append(
                f"{name} saves {fmt(e['activations MiB'])} MiB of activations eager "
                f"({plural(int(e['activation saves']), 'save')}, {fmt(e['sum of every save MiB'])} MiB "
                f"if every save is counted as the handout's hook does) besides its "
                f"{fmt(e['input MiB'])} MiB input; compiled, {fmt(c['activations MiB'])} MiB "
                f"({plural(int(c['activation saves']), 'save')}): fusion removes "
                f"{fmt(e['activations MiB'] - c['activations MiB'])} MiB "
                f"({(1 - c['activations MiB'] / e['activations MiB']):.0%})."
            )
    if ("block", "eager") in t.index:
        out.append(_block_sentence(acc.iloc[0], t))
    return out


def _block_sentence(first: pd.Series, t: pd.DataFrame) -> str:
    """An eager block with its input against the analytic model, and over every layer."""
    b, n, d = int(first["batch_size"]), int(first["context_length"]), int(first["d_model"])
    h, f = int(first["num_heads"]), int(first["d_ff"])
    layers = int(checkpointing_size_layers(first["size"], first.get("edition")))
    model = costs.block_saved_bytes(b, n, d, h, f, "fp32", "cuda")
    e = t.loc[("block", "eager")]
    per_block = e["activations MiB"] + e["input MiB"]
    return (
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


def checkpointing_size_layers(size: str, edition=None) -> int:
    edition = DEFAULT_EDITION if pd.isna(edition) else int(edition)
    return size_table(edition)[size]["num_layers"]


# ---- Q30-31: strategies ----------------------------------------------------------------------


def setting(first: pd.Series) -> str:
    """The model, batch, sequence and device the strategies ran with (an own model: its
    factory and repeated blocks, docs/own-model.md)."""
    if isinstance(first.get("own_model"), str):
        blocks = first.get("blocks")
        shape = f"`{first['own_model']}`, " + (
            f"blocks `{blocks}`" if isinstance(blocks, str) else "no repeated blocks"
        )
    else:
        shape = (
            f"{int(first['d_model'])}/{int(first['d_ff'])}/"
            f"{int(first['num_layers'])} layers/{int(first['num_heads'])} heads"
        )
    return (
        f"{first['size']} ({shape}, vocabulary {int(first['vocab_size'])}), batch "
        f"{int(first['batch_size'])}, sequence {int(first['context_length'])}, {first['device']}"
    )


def best_block_size(df: pd.DataFrame, precision: str) -> dict | None:
    """Q31: the one-level block size with the lowest measured peak, its neighbours (the next
    smaller and larger block sizes run), with their peaks, step times and statuses."""
    col = peak_column(df)
    d = df[(df["precision"] == precision) & df["block_size"].notna()].copy()
    d["block_size"] = d["block_size"].astype(int)
    d = d.sort_values("block_size")
    good = d[d["status"] == "ok"]
    # none either where the analytic model has nothing to set beside it (an own model)
    if len(good) == 0 or d["model_peak_mb"].isna().all():
        return None
    best = good.loc[good[col].idxmin()]
    ks = list(d["block_size"])
    i = ks.index(int(best["block_size"]))

    def describe(r, named: bool = True) -> str:
        k = f"k = {int(r['block_size'])}: " if named else ""
        if r["status"] != "ok":
            return f"{k}{r['status']}"
        total = r.get("peak_allocated_mb", math.nan)
        extra = f" ({mem(total)} in all)" if total == total else ""
        return (
            f"{k}peak {mem(r[col])} above the step's start{extra}, "
            f"{fmt(r['step_ms_mean'])} ms per step"
        )

    neighbours = [d.iloc[j] for j in (i - 1, i + 1) if 0 <= j < len(d)]
    n_layers = int(best["num_layers"])
    a, B = best["model_boundary_mb"], best["model_block_mb"]
    times = good["step_ms_mean"]
    return {
        "precision": precision,
        "k": int(best["block_size"]),
        "best": describe(best, named=False),
        "neighbours": [describe(r) for r in neighbours],
        "none_smaller": i == 0,
        "none_larger": i == len(d) - 1,
        "smaller": smaller_units(df, precision),
        "k_star": math.sqrt(n_layers * a / B),
        "model_k": int(d.loc[d["model_peak_mb"].idxmin(), "block_size"]),
        "boundary_mb": a,
        "block_mb": B,
        "num_layers": n_layers,
        "time_spread": time_spread(
            times, int(best["recomputed_blocks"]), int(best.get("measure_steps", 1))
        ),
    }


# the sub-block strategies as a sentence names them
SUB_LABEL = {
    "attn": "the attention half alone",
    "ffn": "the FFN half alone",
    "halves": "both halves, each on its own",
}


def _unit(name: str) -> str:
    return SUB_LABEL.get(name) or label(name)


def smaller_units(df: pd.DataFrame, precision: str) -> str:
    """Q31 below a block: each sub-block strategy's measured peak (core/checkpoint_plans.py
    ``attn``, ``ffn``, ``halves``) against checkpointing every block, and which of them all is
    lowest; or why none was measured."""
    col = peak_column(df)
    d = df[df["precision"] == precision].set_index("strategy")
    subs = [s for s in checkpoint_plans.SUB_BLOCK if s in d.index]
    if not subs:
        return (
            "No unit smaller than a block was measured in this run (`checkpointing.sub_block` "
            "is empty), so whether one beats k = 1 is not answered here."
        )
    whole = d.loc["every_1"] if "every_1" in d.index else None
    base = whole[col] if whole is not None and whole["status"] == "ok" else math.nan
    parts = []
    for s in subs:
        r = d.loc[s]
        if r["status"] != "ok":
            parts.append(f"{_unit(s)}: {r['status']}")
            continue
        than = "" if base != base else f", {r[col] / base:.2f}× k = 1's"
        parts.append(f"{_unit(s)}: peak {mem(r[col])}{than}, {fmt(r['step_ms_mean'])} ms per step")
    text = "Units smaller than a block (checkpoints inside every block): "
    text += "; ".join(parts) + "."
    ran = d[(d["status"] == "ok") & (d.index.isin(subs) | d["block_size"].notna())]
    if len(ran) and ran[col].notna().any():
        best = ran[col].idxmin()
        kind = "a unit smaller than a block" if best in subs else "whole blocks"
        text += (
            f" The lowest measured peak of these and every block size: {_unit(best)} "
            f"({mem(ran.loc[best, col])}), {kind}."
        )
    return text


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
            if pd.isna(r["recomputed_blocks"]):  # an own model: no analytic model
                out.append(
                    f"{prec}, {label(name)}: peak {mem(r[col])} against {mem(base[col])} "
                    f"checkpointing every block, {fmt(r['step_ms_mean'] / base['step_ms_mean'])}"
                    "× the step time."
                )
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
