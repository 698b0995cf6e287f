"""The `fsdp` section's answers in words. The setup; Q32: FSDP's saving against optimizer-state
sharding, counted and peak to peak; Q33: do the weight all-gathers finish in time? One sentence
per FSDP run from its profiled step (the gathers' time, the share during compute, the time
compute waited for them, the host's waits), what the forward's gathers cost against the same
precision's DDP, units of a block against units of a layer, bf16 against fp32 compute, compiled
blocks against eager ones."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core.costs import MiB, fsdp_saving_vs_optimizer_sharding
from cs336_systems.reporting.analysis import faster_or_slower, fmt, ok, own_model_words, pct
from cs336_systems.stages.fsdp.rows import (
    HOST_BOUND_BUSY,
    IN_TIME_SHARE,
    LABELS,
    PEERS,
    busy_share,
    exposed_ms,
    left_out,
    number,
    one,
)


def _wait_exceeds_exposed(r: pd.Series) -> bool:
    """gloo: the main thread waited longer for gathers than they were exposed on the timeline."""
    return r["backend"] == "gloo" and number(r, "gather_wait_ms_mean") > exposed_ms(r)


def compute_wait(r: pd.Series) -> float:
    """How long compute waited for the gathers (ms): on the CPU (gloo) the main thread's, which
    runs the compute, in the gathers' wait() calls (a mean over the timed steps); on the GPU
    the compute stream's, from the profiled step's timeline (`profiling/overlap.py:waited_for`);
    NaN where not measured."""
    if r.get("backend") == "gloo":
        return number(r, "gather_wait_ms_mean")
    return number(r, "prof_all_gather_waited_ms")


def _waiter(r: pd.Series) -> str:
    """Who waits for a gather: the compute stream, or on the CPU the main thread."""
    return "the main thread, which runs the compute," if r.get("backend") == "gloo" else "compute"


def _ms(x: float) -> str:
    return "not measured" if math.isnan(x) else f"{fmt(x)} ms"


def _outside_compute(r: pd.Series, waited: float) -> str:
    """Where the gathers ran outside compute for longer than compute waited for them (by over
    5% of their time): where that time fell, which the step did not lose to them."""
    t_ag, exposed = number(r, "prof_all_gather_ms"), exposed_ms(r)
    rest = exposed - waited
    if not rest > 0.05 * t_ag:
        return ""
    if r.get("backend") == "gloo":
        where = (
            "the main thread ran no ATen operator and did not wait for a gather (its Python, "
            "hooks and waits for other collectives; the wait is the timed steps' mean, the "
            "timeline one more, profiled step)"
        )
    elif busy_share(r) < HOST_BOUND_BUSY:
        where = "the GPU had no compute kernel to run (it waited for the host)"
    else:
        where = "no compute kernel ran"
    part = "All" if rest > 0.99 * exposed else f"{fmt(rest)} ms of the"
    return (
        f" {part} {fmt(exposed)} ms they ran outside compute fell where {where}, not where "
        "compute waited for them: time without compute, not time the gathers cost the step."
    )


def _wait_sentence(r: pd.Series, explained: bool = False) -> str:
    """What the main thread's waits for gathers were (on the CPU, where `_gather_sentence` has
    named the wait: its share of the step), and why they can exceed the gathers' exposed time
    on the timeline (measure.py: `gather_wait` sums, per timed step, the host time from each
    gather's wait() call until it returns); `explained`: an earlier run's sentence already gave
    the reasons."""
    wait, step = number(r, "gather_wait_ms_mean"), number(r, "step_ms_mean")
    if math.isnan(wait):
        return ""
    t_ag, exposed = number(r, "prof_all_gather_ms"), exposed_ms(r)
    if r["backend"] != "gloo":  # NCCL: wait() returns once it has enqueued the stream wait
        waited = compute_wait(r)
        lost = (
            f"; the {fmt(waited)} ms compute waited for them is"
            if not math.isnan(waited)
            else f"; the {fmt(exposed)} ms they ran outside compute is the most it can lose to "
            "them (how long compute waited for them is not measured)"
            if not math.isnan(exposed)
            else ""
        )
        return (
            f" On the GPU a gather's wait() only makes the compute stream wait for it, so the "
            f"host's {fmt(wait)} ms per step in those calls is not time the step loses{lost}."
        )
    n, lo, hi = (
        number(r, "measure_steps"),
        number(r, "gather_wait_ms_min"),
        number(r, "gather_wait_ms_max"),
    )
    over = f"mean of {int(n)} timed steps" if not math.isnan(n) else "mean of the timed steps"
    if not (math.isnan(lo) or math.isnan(hi)) and n > 1:
        over += f", {fmt(lo)}–{fmt(hi)} ms"
    text = (
        f" That wait is {pct(wait / step)} of the {fmt(step)} ms step ({over}), counted from each "
        f"wait() call until its gather had completed."
    )
    if not _wait_exceeds_exposed(r):
        return text
    whole = f", even more than their whole {fmt(t_ag)} ms" if wait > t_ag else ""
    # the profiled step's time in which only other collectives ran (reduce-scatters and
    # all-reduces) while the main thread computed nothing: a gather queued behind them is
    # waited for then, and also the sync after backward
    others = number(r, "prof_comm_ms") - number(r, "prof_comm_overlapped_ms") - exposed
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


def gather_verdict(r: pd.Series) -> str:
    """Whether a run's weight all-gathers finish in time: from the time compute waited for them
    where measured (`compute_wait`), else from the share of their time during compute."""
    t_ag, share = number(r, "prof_all_gather_ms"), number(r, "prof_all_gather_overlap_share")
    waited = compute_wait(r)
    if math.isnan(waited):
        return (
            "they finish in time: compute hides nearly all of their time"
            if share >= IN_TIME_SHARE
            else "they do not finish in time: most of their time is exposed"
            if share < 0.5
            else "they finish in time only in part"
        )
    in_time = 1 - waited / t_ag if t_ag else math.nan
    return (
        "they finish in time"
        if in_time >= IN_TIME_SHARE
        else "they do not finish in time"
        if in_time < 0.5
        else "they finish in time only in part"
    )


def _short_run(r: pd.Series, label: str) -> str:
    """One sentence: a run's gathers, their time during compute, the wait (marked where it
    exceeds the gathers' time on the timeline), the verdict."""
    t_ag, share = number(r, "prof_all_gather_ms"), number(r, "prof_all_gather_overlap_share")
    if math.isnan(t_ag):
        return f"{label}: no profiled step."
    waited = compute_wait(r)
    wait = "" if math.isnan(waited) else f" and {_waiter(r)} waited {fmt(waited)} ms for them"
    if waited > t_ag:  # a mean over the timed steps, queued time included
        wait += (
            f", more than their {fmt(t_ag)} ms on the timeline (the wait also counts time "
            "queued behind other collectives)"
        )
    return (
        f"{label}: the weight all-gathers take {fmt(t_ag)} ms of the profiled "
        f"{fmt(number(r, 'prof_step_ms'), 0)} ms step, {pct(share)} of it while compute ran"
        f"{wait}, so {gather_verdict(r)}."
    )


def q33_short(df: pd.DataFrame) -> str:
    """Q33 at the handout's length (2-3 sentences): the fp32 and the bf16 FSDP run with units
    of a block, each one sentence with its verdict; `q33` holds the details."""
    runs = [(v, one(df, v)) for v in ("fsdp", "fsdp_bf16")]
    parts = [_short_run(r, LABELS[v]) for v, r in runs if r is not None]
    if not parts:
        return ""
    first = ok(df).iloc[0]
    if first["backend"] == "gloo":
        parts.append(
            "On the CPU gloo's threads share the cores with compute, so overlap there is not free."
        )
    return " ".join(parts)


def _gather_sentence(r: pd.Series, label: str, explained: bool = False) -> str:
    t_ag, share = number(r, "prof_all_gather_ms"), number(r, "prof_all_gather_overlap_share")
    hidden, waited = number(r, "prof_all_gather_overlapped_ms"), compute_wait(r)
    if math.isnan(t_ag):
        return f"{label}: no profiled step."
    text = (
        f"{label}: the all-gathers ({fmt(number(r, 'all_gather_into_tensor_mb'))} MiB per step in "
        f"{int(number(r, 'all_gather_into_tensor_calls'))} calls) take {fmt(t_ag)} ms on the "
        f"timeline, {fmt(hidden)} ms ({pct(share)}) of it while compute ran; "
    )
    verdict = gather_verdict(r)
    if math.isnan(waited):  # a run before the waits were measured
        text += f"{verdict}."
    else:
        text += (
            f"{_waiter(r)} waited for them {fmt(waited)} ms "
            f"({pct(waited / t_ag if t_ag else math.nan)} of their time): {verdict}."
        ) + _outside_compute(r, waited)
    phases = [
        f"{name} {fmt(number(r, f'prof_all_gather_{key}_ms'))} ms "
        f"({pct(number(r, f'prof_all_gather_{key}_overlap_share'))} during compute"
        + (
            ""
            if math.isnan(number(r, f"prof_all_gather_{key}_waited_ms"))
            else f", {fmt(number(r, f'prof_all_gather_{key}_waited_ms'))} ms waited for"
        )
        + ")"
        for key, name in (("fwd", "forward"), ("bwd", "backward"))
        if not math.isnan(number(r, f"prof_all_gather_{key}_ms"))
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
    r, d = one(df, v), one(df, SAME_PRECISION_DDP[v])
    if r is None or d is None or r["backend"] == "gloo":
        return ""
    t, share = number(r, "prof_all_gather_fwd_ms"), number(r, "prof_all_gather_fwd_overlap_share")
    f_fsdp, f_ddp = number(r, "fwd_ms_mean"), number(d, "fwd_ms_mean")
    if any(math.isnan(x) for x in (t, share, f_fsdp, f_ddp)) or share >= IN_TIME_SHARE:
        return ""
    exposed, extra = t * (1 - share), max(f_fsdp - f_ddp, 0.0)
    text = (
        f" Its forward takes {fmt(f_fsdp)} ms a step against {fmt(f_ddp)} ms for "
        f"{LABELS[SAME_PRECISION_DDP[v]]}, which gathers nothing"
    )
    waited = number(r, "prof_all_gather_fwd_waited_ms")
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
        if (r := one(df, v)) is not None:
            parts.append(_gather_sentence(r, LABELS[v], explained) + _forward_cost(df, v))
            explained = explained or _wait_exceeds_exposed(r)
    if not parts:
        return ""
    text = " ".join(parts)
    for v in FSDP_RUNS:
        r = one(df, v)
        if r is not None and busy_share(r) == busy_share(r) and busy_share(r) < HOST_BOUND_BUSY:
            text += (
                f" {LABELS[v]} is host-bound: its GPU ran kernels only {pct(busy_share(r))} of the "
                f"profiled {fmt(number(r, 'prof_step_ms'), 0)} ms step and idled "
                f"{fmt(number(r, 'prof_gpu_idle_ms'), 0)} ms waiting for the host to issue work, "
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
    return text + left_out(df, ("fsdp", "fsdp_bf16", "ddp", "ddp_bf16"))


def _ncalls(r: pd.Series) -> int:
    kinds = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
    return int(sum(number(r, f"{k}_calls") for k in kinds))


def _units_sentence(df: pd.DataFrame) -> str:
    """Units of a block against units of a layer, per compute dtype: calls, step, exposed."""
    out = []
    for block, layer, what in (
        ("fsdp", "fsdp_layer", "fp32"),
        ("fsdp_bf16", "fsdp_bf16_layer", "bf16"),
    ):
        b, lay = one(df, block), one(df, layer)
        if b is None or lay is None:
            continue
        out.append(
            f"In {what}, units of a block make {_ncalls(b)} collective calls a step against "
            f"{_ncalls(lay)} with a unit per layer, for the same bytes; the step takes "
            f"{fmt(float(b.step_ms_mean))} ms against {fmt(float(lay.step_ms_mean))} ms "
            f"({fmt(float(lay.step_ms_mean) / float(b.step_ms_mean))}×), {_units_waits(b, lay)}."
        )
    return (" " + " ".join(out)) if out else ""


def _units_waits(b: pd.Series, lay: pd.Series) -> str:
    """How long compute waited for the gathers with units of a block and of a layer, beside
    their time outside compute on the timeline (which costs the step only where it waited)."""
    waits = [compute_wait(x) for x in (b, lay)]
    outside = (
        f"{fmt(exposed_ms(b))} and {fmt(exposed_ms(lay))} ms of all-gather outside compute on "
        f"the timeline"
    )
    if any(math.isnan(w) for w in waits):
        return f"with {outside} (how long compute waited for them is not measured)"
    return (
        f"with compute waiting {fmt(waits[0])} and {fmt(waits[1])} ms for the all-gathers "
        f"({outside})"
    )


def _peer_sentence(df: pd.DataFrame) -> str:
    """PyTorch's FSDP2 set up as ours (peer.py) beside our FSDP, run for run: the step, the
    gathers' time during compute and the time compute waited for them."""
    out = []
    for peer, ours in PEERS.items():
        p, o = one(df, peer), one(df, ours)
        if p is None or o is None:
            continue
        ratio = float(o.step_ms_mean) / float(p.step_ms_mean)
        out.append(
            f"{LABELS[peer]} takes {fmt(float(p.step_ms_mean))} ms a step against our "
            f"{fmt(float(o.step_ms_mean))} ms ({fmt(ratio)}× its time); its all-gathers take "
            f"{fmt(number(p, 'prof_all_gather_ms'))} ms on the timeline, "
            f"{pct(number(p, 'prof_all_gather_overlap_share'))} of it during compute (ours "
            f"{pct(number(o, 'prof_all_gather_overlap_share'))}); the time compute waited for "
            f"them: {_ms(compute_wait(p))} (ours {_ms(compute_wait(o))})."
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
        (one(df, f"{v}{before}"), one(df, f"{v}{after}"), name)
        for v, name in (("ddp_bf16", "DDP"), ("fsdp_bf16", "FSDP"))
    ]
    return [(a, b, name) for a, b, name in pairs if a is not None and b is not None]


def _compiled_sentence(df: pd.DataFrame) -> str:
    """What compiling the blocks' forward changes, for DDP and FSDP under bf16, and the compiled
    FSDP step against the compiled DDP step."""
    parts = [
        f"{name}'s step from {fmt(float(e.step_ms_mean))} to {fmt(float(c.step_ms_mean))} ms "
        f"(forward {fmt(float(e.fwd_ms_mean))} → {fmt(float(c.fwd_ms_mean))} ms, GPU busy "
        f"{pct(busy_share(e))} → {pct(busy_share(c))} of the profiled step)"
        for e, c, name in _bf16_pairs(df, "", "_compiled")
    ]
    if not parts:
        return ""
    text = f" Compiling each block's forward (bf16) takes {' and '.join(parts)}."
    d, f = one(df, "ddp_bf16_compiled"), one(df, "fsdp_bf16_compiled")
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
        f"(GPU busy {pct(busy_share(c))} → {pct(busy_share(g))} of the profiled step, memory reserved "
        f"{fmt(number(c, 'mem_reserved_mb'), 0)} → {fmt(number(g, 'mem_reserved_mb'), 0)} MiB)"
        for c, g, name in _bf16_pairs(df, "_compiled", "_graphed")
    ]
    if not parts:
        return ""
    text = (
        " Replaying the compiled step's forward and backward as two CUDA graphs (the host "
        f"issues two launches instead of every kernel and hook) takes {' and '.join(parts)}."
    )
    f = one(df, "fsdp_bf16_graphed")
    if f is not None:
        text += (
            f" Graphed, FSDP's all-gathers run {pct(number(f, 'prof_all_gather_overlap_share'))} "
            f"of their time during compute (forward "
            f"{pct(number(f, 'prof_all_gather_fwd_overlap_share'))}, backward "
            f"{pct(number(f, 'prof_all_gather_bwd_overlap_share'))})"
        )
        d = one(df, "ddp_bf16_graphed")
        if d is not None:
            ratio = float(f.step_ms_mean) / float(d.step_ms_mean)
            text += f" and its step takes {fmt(ratio)}× the graphed DDP step"
        text += "."
    return text


def _precision_sentence(df: pd.DataFrame) -> str:
    """What bf16 compute changes, for FSDP and for DDP, whose communication stays fp32: a
    change both share is the compute's, not the gathers' halved bytes."""
    fs, bf = one(df, "fsdp"), one(df, "fsdp_bf16")
    ddp, ddp_bf = one(df, "ddp"), one(df, "ddp_bf16")
    if fs is None or bf is None:
        return ""
    r_fsdp = float(fs.step_ms_mean) / float(bf.step_ms_mean)
    text = (
        f" Casting to bf16 before the gather halves its bytes "
        f"({fmt(number(fs, 'all_gather_into_tensor_mb'))} → "
        f"{fmt(number(bf, 'all_gather_into_tensor_mb'))} MiB) and the FSDP step goes from "
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


def setup(first: pd.Series) -> str:
    edition = first.get("edition")
    named = f"the {int(edition)} edition's " if edition is not None and edition == edition else ""
    model = own_model_words(first) or (
        f"model {named}`{first['size']}` ({fmt(first['params'] / 1e6, 1)} M parameters: d_model "
        f"{int(first['d_model'])}, d_ff {int(first['d_ff'])}, {int(first['num_layers'])} layers)"
    )
    return (
        f"{model}, context {int(first['context_length'])}, batch {int(first['batch_per_rank'])} per rank, "
        f"{first['backend']} with {int(first['world_size'])} processes"
        f"{' (one per GPU)' if first['backend'] == 'nccl' else ' on the CPU'}, AdamW, fp32 "
        f"master weights; {int(first['warmup_steps'])} warm-up and "
        f"{int(first['measure_steps'])} measured steps per run"
    )


def _peak_gap(so: pd.Series, fs: pd.Series, s: int, w: int, saving: float, got: float) -> str:
    """Why the peak-to-peak saving falls short of the counted one, from the run's own numbers:
    a backward peak barely above the forward peak is backward's start, where the activations
    are all alive and few gradients exist, so only the parameter half of the saving (less the
    full weights FSDP has gathered) can show there; the gradient half shows once backward has
    produced them all (allocated before the optimizer step)."""
    params = 4 * s * (1 - 1 / w) / MiB
    gathered = float(fs.gathered_peak_mb)
    rises = [number(r, "mem_backward_peak_mb") - number(r, "mem_forward_peak_mb") for r in (so, fs)]
    before = [number(r, "mem_before_step_allocated_mb") for r in (so, fs)]
    expect = params - gathered
    residual = got - expect
    if not max(rises) < 0.25 * params:  # a peak later in backward: gradients count there
        return (
            f" The backward peaks are {fmt(rises[0])} and {fmt(rises[1])} MiB above the "
            f"forward peaks: what FSDP holds there beyond its counted tensors is not measured."
        )
    text = (
        f" Both runs peak early in backward: the backward peak is {fmt(rises[0])} MiB above "
        f"the forward peak with the sharded optimizer and {fmt(rises[1])} MiB with FSDP, while "
        f"the activations are nearly all alive and few gradients exist yet. There only the "
        f"parameter half of the saving, 4 bytes × {s:,} × (1 − 1/{w}) = {fmt(params)} MiB, can "
        f"show, less the full weights FSDP has gathered (up to {fmt(gathered)} MiB): "
        f"{fmt(expect)} MiB, "
    )
    if abs(residual) <= 0.05 * saving:
        text += f"{fmt(abs(residual))} MiB from the measured {fmt(got)} MiB."
    else:
        text += f"which leaves {fmt(residual)} MiB of the measured {fmt(got)} MiB unexplained."
    if not any(math.isnan(b) for b in before):
        done = before[0] - before[1]
        text += (
            f" The gradient half shows once backward has produced every gradient: allocated "
            f"before the optimizer step, {fmt(before[0])} MiB against {fmt(before[1])} MiB, "
            f"{fmt(done)} MiB saved ({pct(done / saving)} of the expected saving)."
        )
    return text


def expected_saving(fs) -> tuple[int, int, int, float]:
    """The FSDP run's sharded and replicated parameter counts, its world size, and the MiB per
    rank FSDP should save beyond optimizer-state sharding (all-gather buffers ignored)."""
    s, rep, w = int(fs.sharded_params), int(fs.replicated_params), int(fs.world_size)
    return s, rep, w, fsdp_saving_vs_optimizer_sharding(s, rep, w) / MiB


def q32_short(df: pd.DataFrame, measured: bool) -> str:
    """Q32 at the handout's length (1-2 sentences): the expected saving and, where measured,
    the peak-to-peak one; `q32` holds the details."""
    so, fs = one(df, "sharded_optimizer"), one(df, "fsdp")
    if fs is None:
        return ""
    s, _, w, saving = expected_saving(fs)
    text = (
        f"Beyond optimizer-state sharding, FSDP also shards the fp32 parameters and gradients, "
        f"so each rank should hold (4 + 4) B × {s:,} × (1 − 1/{w}) less, minus the replicated "
        f"norms' optimizer state: **{fmt(saving)} MiB** per rank (all-gather buffers ignored)."
    )
    peak_so, peak_fs = number(so, "mem_backward_peak_mb"), number(fs, "mem_backward_peak_mb")
    if measured and not math.isnan(peak_so) and not math.isnan(peak_fs):
        got = peak_so - peak_fs
        text += (
            f" Measured, the backward peak falls by {fmt(got)} MiB ({pct(got / saving)} of that; "
            f"the details below say where the rest is)."
            if got < 0.95 * saving
            else f" Measured, the backward peak falls by {fmt(got)} MiB ({pct(got / saving)})."
        )
    return text


def _held_gap(so: pd.Series, fs: pd.Series, gap: float) -> str:
    """Why the counted saving differs from the formula's by `gap` MiB: the formula assumes the
    sharded optimizer splits its state evenly (it assigns whole parameters to ranks) and no
    padding of FSDP's shards; what these two leave of the gap is unexplained."""
    n = int(so.sharded_params) + int(so.replicated_params)
    uneven = float(so.optimizer_state_mb) - 8 * n / int(so.world_size) / MiB
    pad = 16 * number(fs, "fsdp_pad_elems") / MiB
    pad = 0.0 if math.isnan(pad) else pad
    parts = []
    if abs(uneven) > 0.1 * abs(gap):
        parts.append(
            f"the sharded optimizer assigns whole parameters to ranks, so its largest rank holds "
            f"{fmt(uneven)} MiB more optimizer state than the even split the formula assumes"
        )
    if pad > 0.1 * abs(gap):
        parts.append(f"FSDP pads its shards, {fmt(pad)} MiB the formula leaves out")
    rest = gap - uneven + pad
    if abs(rest) > 0.1 * abs(gap):
        parts.append(f"{fmt(rest)} MiB of it is not explained")
    return "; ".join(parts)


def _held_sentence(so: pd.Series, fs: pd.Series, saving: float) -> str:
    """The counted saving (tensors held, max over ranks) against the formula's: they count the
    same tensors, so they match unless the layout departs from the formula's (`_held_gap`)."""
    held = float(so.held_mb) - float(fs.held_mb)
    text = (
        f" The tensors each rank holds (parameters, gradients, optimizer state: counted, "
        f"max over ranks) come to {fmt(float(so.held_mb))} MiB with the sharded optimizer "
        f"and {fmt(float(fs.held_mb))} MiB with FSDP, a saving of **{fmt(held)} MiB**"
    )
    gap = held - saving
    if abs(gap) <= 0.01 * saving:
        return text + " (the count the formula makes, so it matches by construction)."
    return text + (
        f", {fmt(abs(gap))} MiB {'more' if gap > 0 else 'less'} than the formula's "
        f"{fmt(saving)} MiB, which counts the same tensors: {_held_gap(so, fs, gap)}."
    )


def q32(df: pd.DataFrame, measured: bool) -> str:
    so, fs = one(df, "sharded_optimizer"), one(df, "fsdp")
    d = ok(df)
    if fs is None or not len(d):
        return ""
    s, rep, w, saving = expected_saving(fs)
    text = (
        f"Optimizer-state sharding splits only the AdamW moments (8 bytes per parameter) over "
        f"the ranks; FSDP also splits the fp32 parameters and gradients of its units ({s:,} "
        f"parameters: every block's weights and norm gains, the embedding and the LM head; the "
        f"other {rep:,} stay replicated, with their whole AdamW state). The expected saving per "
        f"rank, all-gather buffers ignored (`core/costs.py:fsdp_saving_vs_optimizer_sharding`), "
        f"is (4 + 4) bytes × {s:,} × (1 − 1/{w}) for the sharded parameters and gradients, less "
        f"8 bytes × {rep:,} × (1 − 1/{w}) of replicated optimizer state: **{fmt(saving)} MiB**."
    )
    if so is not None:
        text += _held_sentence(so, fs, saving)
        peak_so, peak_fs = number(so, "mem_backward_peak_mb"), number(fs, "mem_backward_peak_mb")
        if measured and not math.isnan(peak_fs) and not math.isnan(peak_so):
            got = peak_so - peak_fs
            short = saving - got
            text += (
                f" Peak to peak, the allocator's peak during backward is {fmt(peak_so)} MiB with "
                f"the sharded optimizer and {fmt(peak_fs)} MiB with FSDP: a saving of "
                f"**{fmt(got)} MiB**, {pct(got / saving)} of the expected one."
            )
            if short > 0.05 * saving:
                text += _peak_gap(so, fs, s, w, saving, got)
    return text + left_out(df, ("sharded_optimizer",))
