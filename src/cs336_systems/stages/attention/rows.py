"""The `attention` stage's rows as the report reads them: the points in the report's order,
eager over compiled speed-ups, the timing table (with the memory before backward), the points
that did not run, the torch.compile table and the whole model's eager against compiled step
times (benchmark stage). Used by analysis.py, answers.py and figures.py."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.reporting.analysis import fmt, md_table
from cs336_systems.reporting.analysis import ok as trusted

IMPL_ORDER = {"naive_eager": 0, "naive_compiled": 1}


def points(df: pd.DataFrame) -> pd.DataFrame:
    """The rows in the report's order: eager, then compiled, each by head dim and length."""
    order = df["impl"].map(lambda i: IMPL_ORDER.get(i, 9))
    return df.assign(_o=order).sort_values(["_o", "d_head", "seq_len"]).drop(columns="_o")


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


def failed_table(df: pd.DataFrame) -> str:
    """The points that did not run, with why (and where an out-of-memory error struck)."""
    failed = df[df["status"] != "ok"]
    if not len(failed):
        return ""
    return md_table(
        failed[[c for c in ["impl", "d_head", "seq_len", "status", "oom_phase"] if c in failed]]
    )


def compile_table(sp: pd.DataFrame) -> str:
    """The speed-ups of `speedups` as the report shows them."""
    shown = sp.assign(
        fwd_speedup=sp["fwd_speedup"].map(lambda v: f"{v:.2f}×"),
        bwd_speedup=sp["bwd_speedup"].map(lambda v: f"{v:.2f}×"),
    )
    return md_table(shown.rename(columns={"d_head": "d", "seq_len": "n"}))


def model_compile(bench: pd.DataFrame) -> pd.DataFrame:
    """Eager against compiled step time of the whole model (the benchmark stage's trusted rows
    with naive attention), per point both ran, with the speed-up; empty where none."""
    ok = trusted(bench)
    keys = ["size", "context_length", "mode", "precision"]
    if "attention" in ok:
        ok = ok[ok["attention"] == "naive"]
    eager = ok[ok["compile"] == "eager"].set_index(keys)["step_ms_mean"]
    comp = ok[ok["compile"] == "compiled"].set_index(keys)["step_ms_mean"]
    both = eager.index.intersection(comp.index)
    if len(both) == 0:
        return pd.DataFrame()
    table = pd.DataFrame({"eager ms": eager.loc[both], "compiled ms": comp.loc[both]}).reset_index()
    table["speedup"] = table["eager ms"] / table["compiled ms"]
    return table


def model_compile_table(table: pd.DataFrame) -> str:
    """`model_compile`'s frame as the report shows it."""
    return md_table(table.assign(speedup=table["speedup"].map(lambda v: f"{v:.2f}×")))
