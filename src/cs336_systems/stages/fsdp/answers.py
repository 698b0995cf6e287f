"""The `fsdp` section's answers in words; Q33: do the weight all-gathers finish in time? One sentence per FSDP
run from its profiled step (the gathers' time, the share during compute, the time compute
waited for them, the host's waits), what the forward's gathers cost against the same precision's
DDP, units of a block against units of a layer, bf16 against fp32 compute, compiled blocks
against eager ones."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.reporting.analysis import faster_or_slower, fmt, ok, pct
from cs336_systems.stages.fsdp.rows import (
    HOST_BOUND_BUSY,
    IN_TIME_SHARE,
    LABELS,
    PEERS,
    _busy,
    _exposed,
    _left_out,
    _num,
    _row,
)


def _wait_exceeds_exposed(r: pd.Series) -> bool:
    """gloo: the main thread waited longer for gathers than they were exposed on the timeline."""
    return r["backend"] == "gloo" and _num(r, "gather_wait_ms_mean") > _exposed(r)


def _wait_sentence(r: pd.Series, explained: bool = False) -> str:
    """What the main thread's waits for gathers were, and why they can exceed the gathers'
    exposed time on the timeline (measure.py: `gather_wait` sums, per timed step, the host time
    from each gather's wait() call until it returns); `explained`: an earlier run's sentence
    already gave the reasons."""
    wait, step = _num(r, "gather_wait_ms_mean"), _num(r, "step_ms_mean")
    if math.isnan(wait):
        return ""
    t_ag, exposed = _num(r, "prof_all_gather_ms"), _exposed(r)
    if r["backend"] != "gloo":  # NCCL: wait() returns once it has enqueued the stream wait
        lost = "" if math.isnan(exposed) else f"; the {fmt(exposed)} ms exposed on the timeline is"
        return (
            f" On the GPU a gather's wait() only makes the compute stream wait for it, so the "
            f"host's {fmt(wait)} ms per step in those calls is not time the step loses{lost}."
        )
    n, lo, hi = (
        _num(r, "measure_steps"),
        _num(r, "gather_wait_ms_min"),
        _num(r, "gather_wait_ms_max"),
    )
    over = f"mean of {int(n)} timed steps" if not math.isnan(n) else "mean of the timed steps"
    if not (math.isnan(lo) or math.isnan(hi)) and n > 1:
        over += f", {fmt(lo)}–{fmt(hi)} ms"
    text = (
        f" The main thread waited {fmt(wait)} ms per step for gathers ({pct(wait / step)} of the "
        f"{fmt(step)} ms step; {over}), counted from each wait() call until its gather had "
        f"completed."
    )
    if not _wait_exceeds_exposed(r):
        return text
    whole = f", even more than their whole {fmt(t_ag)} ms" if wait > t_ag else ""
    # the profiled step's time in which only other collectives ran (reduce-scatters and
    # all-reduces) while the main thread computed nothing: a gather queued behind them is
    # waited for then, and also the sync after backward
    others = _num(r, "prof_comm_ms") - _num(r, "prof_comm_overlapped_ms") - exposed
    alone = (
        ""
        if math.isnan(others)
        else f"{fmt(max(others, 0.0))} ms of the profiled step had only %s running and no "
        f"compute, the sync after backward included"
    )
    text += (
        f" That is {fmt(wait - exposed)} ms more than the gathers' {fmt(exposed)} ms exposed on "
        f"the timeline{whole}"
    )
    if explained:
        return (
            text
            + ", for the same reasons"
            + (f" ({alone % 'other collectives'})." if alone else ".")
        )
    return (
        text + ": gloo runs collectives on its worker threads in the order they were issued, so a "
        "wait also covers the time its gather sat queued behind earlier collectives (the "
        "backward's reduce-scatters and all-reduces"
        + (f": {alone % 'those'}" if alone else "")
        + "), which the timeline counts as theirs; and the waits come from the timed steps, the "
        "timeline from one more, profiled step."
    )


def _gather_sentence(r: pd.Series, label: str, explained: bool = False) -> str:
    t_ag, share = _num(r, "prof_all_gather_ms"), _num(r, "prof_all_gather_overlap_share")
    hidden, waited = _num(r, "prof_all_gather_overlapped_ms"), _num(r, "prof_all_gather_waited_ms")
    if math.isnan(t_ag):
        return f"{label}: no profiled step."
    text = (
        f"{label}: the all-gathers ({fmt(_num(r, 'all_gather_into_tensor_mb'))} MiB per step in "
        f"{int(_num(r, 'all_gather_into_tensor_calls'))} calls) take {fmt(t_ag)} ms on the "
        f"timeline, {fmt(hidden)} ms ({pct(share)}) of it while compute ran; "
    )
    if math.isnan(waited):  # the CPU (gloo threads), or a run before the waits were measured
        verdict = (
            "they finish in time: compute hides nearly all of their time"
            if share >= IN_TIME_SHARE
            else "they do not finish in time: most of their time is exposed"
            if share < 0.5
            else "they finish in time only in part"
        )
        text += f"{verdict}."
    else:
        in_time = 1 - waited / t_ag if t_ag else math.nan
        verdict = (
            "they finish in time"
            if in_time >= IN_TIME_SHARE
            else "they do not finish in time"
            if in_time < 0.5
            else "they finish in time only in part"
        )
        text += (
            f"compute waited for them {fmt(waited)} ms ({pct(1 - in_time)} of their time): "
            f"{verdict}."
        )
        if in_time >= IN_TIME_SHARE and share < IN_TIME_SHARE:
            busy = _busy(r)
            text += (
                " The rest of their time fell where the GPU had no compute kernel to run "
                "(it waited for the host), not where compute waited for them."
                if busy == busy and busy < HOST_BOUND_BUSY
                else " The rest of their time fell where no compute kernel ran, not where "
                "compute waited for them."
            )
    phases = [
        f"{name} {fmt(_num(r, f'prof_all_gather_{key}_ms'))} ms "
        f"({pct(_num(r, f'prof_all_gather_{key}_overlap_share'))} during compute"
        + (
            ""
            if math.isnan(_num(r, f"prof_all_gather_{key}_waited_ms"))
            else f", {fmt(_num(r, f'prof_all_gather_{key}_waited_ms'))} ms waited for"
        )
        + ")"
        for key, name in (("fwd", "forward"), ("bwd", "backward"))
        if not math.isnan(_num(r, f"prof_all_gather_{key}_ms"))
    ]
    if phases:
        text += f" By phase: {', '.join(phases)}."
    return text + _wait_sentence(r, explained)


# the DDP run with the same compute precision: its forward gathers nothing
SAME_PRECISION_DDP = {
    "fsdp": "ddp",
    "fsdp_layer": "ddp",
    "fsdp_bf16": "ddp_bf16",
    "fsdp_bf16_layer": "ddp_bf16",
    "fsdp_bf16_compiled": "ddp_bf16_compiled",
    "fsdp_bf16_graphed": "ddp_bf16_graphed",
}
FSDP_RUNS = (
    "fsdp",
    "fsdp_bf16",
    "fsdp_layer",
    "fsdp_bf16_layer",
    "fsdp_bf16_compiled",
    "fsdp_bf16_graphed",
)


def _forward_cost(df: pd.DataFrame, v: str) -> str:
    """What the forward's exposed gathers cost: the FSDP run's forward against the same
    precision's DDP forward, which gathers nothing (exposed time can fall where the GPU waits
    for the host anyway, and then costs nothing)."""
    r, d = _row(df, v), _row(df, SAME_PRECISION_DDP[v])
    if r is None or d is None or r["backend"] == "gloo":
        return ""
    t, share = _num(r, "prof_all_gather_fwd_ms"), _num(r, "prof_all_gather_fwd_overlap_share")
    f_fsdp, f_ddp = _num(r, "fwd_ms_mean"), _num(d, "fwd_ms_mean")
    if any(math.isnan(x) for x in (t, share, f_fsdp, f_ddp)) or share >= IN_TIME_SHARE:
        return ""
    exposed, extra = t * (1 - share), max(f_fsdp - f_ddp, 0.0)
    text = (
        f" Its forward takes {fmt(f_fsdp)} ms a step against {fmt(f_ddp)} ms for "
        f"{LABELS[SAME_PRECISION_DDP[v]]}, which gathers nothing"
    )
    waited = _num(r, "prof_all_gather_fwd_waited_ms")
    if not math.isnan(waited):  # what the compute waited for, measured
        text += f"; compute waited {fmt(waited)} ms for its forward gathers"
        if extra > 2 * waited:
            text += (
                f", so {fmt(extra - waited)} ms of the {fmt(extra)} ms difference is not "
                f"waiting for gathers"
            )
        return text + "."
    if extra > exposed:
        return text + (
            f": {fmt(extra)} ms more, beyond the {fmt(exposed)} ms of forward gathers outside "
            f"compute, so most of the difference is not the gathers'."
        )
    text += (
        f": the {fmt(exposed)} ms of forward gathers outside compute cost the forward at most "
        f"{fmt(extra)} ms"
    )
    if extra < 0.5 * exposed:
        text += "; the rest ran in time the compute stream had no kernel to run anyway"
    return text + "."


def q33(df: pd.DataFrame) -> str:
    parts: list[str] = []
    explained = False  # the reasons a wait exceeds the exposed time are given once
    for v in FSDP_RUNS:
        if (r := _row(df, v)) is not None:
            parts.append(_gather_sentence(r, LABELS[v], explained) + _forward_cost(df, v))
            explained = explained or _wait_exceeds_exposed(r)
    if not parts:
        return ""
    text = " ".join(parts)
    for v in FSDP_RUNS:
        r = _row(df, v)
        if r is not None and _busy(r) == _busy(r) and _busy(r) < HOST_BOUND_BUSY:
            text += (
                f" {LABELS[v]} is host-bound: its GPU ran kernels only {pct(_busy(r))} of the "
                f"profiled {fmt(_num(r, 'prof_step_ms'), 0)} ms step and idled "
                f"{fmt(_num(r, 'prof_gpu_idle_ms'), 0)} ms waiting for the host to issue work, "
                f"so its step time says more of the host's work per step (hooks, launches) than "
                f"of its communication."
            )
    text += _units_sentence(df) + _precision_sentence(df) + _compiled_sentence(df)
    text += _graphed_sentence(df)
    text += _peer_sentence(df)
    first = ok(df).iloc[0]
    if first["backend"] == "gloo":
        text += (
            " On the CPU, gloo's worker threads and the compute share the same cores, so time "
            "that overlaps on the timeline is not free: it slows the compute it overlaps."
        )
    return text + _left_out(df, ("fsdp", "fsdp_bf16", "ddp", "ddp_bf16"))


def _ncalls(r: pd.Series) -> int:
    kinds = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
    return int(sum(_num(r, f"{k}_calls") for k in kinds))


def _units_sentence(df: pd.DataFrame) -> str:
    """Units of a block against units of a layer, per compute dtype: calls, step, exposed."""
    out = []
    for block, layer, what in (
        ("fsdp", "fsdp_layer", "fp32"),
        ("fsdp_bf16", "fsdp_bf16_layer", "bf16"),
    ):
        b, lay = _row(df, block), _row(df, layer)
        if b is None or lay is None:
            continue
        out.append(
            f"In {what}, units of a block make {_ncalls(b)} collective calls a step against "
            f"{_ncalls(lay)} with a unit per layer, for the same bytes; the step takes "
            f"{fmt(float(b.step_ms_mean))} ms against {fmt(float(lay.step_ms_mean))} ms "
            f"({fmt(float(lay.step_ms_mean) / float(b.step_ms_mean))}×), with "
            f"{fmt(_exposed(b))} and {fmt(_exposed(lay))} ms of all-gather exposed."
        )
    return (" " + " ".join(out)) if out else ""


def _peer_sentence(df: pd.DataFrame) -> str:
    """PyTorch's FSDP2 set up as ours (peer.py) beside our FSDP, run for run: the step, the
    gathers' time during compute and the time compute waited for them."""
    out = []
    for peer, ours in PEERS.items():
        p, o = _row(df, peer), _row(df, ours)
        if p is None or o is None:
            continue
        ratio = float(o.step_ms_mean) / float(p.step_ms_mean)
        out.append(
            f"{LABELS[peer]} takes {fmt(float(p.step_ms_mean))} ms a step against our "
            f"{fmt(float(o.step_ms_mean))} ms ({fmt(ratio)}× its time); its all-gathers take "
            f"{fmt(_num(p, 'prof_all_gather_ms'))} ms on the timeline, "
            f"{pct(_num(p, 'prof_all_gather_overlap_share'))} of it during compute (ours "
            f"{pct(_num(o, 'prof_all_gather_overlap_share'))}), and compute waited "
            f"{fmt(_num(p, 'prof_all_gather_waited_ms'))} ms for them (ours "
            f"{fmt(_num(o, 'prof_all_gather_waited_ms'))} ms)."
        )
    if not out:
        return ""
    return (
        " The peer, set up as ours (units of a block, bf16 gathers and reductions, the next "
        "block prefetched): " + " ".join(out)
    )


