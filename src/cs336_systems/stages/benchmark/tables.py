"""The benchmark's engines table: the training step through each engine (analysis.py renders it)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import fmt, sort_sizes

PIPELINED = ("pipelined_ms", "pipelined_mfu")


def engines_table(df: pd.DataFrame) -> pd.DataFrame:
    """Train-step time per (size, context, precision, compile) through each engine, and the
    plain step's time over each (speedup); the plain model's row is its naive-attention one
    where the sweep has several attentions at that point."""
    if "engine" not in df or set(df["engine"].dropna()) <= {"plain"}:
        return pd.DataFrame()
    d = df[(df["mode"] == "train_step")]
    keys = ["size", "context_length", "precision", "compile"]
    out = []
    for key, g in d.groupby(keys, sort=False):
        row = dict(zip(keys, key, strict=True))
        if "attention" in g:  # the plain model as the handout builds it: naive attention
            naive = (g["engine"] == "plain") & (g["attention"] == "naive")
            if naive.any():
                g = g[(g["engine"] != "plain") | naive]
        by = {r["engine"]: r for _, r in g.iterrows()}
        plain = by.get("plain")
        for engine, r in by.items():
            ms = r.get("step_ms_mean")
            ok_ = r["status"] == "ok"
            # a point that did not run: its kind here, its reason in "Points that did not run"
            row[f"{engine} (ms)"] = fmt(ms) if ok_ else str(r["status"]).split(":")[0]
            if engine != "plain" and ok_ and plain is not None and plain["status"] == "ok":
                row[f"{engine} speedup"] = f"{plain['step_ms_mean'] / ms:.2f}×"
            pipe, mfu = (pd.to_numeric(r.get(c), errors="coerce") for c in PIPELINED)
            if ok_ and pd.notna(pipe):  # back to back (a training loop's rate), its MFU
                flag = " (suspect)" if str(r.get("sanity", "") or "").strip() else ""
                row[f"{engine} pipelined (ms)"] = fmt(pipe)
                row[f"{engine} pipelined MFU"] = f"{mfu:.1%}{flag}" if pd.notna(mfu) else "–"
        out.append(row)
    return sort_sizes(pd.DataFrame(out))
