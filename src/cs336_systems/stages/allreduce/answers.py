"""The `allreduce` section's answers in words (Q22), from the points that passed the checks:
how bus bandwidth moves with the message size per curve, the largest message across world
sizes, gloo against NCCL, each backend's best, why NCCL was not measured, and how many
iterations a point ran."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import fmt
from cs336_systems.stages.allreduce.rows import size_label


def size_sentence(label: str, n: int, h: pd.DataFrame, backend: str) -> str:
    """How bus bandwidth moves from the smallest message to the largest (sorted `h`), naming a
    peak in between; the why only where it rises, and the bound by backend: NCCL's links, gloo's
    host processes copying and adding the data."""
    lo, hi, top = h.iloc[0], h.iloc[-1], h.loc[h["busbw_gbps"].idxmax()]
    verb = "rises" if hi.busbw_gbps > lo.busbw_gbps else "falls"
    text = (
        f"{label}, {n} processes: bus bandwidth {verb} from {fmt(lo.busbw_gbps)} GB/s at "
        f"{size_label(lo.size_mb)} to {fmt(hi.busbw_gbps)} GB/s at {size_label(hi.size_mb)} "
        f"({fmt(hi.busbw_gbps / lo.busbw_gbps, 1)}×)"
    )
    if top.size_mb not in (lo.size_mb, hi.size_mb):
        text += f", peaking at {fmt(top.busbw_gbps)} GB/s at {size_label(top.size_mb)}"
    if verb == "falls":
        return text + "."
    bound = (
        "large ones approach what the links carry"
        if backend == "nccl"
        else "large ones are bound by how fast the host processes copy and add the data"
    )
    return text + f": small messages pay the fixed cost of each call, {bound}."


def sentences(d: pd.DataFrame, shown: pd.DataFrame) -> list[str]:
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
            text = size_sentence(label, n, h, backend)
            out.append(text[:-1] + sanity.excluded(n_out) + "." if n_out else text)
        sizes = sorted(set.intersection(*(set(h["size_mb"]) for _, h in g.groupby("world_size"))))
        if g["world_size"].nunique() > 1 and sizes:
            big = g[g["size_mb"] == sizes[-1]].sort_values("world_size")
            parts = ", ".join(
                f"n = {r.world_size}: {fmt(r.time_ms_median, 3)} ms, busbw {fmt(r.busbw_gbps)} GB/s"
                for r in big.itertuples()
            )
            out.append(
                f"{label} at {size_label(sizes[-1])} across world sizes: {parts}. Each rank "
                f"sends and receives 2(n-1)/n of the message in a ring, so time grows with n "
                f"while busbw, which divides that factor out, shows how well the links are used."
            )
    return out


def compare(d: pd.DataFrame) -> str:
    """gloo against NCCL at the largest message both measured, per common world size."""
    common = d.groupby("size_mb")["backend"].nunique()
    both = [s for s, k in common.items() if k > 1]
    if not both:
        return ""
    s = max(both)
    at = d[(d["size_mb"] == s) & (d["buffers"] == "default")]
    g = at[at["backend"] == "gloo"].set_index("world_size")["time_ms_median"]
    n = at[at["backend"] == "nccl"].set_index("world_size")["time_ms_median"]
    ws = sorted(set(g.index) & set(n.index))
    if not ws:
        return ""
    text = "; ".join(
        f"n = {w}: gloo {fmt(g[w], 3)} ms vs NCCL {fmt(n[w], 3)} ms ({fmt(g[w] / n[w], 0)}×)"
        for w in ws
    )
    return f"At {size_label(s)}, {text}."


def best(d: pd.DataFrame) -> dict[str, str]:
    """Each backend's highest bus bandwidth, with where it was reached."""
    out = {}
    for backend, g in d.groupby("backend"):
        r = g.loc[g["busbw_gbps"].idxmax()]
        out[backend] = (
            f"{fmt(r.busbw_gbps)} GB/s ({size_label(r.size_mb)}, n = {r.world_size}, "
            f"{r.buffers} buffers)"
        )
    return out


def nccl_note(df: pd.DataFrame, d: pd.DataFrame) -> str:
    """Why NCCL was not measured, where it was asked for and no point of it succeeded."""
    if "nccl" not in set(df["backend"]) or len(d[d["backend"] == "nccl"]):
        return ""
    reasons = sorted(set(df[df["backend"] == "nccl"]["status"]))
    return (
        "NCCL was not measured on this machine: "
        + "; ".join(reasons)
        + ". A host with that many GPUs measures it (`snakemake --cores 1 report` there)."
    )


def _span(values: pd.Series) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def iterations(shown: pd.DataFrame) -> str:
    """How many warm-up all-reduces and timed samples the points that ran took."""
    if not len(shown):
        return ""
    return (
        f"Per point {_span(shown['warmup'])} warm-up all-reduces, then "
        f"{_span(shown['repeats'])} "
        f"timed samples (fewer for large messages, within a time budget per point)"
    )