def _bf16_pairs(df: pd.DataFrame, before: str, after: str) -> list:
    """(run, run changed, "DDP"/"FSDP") for the bf16 DDP and FSDP runs whose variants end in
    `before` and `after`, where both ran."""
    pairs = [
        (_row(df, f"{v}{before}"), _row(df, f"{v}{after}"), name)
        for v, name in (("ddp_bf16", "DDP"), ("fsdp_bf16", "FSDP"))
    ]
    return [(a, b, name) for a, b, name in pairs if a is not None and b is not None]


def _compiled_sentence(df: pd.DataFrame) -> str:
    """What compiling the blocks' forward changes, for DDP and FSDP under bf16, and the compiled
    FSDP step against the compiled DDP step."""
    parts = [
        f"{name}'s step from {fmt(float(e.step_ms_mean))} to {fmt(float(c.step_ms_mean))} ms "
        f"(forward {fmt(float(e.fwd_ms_mean))} → {fmt(float(c.fwd_ms_mean))} ms, GPU busy "
        f"{pct(_busy(e))} → {pct(_busy(c))} of the profiled step)"
        for e, c, name in _bf16_pairs(df, "", "_compiled")
    ]
    if not parts:
        return ""
    text = f" Compiling each block's forward (bf16) takes {' and '.join(parts)}."
    d, f = _row(df, "ddp_bf16_compiled"), _row(df, "fsdp_bf16_compiled")
    if d is not None and f is not None:
        text += (
            f" Compiled, FSDP takes {fmt(float(f.step_ms_mean) / float(d.step_ms_mean))}× the "
            f"step of DDP."
        )
    return text


