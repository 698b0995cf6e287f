"""The `checkpointing` stage's rows as the report reads them: a strategy's label, the column
that holds what a strategy adds to memory, the saved-tensor accounting's tables (totals, each
tensor, by op, by part of the block) and the strategies' table. Used by analysis.py, answers.py
and figures.py."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core import checkpoint_plans
from cs336_systems.reporting.analysis import md_table, ok

MiB = 2**20
GiB_PER_MiB = 1 / 1024
STRATEGY_LABEL = {
    "none": "no checkpointing",
    "sqrt": "one level, ~sqrt(N) segments",
    "halving": "nested: recursive halving",
    "chain": "nested: prefixes (chain)",
    "attn": "in each block: its attention half",
    "ffn": "in each block: its FFN half",
    "halves": "in each block: both halves apart",
}


def label(name: str) -> str:
    k = checkpoint_plans.block_size_of(name)
    return f"one level, every {k} block{'s' if k > 1 else ''}" if k else STRATEGY_LABEL[name]


def is_cuda(df: pd.DataFrame) -> bool:
    return "peak_activation_mb" in df and df["peak_activation_mb"].notna().any()


def peak_column(df: pd.DataFrame) -> str:
    """What a strategy adds to memory during a step: on CUDA the allocator's peak above the
    memory before the step (parameters, gradients, optimizer state); elsewhere the peak of
    live tensors the step created (LiveTensorBytes)."""
    return "peak_activation_mb" if is_cuda(df) else "peak_live_mb"


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


def saved_tables(acc: pd.DataFrame, t: pd.DataFrame) -> dict[str, str]:
    """Each module's tables where its runs are in the totals `t` (by module and compile mode):
    the RMSNorm's every saved tensor, the block's activation bytes by op; eager, then compiled."""
    out = {}
    for mod in ("rmsnorm", "block"):
        key = "rmsnorm_table" if mod == "rmsnorm" else "block_by_op"
        for compile_, suffix in (("eager", ""), ("compiled", "_compiled")):
            if (mod, compile_) in t.index:
                out[key + suffix] = (
                    md_table(tensor_table(acc, mod, compile_))
                    if mod == "rmsnorm"
                    else md_table(by_op(acc, compile_))
                )
    return out


def failed_table(acc: pd.DataFrame) -> str:
    failed = acc[acc["status"] != "ok"][["module_kind", "compile", "status"]]
    return md_table(failed) if len(failed) else ""


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
