"""The benchmark section's tables: latency per point, the phases of a training step, the warm-up
sweep, the speedups, MFU per size, and the training step through each engine."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    SIZE_ORDER,
    fmt,
    mark_suspect,
    md_table,
    ordered_sizes,
    pct,
    ran,
    size_key,
    sort_sizes,
)
from cs336_systems.stages.benchmark.rows import MODE_LABEL, eager_naive, parts_vs_whole

PIPELINED = ("pipelined_ms", "pipelined_mfu")


def latency_table(df: pd.DataFrame, precision: str) -> str:
    """Every eager point that ran, suspect ones marked."""
    d = eager_naive(ran(df))
    d = d[d["precision"] == precision]
    if len(d) == 0:
        return ""
    flags = sanity.is_suspect(d)
    d = d.assign(
        cell=[
            mark_suspect(f"{fmt(m)} ± {fmt(s)}", bool(f))
            for m, s, f in zip(d.step_ms_mean, d.step_ms_std, flags, strict=True)
        ]
    )
    t = d.pivot_table(
        index=["size", "context_length"], columns="mode", values="cell", aggfunc="first"
    )
    t = t.reset_index()
    t = sort_sizes(t, "context_length")
    t.columns.name = None
    t = t.rename(columns={m: f"{MODE_LABEL[m]} (ms)" for m in MODE_LABEL})
    return md_table(t)


def phase_table(
    t: pd.DataFrame, t_all: pd.DataFrame, prec: str, ctx: int, names: list[str], ran_sizes: set,
    host: set | None = None,
) -> str:  # fmt: skip
    """One precision's training step at `ctx` split into its phases, one row per size of
    `names` (`tiny` where it ran): the medians of the points that passed the checks (`t`),
    else why the size has none (its row among every point, `t_all`)."""
    rows = []
    g = t[t["precision"] == prec].set_index("size")
    every = t_all[(t_all["precision"] == prec) & (t_all["context_length"] == ctx)]
    every = every.set_index("size")
    pw = parts_vs_whole(g) if len(g) else None
    for size in ordered_sizes([n for n in names if n != "tiny" or n in ran_sizes]):
        if size in g.index:
            r, w = g.loc[size], pw.loc[size]
            # the parts against the whole (means: they add); over it, flagged with the gap
            whole = pct(w.share) + (f" ⚠ {fmt(-w.gap_ms)} ms over the step" if w.over else "")
            rows.append(
                {
                    "size": size,
                    "forward (ms)": fmt(r.fwd_ms_median, 2),
                    "backward (ms)": fmt(r.bwd_ms_median, 2),
                    "optimizer (ms)": fmt(r.opt_ms_median, 2),
                    "step (ms)": fmt(r.step_ms_median, 2),
                    "optimizer share": pct(r.opt_ms_median / r.step_ms_median),
                    f"phases / step ({pw.attrs['stat']}s)": whole,
                    "host-bound (rule)": "yes: left out" if size in (host or set()) else "no",
                }
            )
        else:
            why = str(every.loc[size, "status"]) if size in every.index else "not run"
            if why == "ok":  # ran, but failed a sanity check
                why = "⚠ suspect (see Suspect numbers): left out"
            rows.append({"size": size, "forward (ms)": why})
    return md_table(pd.DataFrame(rows).fillna("–"))


def warmup_table(g: pd.DataFrame) -> str:
    """One size's warm-up sweep (`g`: its summary by warm-up count)."""
    cols = ["warmup_steps", "mean_ms", "std_ms", "median_ms", "first_measured_ms"]
    return md_table(g.reset_index()[cols])


def speedup_table(sp: pd.DataFrame) -> str:
    """The median speedup per size (rows) and mode (columns)."""
    per_size = sp.groupby(["size", "mode"], as_index=False)["speedup"].median()
    per_size = per_size.sort_values(
        ["size", "mode"], key=lambda c: size_key(c) if c.name == "size" else c
    )
    t = per_size.pivot(index="size", columns="mode", values="speedup")
    t = t.reindex([x for x in SIZE_ORDER if x in t.index])
    t.columns = [MODE_LABEL.get(c, c) for c in t.columns]
    return md_table(t.reset_index())


def compile_table(df: pd.DataFrame) -> str:
    """torch_compile (b): every compiled point that ran beside its eager twin (naive attention,
    the plain model): one row per size, context, precision and mode (forward, forward+backward,
    training step), the two times and the speedup; a suspect time is marked, not dropped, so
    the table has every mode the run compiled."""
    d = ran(df)
    d = d[d["attention"] == "naive"]
    if "engine" in d:
        d = d[d["engine"].fillna("plain") == "plain"]
    keys = ["size", "context_length", "precision", "mode"]
    flags = sanity.is_suspect(d)
    d = d.assign(_flag=flags.to_numpy())
    e = d[d["compile"] == "eager"].set_index(keys)
    c = d[d["compile"] == "compiled"].set_index(keys)
    rows = []
    for k in c.index:
        if k not in e.index:
            continue
        a, b = e.loc[k], c.loc[k]
        rows.append(
            {
                **dict(zip(keys, k, strict=True)),
                "eager (ms)": mark_suspect(fmt(a.step_ms_mean), bool(a._flag)),
                "compiled (ms)": mark_suspect(fmt(b.step_ms_mean), bool(b._flag)),
                "speedup": f"{a.step_ms_mean / b.step_ms_mean:.2f}×"
                + (" ⚠" if a._flag or b._flag else ""),
            }
        )
    if not rows:
        return ""
    t = pd.DataFrame(rows)
    t["_m"] = t["mode"].map(list(MODE_LABEL).index)
    t = sort_sizes(t, "context_length", "precision", "_m").drop(columns="_m")
    t["mode"] = t["mode"].map(MODE_LABEL)
    return md_table(t.reset_index(drop=True))


def mfu_table(t: pd.DataFrame) -> str:
    """The training steps' best MFU (%) per size (rows) and precision x compile (columns),
    each cell against the measured ceiling and, after a slash, against the datasheet's peak
    (the same point's)."""
    best = t.loc[t.groupby(["size", "precision", "compile"])["mfu"].idxmax()]
    sheet = best.get("mfu_datasheet", pd.Series(float("nan"), index=best.index))
    best = best.assign(
        cell=[
            f"{100 * m:.1f} / " + ("–" if pd.isna(s) else f"{100 * s:.1f}")
            for m, s in zip(best["mfu"], sheet, strict=True)
        ]
    )
    m = best.pivot_table(index="size", columns=["precision", "compile"], values="cell",
                         aggfunc="first")  # fmt: skip
    m = m.reindex(ordered_sizes(m.index))
    m.columns = [f"{p} {c}" for p, c in m.columns]
    m = m.fillna("–")
    return md_table(m.reset_index())


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
                # against the measured ceiling / against the datasheet's peak
                sheet = pd.to_numeric(r.get("pipelined_mfu_datasheet"), errors="coerce")
                cell = f"{mfu:.1%}" if pd.notna(mfu) else "–"
                cell += f" / {sheet:.1%}" if pd.notna(sheet) else " / –"
                row[f"{engine} pipelined MFU"] = cell + flag
        out.append(row)
    return sort_sizes(pd.DataFrame(out))