def _graphed_sentence(df: pd.DataFrame) -> str:
    """What replaying the compiled step as CUDA graphs changes (the host no longer issues each
    kernel and hook), for DDP and FSDP: the step, the GPU's busy share, FSDP's gathers during
    compute, FSDP against DDP graphed, and the memory the graphs keep reserved."""
    parts = [
        f"{name}'s step from {fmt(float(c.step_ms_mean))} to {fmt(float(g.step_ms_mean))} ms "
        f"(GPU busy {pct(_busy(c))} → {pct(_busy(g))} of the profiled step, memory reserved "
        f"{fmt(_num(c, 'mem_reserved_mb'), 0)} → {fmt(_num(g, 'mem_reserved_mb'), 0)} MiB)"
        for c, g, name in _bf16_pairs(df, "_compiled", "_graphed")
    ]
    if not parts:
        return ""
    text = (
        " Replaying the compiled step's forward and backward as two CUDA graphs (the host "
        f"issues two launches instead of every kernel and hook) takes {' and '.join(parts)}."
    )
    f = _row(df, "fsdp_bf16_graphed")
    if f is not None:
        text += (
            f" Graphed, FSDP's all-gathers run {pct(_num(f, 'prof_all_gather_overlap_share'))} "
            f"of their time during compute (forward "
            f"{pct(_num(f, 'prof_all_gather_fwd_overlap_share'))}, backward "
            f"{pct(_num(f, 'prof_all_gather_bwd_overlap_share'))})"
        )
        d = _row(df, "ddp_bf16_graphed")
        if d is not None:
            ratio = float(f.step_ms_mean) / float(d.step_ms_mean)
            text += f" and its step takes {fmt(ratio)}× the graphed DDP step"
        text += "."
    return text


