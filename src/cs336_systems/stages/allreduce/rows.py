"""The `allreduce` stage's points as the report reads them: the CSV with its defaults, message
sizes as MiB or GiB, and the section's tables (time and bus bandwidth per message and world
size, the latency-bandwidth fits, the points that did not run). Used by analysis.py and
answers.py (the sentences)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    ALLREDUCE_GROUP,
    fit_latency_bandwidth,
    fmt,
    mark_suspect,
    md_table,
    ran,
)

GROUP = ALLREDUCE_GROUP


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) and "buffers" not in df:
        df = df.assign(buffers="default")
    return df


def size_label(mib: float) -> str:
    """A message size given in MiB (the CSV's `size_mb`: 2**20 bytes), as MiB or GiB."""
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def pivot(df: pd.DataFrame, backend: str, buffers: str = "default") -> str:
    """Rows: message size; columns: world size; cells: median time (busbw), every point that
    ran (a suspect one marked)."""
    d = ran(with_defaults(df))
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
    t["size_mb"] = t["size_mb"].map(size_label)
    t.columns = ["message"] + [f"n = {c}" for c in t.columns[1:]]
    return md_table(t)


def fit_table(df: pd.DataFrame) -> str:
    """The latency-bandwidth fit of each curve (suspect points left out, and counted), and
    whether its parameters are physical (`reporting/analysis.py:fit_problem`): a rejected fit's
    values are marked and it is quoted nowhere."""
    fits = fit_latency_bandwidth(df)
    if not len(fits):
        return ""
    columns = [*GROUP, "latency_us", "bandwidth_gbps", "max_rel_residual", "points", "suspect"]
    t = fits[columns].copy()
    rejected = fits["problem"].astype(bool)
    t["latency_us"] = [
        mark_suspect(fmt(v), bool(r)) for v, r in zip(t["latency_us"], rejected, strict=True)
    ]
    t["fit"] = ["rejected: " + p if p else "kept" for p in fits["problem"]]
    return md_table(
        t.rename(
            columns={
                "latency_us": "latency o (µs)",
                "bandwidth_gbps": "bandwidth w (GB/s)",
                "max_rel_residual": "max rel. residual",
                "points": "points fitted",
                "suspect": "suspect points left out",
            }
        )
    )


def rejected_fits(df: pd.DataFrame) -> list[str]:
    """One line per curve whose fit is rejected, with the reason."""
    fits = fit_latency_bandwidth(df)
    if not len(fits):
        return []
    bad = fits[fits["problem"].astype(bool)]
    return [
        f"{r.backend} ({r.buffers} buffers), n = {r.world_size}: {r.problem}"
        for r in bad.itertuples()
    ]


def not_run_table(df: pd.DataFrame) -> str:
    """One row per (backend, buffers, world size, reason) of the points that did not succeed,
    with how many points it stands for."""
    bad = df[df["status"] != "ok"]
    skipped = (
        bad.groupby(["backend", "buffers", "world_size", "status"], sort=False)
        .size()
        .reset_index(name="points")[["backend", "buffers", "world_size", "points", "status"]]
        .rename(columns={"world_size": "world size"})
    )
    return md_table(skipped) if len(skipped) else ""
