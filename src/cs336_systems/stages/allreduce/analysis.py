"""Report context and figures for the `allreduce` stage (question 22)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    ALLREDUCE_GROUP,
    empty_figure,
    fit_latency_bandwidth,
    fmt,
    load,
    mark_suspect,
    md_table,
    ok,
    plot_main,
    ran,
    save,
)

GROUP = ALLREDUCE_GROUP


def _with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) and "buffers" not in df:
        df = df.assign(buffers="default")
    return df


def _size_label(mib: float) -> str:
    """A message size given in MiB (the CSV's `size_mb`: 2**20 bytes), as MiB or GiB."""
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def pivot(df: pd.DataFrame, backend: str, buffers: str = "default") -> str:
    """Rows: message size; columns: world size; cells: median time (busbw), every point that
    ran (a suspect one marked)."""
    d = ran(_with_defaults(df))
    d = d[(d["backend"] == backend) & (d["buffers"] == buffers)]
    if len(d) == 0:
        return ""
    d = d.assign(
        cell=[
            mark_suspect(f"{fmt(t, 3)} ms ({fmt(bw, 2)} GB/s)", flag)
            for t, bw, flag in zip(
                d.time_ms_median, d.busbw_gbps, sanity.is_suspect(d), strict=True
            )
        ]
    )
    t = d.pivot_table(index="size_mb", columns="world_size", values="cell", aggfunc="first")
    t = t.reset_index().sort_values("size_mb")
    t["size_mb"] = t["size_mb"].map(_size_label)
    t.columns = ["message"] + [f"n = {c}" for c in t.columns[1:]]
    return md_table(t)


def _size_sentence(label: str, n: int, h: pd.DataFrame, backend: str) -> str:
    """How bus bandwidth moves from the smallest message to the largest (sorted `h`), naming a
    peak in between; the why only where it rises, and the bound by backend: NCCL's links, gloo's
    host processes copying and adding the data."""
    lo, hi, top = h.iloc[0], h.iloc[-1], h.loc[h["busbw_gbps"].idxmax()]
    verb = "rises" if hi.busbw_gbps > lo.busbw_gbps else "falls"
    text = (
        f"{label}, {n} processes: bus bandwidth {verb} from {fmt(lo.busbw_gbps)} GB/s at "
        f"{_size_label(lo.size_mb)} to {fmt(hi.busbw_gbps)} GB/s at {_size_label(hi.size_mb)} "
        f"({fmt(hi.busbw_gbps / lo.busbw_gbps, 1)}×)"
    )
    if top.size_mb not in (lo.size_mb, hi.size_mb):
        text += f", peaking at {fmt(top.busbw_gbps)} GB/s at {_size_label(top.size_mb)}"
    if verb == "falls":
        return text + "."
    bound = (
        "large ones approach what the links carry"
        if backend == "nccl"
        else "large ones are bound by how fast the host processes copy and add the data"
    )
    return text + f": small messages pay the fixed cost of each call, {bound}."


def _sentences(d: pd.DataFrame, shown: pd.DataFrame) -> list[str]:
    """One sentence per curve of the points that passed the checks (`d`), saying how many
    suspect points of the curve (in `shown`, every point that ran) it leaves out."""
    out = []
    suspect = shown[sanity.is_suspect(shown)]
    for (backend, buffers), g in d.groupby(["backend", "buffers"]):
        label = backend + ("" if buffers == "default" else f" ({buffers} buffers)")
        for n, h in g.groupby("world_size"):
            h = h.sort_values("size_mb")
            if len(h) < 2:
                continue
            n_out = int(
                (
                    (suspect["backend"] == backend)
                    & (suspect["buffers"] == buffers)
                    & (suspect["world_size"] == n)
                ).sum()
            )
            text = _size_sentence(label, n, h, backend)
            out.append(text[:-1] + sanity.excluded(n_out) + "." if n_out else text)
        sizes = sorted(set.intersection(*(set(h["size_mb"]) for _, h in g.groupby("world_size"))))
        if g["world_size"].nunique() > 1 and sizes:
            big = g[g["size_mb"] == sizes[-1]].sort_values("world_size")
            parts = ", ".join(
                f"n = {r.world_size}: {fmt(r.time_ms_median, 3)} ms, busbw {fmt(r.busbw_gbps)} GB/s"
                for r in big.itertuples()
            )
            out.append(
                f"{label} at {_size_label(sizes[-1])} across world sizes: {parts}. Each rank "
                f"sends and receives 2(n-1)/n of the message in a ring, so time grows with n "
                f"while busbw, which divides that factor out, shows how well the links are used."
            )
    return out


def _span(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def context(results_dir: Path) -> dict:
    df = _with_defaults(load(results_dir, "allreduce"))
    if len(df) == 0:
        return {"available": False}
    d = ok(df)
    shown = ran(df)
    statuses = df["status"].value_counts().to_dict()
    tables = {}
    for backend in ("gloo", "nccl"):
        for buffers in sorted(set(df["buffers"])):
            text = pivot(df, backend, buffers)
            if text:
                tables[backend + ("" if buffers == "default" else f" ({buffers} buffers)")] = text
    fits = fit_latency_bandwidth(df)  # suspect rows left out
    fit_table = (
        md_table(
            fits[
                [*GROUP, "latency_us", "bandwidth_gbps", "max_rel_residual", "points", "suspect"]
            ].rename(
                columns={
                    "latency_us": "latency o (us)",
                    "bandwidth_gbps": "bandwidth w (GB/s)",
                    "max_rel_residual": "max rel. residual",
                    "points": "points fitted",
                    "suspect": "suspect points left out",
                }
            )
        )
        if len(fits)
        else ""
    )
    # one row per (backend, buffers, world size, reason), with how many points it stands for
    bad = df[df["status"] != "ok"]
    skipped = (
        bad.groupby(["backend", "buffers", "world_size", "status"], sort=False)
        .size()
        .reset_index(name="points")[["backend", "buffers", "world_size", "points", "status"]]
        .rename(columns={"world_size": "world size"})
    )
    compare = ""
    common = d.groupby("size_mb")["backend"].nunique()
    both = [s for s, k in common.items() if k > 1]
    if both:
        s = max(both)
        at = d[(d["size_mb"] == s) & (d["buffers"] == "default")]
        g = at[at["backend"] == "gloo"].set_index("world_size")["time_ms_median"]
        n = at[at["backend"] == "nccl"].set_index("world_size")["time_ms_median"]
        ws = sorted(set(g.index) & set(n.index))
        if ws:
            compare = "; ".join(
                f"n = {w}: gloo {fmt(g[w], 3)} ms vs NCCL {fmt(n[w], 3)} ms ({fmt(g[w] / n[w], 0)}×)"
                for w in ws
            )
            compare = f"At {_size_label(s)}, {compare}."
    best = {}
    for backend, g in d.groupby("backend"):
        r = g.loc[g["busbw_gbps"].idxmax()]
        best[backend] = (
            f"{fmt(r.busbw_gbps)} GB/s ({_size_label(r.size_mb)}, n = {r.world_size}, "
            f"{r.buffers} buffers)"
        )
    nccl_note = ""
    if "nccl" in set(df["backend"]) and len(d[d["backend"] == "nccl"]) == 0:
        reasons = sorted(set(df[df["backend"] == "nccl"]["status"]))
        nccl_note = (
            "NCCL was not measured on this machine: "
            + "; ".join(reasons)
            + ". A host with that many GPUs measures it (`snakemake --cores 1 report` there)."
        )
    iters = ""
    if len(shown):
        iters = (
            f"Per point {_span(shown['warmup'])} warm-up all-reduces, then "
            f"{_span(shown['repeats'])} "
            f"timed samples (fewer for large messages, within a time budget per point)"
        )
    used = set(shown["backend"]) if len(shown) else set(df["backend"])
    how = {"gloo": "gloo between CPU processes", "nccl": "NCCL with one process per GPU"}
    return {
        "available": True,
        "backends_text": ", ".join(how[b] for b in ("gloo", "nccl") if b in used),
        "n_points": len(df),
        "n_ran": len(shown),
        "n_suspect": sanity.n_suspect(shown),
        "statuses": statuses,
        "tables": tables,
        "fit_table": fit_table,
        "failed_table": md_table(skipped) if len(skipped) else "",
        "sentences": _sentences(d, shown),
        "compare": compare,
        "best": best,
        "nccl_note": nccl_note,
        "iterations": iters,
        "max_rel_err": float(shown["max_rel_err"].max()) if len(shown) else math.nan,
    }


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = _with_defaults(load(results_dir, "allreduce"))
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"allreduce_{n}.png" for n in ("bandwidth", "time")}
    d = ok(df) if len(df) else df
    if len(d) == 0:
        return [empty_figure(p, "no successful all-reduce points") for p in paths.values()]
    out = []
    for name, column, ylabel in (
        ("bandwidth", "busbw_gbps", "bus bandwidth (GB/s)"),
        ("time", "time_ms_median", "time per all-reduce (ms, median)"),
    ):
        backends = sorted(set(d["backend"]))
        fig, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 3.8), squeeze=False)
        for ax, backend in zip(axes[0], backends, strict=True):
            g = d[d["backend"] == backend]
            for (buffers, n), h in g.groupby(["buffers", "world_size"]):
                h = h.sort_values("size_mb")
                style = "-" if buffers == "default" else "--"
                label = f"n = {n}" + ("" if buffers == "default" else f", {buffers}")
                ax.plot(h["size_mb"], h[column], style, marker="o", label=label)
            ax.set_xscale("log")
            if name == "time":
                ax.set_yscale("log")
            ax.set_xlabel("message size (MiB, float32)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{backend} ({'GPU' if backend == 'nccl' else 'CPU'})")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        out.append(save(fig, paths[name]))
    return out


if __name__ == "__main__":
    plot_main(plot)