def _precision_sentence(df: pd.DataFrame) -> str:
    """What bf16 compute changes, for FSDP and for DDP, whose communication stays fp32: a
    change both share is the compute's, not the gathers' halved bytes."""
    fs, bf = _row(df, "fsdp"), _row(df, "fsdp_bf16")
    ddp, ddp_bf = _row(df, "ddp"), _row(df, "ddp_bf16")
    if fs is None or bf is None:
        return ""
    r_fsdp = float(fs.step_ms_mean) / float(bf.step_ms_mean)
    text = (
        f" Casting to bf16 before the gather halves its bytes "
        f"({fmt(_num(fs, 'all_gather_into_tensor_mb'))} → "
        f"{fmt(_num(bf, 'all_gather_into_tensor_mb'))} MiB) and the FSDP step goes from "
        f"{fmt(float(fs.step_ms_mean))} to {fmt(float(bf.step_ms_mean))} ms "
        f"({faster_or_slower(r_fsdp, fmt)})"
    )
    if ddp is not None and ddp_bf is not None:
        r_ddp = float(ddp.step_ms_mean) / float(ddp_bf.step_ms_mean)
        text += (
            f"; DDP, whose all-reduced gradients stay fp32, goes from "
            f"{fmt(float(ddp.step_ms_mean))} to {fmt(float(ddp_bf.step_ms_mean))} ms under bf16 "
            f"autocast ({fmt(r_ddp)}×)"
        )
        if abs(r_fsdp / r_ddp - 1) < 0.25:
            text += (
                ": both change alike, so the change is the compute's (bf16 matmuls against "
                "fp32), not the halved gathers'"
            )
        elif r_fsdp > r_ddp:
            text += ": FSDP gains more, the rest being its halved communication and host work"
        text += (
            f". FSDP with bf16 compute takes {fmt(float(bf.step_ms_mean) / float(ddp_bf.step_ms_mean))}× "
            f"the step of DDP under the same autocast."
        )
    elif fs["backend"] == "gloo" and r_fsdp < 1:
        text += ": on this CPU, bf16 compute is slower than fp32."
    else:
        text += "."
    return text
