"""The `ddp` section's answers in words, each from the runs it names: PyTorch's
DistributedDataParallel beside our fastest wrapper, and the bucket sizes beside per-parameter
overlap."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import fmt, ok
from cs336_systems.stages.ddp.peer import BUCKET_MB


def peer_sentence(d: pd.DataFrame) -> str:
    """PyTorch's DDP beside per-parameter overlap and the fastest bucketed run (runs that passed
    the checks), or '' where either side is missing."""
    good = ok(d)
    peer = good[good["variant"] == "torch_ddp"]
    if not len(peer):
        return ""
    p = peer.iloc[0]
    ours = good[good["variant"].isin(["overlap", "bucketed"])]
    if not len(ours):
        return ""
    best = ours.loc[ours["step_ms_mean"].idxmin()]
    name = (
        f"bucketed {best.bucket_size_mb:g} MiB"
        if best.variant == "bucketed"
        else "overlap (per parameter)"
    )
    ratio = float(best.step_ms_mean) / float(p.step_ms_mean)
    return (
        f"The peer, PyTorch's DistributedDataParallel ({BUCKET_MB:g} MiB buckets), takes "
        f"{fmt(float(p.step_ms_mean))} ± {fmt(float(p.step_ms_std))} ms a step; our fastest, "
        f"{name}, {fmt(float(best.step_ms_mean))} ± {fmt(float(best.step_ms_std))} ms "
        f"({fmt(ratio)}× the peer's time)."
    )


def _one(d: pd.DataFrame, variant: str) -> pd.Series | None:
    rows = ok(d)[ok(d)["variant"] == variant]
    return rows.iloc[0] if len(rows) else None


def _and(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _span_ms(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{fmt(lo)} ms" if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)} ms"


def bucket_vs_overlap(d: pd.DataFrame) -> list[str]:
    """The bucketed runs against each other and against per-parameter overlap (runs that passed
    the checks): their step times' spread, each gap to overlap beside the step std, the sync
    left after backward, and apart the bucket sizes with one tensor per bucket, as overlap."""
    good = ok(d)
    b = good[good["variant"] == "bucketed"].sort_values("bucket_size_mb")
    o = _one(d, "overlap")
    out: list[str] = []
    if len(b) == 0:
        return out
    sizes = ", ".join(f"{x:g}" for x in b["bucket_size_mb"])
    if len(b) > 1:
        spread = float(b["step_ms_mean"].max() - b["step_ms_mean"].min())
        out.append(
            f"The {len(b)} bucket sizes ({sizes} MiB) take {_span_ms(b['step_ms_mean'])} per "
            f"step, within {fmt(spread)} ms of each other (step std {_span_ms(b['step_ms_std'])})."
        )
    if o is None:
        return out
    gap = b["step_ms_mean"] - o.step_ms_mean
    noise = float(max(b["step_ms_std"].max(), o.step_ms_std))
    lo, hi = float(gap.min()), float(gap.max())
    every = "Every bucket size is" if len(b) > 1 else f"The {sizes} MiB run is"
    overlap = f"per-parameter overlap ({fmt(o.step_ms_mean)} ms)"
    if lo > 0:
        text = f"{every} slower than {overlap}, by {_span_ms(gap)}"
    elif hi < 0:
        text = f"{every} faster than {overlap}, by {_span_ms(-gap)}"
    else:
        text = (
            f"Against {overlap} the bucket sizes range from {fmt(-lo)} ms faster to "
            f"{fmt(hi)} ms slower"
        )
    beyond = (
        "every gap larger than the step std of either run"
        if float(gap.abs().min()) > noise
        else "not every gap larger than the runs' step std"
    )
    out.append(f"{text} ({beyond}, at most {fmt(noise)} ms).")
    left = ", ".join(
        f"{x:g} MiB {fmt(c)} ms"
        for x, c in zip(b["bucket_size_mb"], b["comm_ms_mean"], strict=True)
    )
    out.append(f"Sync left after backward: {left}, against {fmt(o.comm_ms_mean)} ms for overlap.")
    one = b[b["num_buckets"] == b["num_grad_tensors"]]
    if len(one):
        n = int(one["num_buckets"].iloc[0])
        extra = one["comm_ms_mean"] - o.comm_ms_mean
        text = (
            f"With {_and(f'{x:g}' for x in one['bucket_size_mb'])} MiB buckets each bucket holds "
            f"one gradient tensor ({n} buckets for {n} tensors), the same {n} all-reduces "
            f"overlap sends, yet {_and(fmt(x) for x in one['comm_ms_mean'])} ms are left after "
            f"backward against {fmt(o.comm_ms_mean)} ms"
        )
        if (extra > 0).all():
            text += (
                f": {_and(fmt(x) for x in extra)} ms more, "
                f"{_and(fmt(x / n * 1e3) for x in extra)} us per bucket, spent after backward "
                "on what the bucketed wrapper does there per bucket (it waits for the bucket's "
                "all-reduce and copies the result back into the gradients; overlap only waits)"
            )
        out.append(text + ".")
    return out
