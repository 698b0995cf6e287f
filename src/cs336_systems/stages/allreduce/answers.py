"""The `allreduce` section's answers in words (Q22), from the points that passed the checks:
how bus bandwidth moves with the message size per curve, the largest message across world
sizes, gloo against NCCL, each backend's best, why NCCL was not measured, and how many
iterations a point ran."""

from __future__ import annotations

import pandas as pd

from cs336_systems.planning.edition import DEFAULT_EDITION
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import fmt, pct
from cs336_systems.stages.allreduce.plan import HANDOUT_GRID
from cs336_systems.stages.allreduce.rows import size_label

WHERE = {"gloo": "CPU processes", "nccl": "GPUs"}


# bus bandwidth within this fraction of the next-smaller size's counts as levelled off
LEVEL = 0.05


def largest_step(h: pd.DataFrame) -> str:
    """How bus bandwidth moves from the next-smaller message to the largest of the sorted `h`:
    within `LEVEL` (it has levelled off), or by how much it still rises or falls there (two
    sizes alone do not place the plateau: the latency-bandwidth fit below does)."""
    prev, hi = h.iloc[-2], h.iloc[-1]
    step = hi.busbw_gbps / prev.busbw_gbps - 1
    than = f"{size_label(prev.size_mb)}'s {fmt(prev.busbw_gbps)} GB/s"
    if abs(step) < LEVEL:
        return f"it has levelled off: {size_label(hi.size_mb)} is within {pct(abs(step))} of {than}"
    if step > 0:
        return f"it still rises at the largest size, {pct(step)} above {than}"
    return f"it falls at the largest size, {pct(-step)} below {than}"


def size_sentence(label: str, n: int, h: pd.DataFrame) -> str:
    """How bus bandwidth moves from the smallest message to the largest (sorted `h`), naming a
    peak in between; where it rises, the fixed cost of a call and whether it still rises at the
    largest size (`largest_step`)."""
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
    return text + f": small messages pay the fixed cost of each call; {largest_step(h)}."


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
            text = size_sentence(label, n, h)
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
    """gloo against NCCL at the smallest and the largest message both measured, per common
    world size (default buffers)."""
    d = d[d["buffers"] == "default"]
    common = d.groupby("size_mb")["backend"].nunique()
    both = sorted(s for s, k in common.items() if k > 1)
    if not both:
        return ""
    out = []
    for s in sorted({both[0], both[-1]}):
        at = d[d["size_mb"] == s]
        g = at[at["backend"] == "gloo"].set_index("world_size")["time_ms_median"]
        n = at[at["backend"] == "nccl"].set_index("world_size")["time_ms_median"]
        ws = sorted(set(g.index) & set(n.index))
        if ws:
            text = "; ".join(
                f"n = {w}: gloo {fmt(g[w], 3)} ms vs NCCL {fmt(n[w], 3)} ms ({fmt(g[w] / n[w], 0)}×)"
                for w in ws
            )
            out.append(f"At {size_label(s)}, {text}.")
    if not out:
        return ""
    at = d[d["size_mb"] == both[-1]].groupby("backend")["time_ms_median"].min()
    if at["gloo"] > at["nccl"]:
        out.append(
            "NCCL moves the data over the GPUs' links and reduces it in GPU kernels; gloo copies "
            "it through host memory and adds it on the CPU."
        )
    return " ".join(out)


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


def _sizes_text(sizes) -> str:
    sizes = sorted(sizes)
    return (
        size_label(sizes[0])
        if len(sizes) == 1
        else f"{size_label(sizes[0])}–{size_label(sizes[-1])}"
    )


def _edition(df: pd.DataFrame) -> int:
    eds = df["edition"].dropna() if "edition" in df else pd.Series(dtype=float)
    return int(eds.iloc[0]) if len(eds) else DEFAULT_EDITION


def grid(df: pd.DataFrame) -> list[str]:
    """The handout's grid against this run's (default buffers): per asked backend and world
    size, the sizes measured, skipped (with why) or not in this preset's grid."""
    edition = _edition(df)
    asked = HANDOUT_GRID.get(edition, HANDOUT_GRID[DEFAULT_EDITION])
    d = df[df["buffers"] == "default"]
    total = len(asked["backends"]) * len(asked["sizes_mb"]) * len(asked["world_sizes"])
    n_ok = 0
    lines = []
    for backend in asked["backends"]:
        for n in asked["world_sizes"]:
            g = d[(d["backend"] == backend) & (d["world_size"] == n)]
            good = set(g[g["status"] == "ok"]["size_mb"]) & set(asked["sizes_mb"])
            n_ok += len(good)
            missing = [x for x in asked["sizes_mb"] if x not in good]
            if not missing:
                continue
            statuses = sorted(set(g[g["size_mb"].isin(missing)]["status"].astype(str)))
            planned = set(g["size_mb"])
            absent = [x for x in missing if x not in planned]
            parts = (
                [f"{'; '.join(statuses)} ({_sizes_text([x for x in missing if x in planned])})"]
                if statuses
                else []
            )
            if absent:
                parts.append(f"not in this preset's grid ({_sizes_text(absent)})")
            lines.append(f"{backend} on {WHERE[backend]}, {n} processes: {', '.join(parts)}")
    head = (
        f"The {edition} handout asks for {' and '.join(f'{b} on {WHERE[b]}' for b in asked['backends'])}, "
        f"{_sizes_text(asked['sizes_mb'])} at {', '.join(map(str, asked['world_sizes']))} "
        f"processes: {total} points; this run measured {n_ok} of them"
    )
    return [head + (":" if lines else "."), *lines]


def oversubscribed(d: pd.DataFrame) -> str:
    """The gloo world sizes that ran more processes than the host has cores."""
    if "oversubscribed" not in d:
        return ""
    over = d[d["oversubscribed"].fillna(False).astype(bool)]
    if not len(over):
        return ""
    sizes = ", ".join(str(n) for n in sorted(set(over["world_size"])))
    cores = int(over["cpu_cores"].max())
    return (
        f"gloo at n = {sizes} ran more processes than the host's {cores} cores: they take turns "
        "on the cores, so those times include waiting for a core, not only the collective."
    )
