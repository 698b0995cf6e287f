"""Report context and figures for the `fsdp` stage (questions 32 and 33: fsdp_accounting).

(a) FSDP's expected saving against optimizer-state sharding comes from
`core/costs.py:training_state_bytes` (parameters, gradients and AdamW state one rank holds under
each scheme, all-gather buffers ignored) beside the measured bytes each rank holds and the
measured peaks; (b) whether the weight all-gathers finish in time comes from the profiled step:
the all-gather time on the timeline and the share of it that ran while compute ran
(`profiling/overlap.py`), with fp32 and bf16 compute, units of a block and of a layer, and the
part of the step the GPU ran anything at all (a step whose GPU idles is host-bound, whatever its
communication does). Memory in MiB (2^20 bytes).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336_systems.core import sanity
from cs336_systems.core.analysis import (
    failed_points,
    fmt,
    load,
    mark_suspect,
    md_table,
    ok,
    pct,
    plot_main,
    ran,
)
from cs336_systems.core.costs import fsdp_saving_vs_optimizer_sharding, training_state_bytes

BYTES_PER_MB = 2**20  # the stage's "_mb" columns are MiB
LABELS = {
    "ddp": "DDP",
    "ddp_bf16": "DDP (bf16 autocast)",
    "sharded_optimizer": "DDP + sharded optimizer",
    "fsdp": "FSDP (fp32)",
    "fsdp_bf16": "FSDP (bf16 compute)",
    "fsdp_layer": "FSDP (fp32, per layer)",
    "fsdp_bf16_layer": "FSDP (bf16 compute, per layer)",
    "ddp_bf16_compiled": "DDP (bf16 autocast, compiled blocks)",
    "fsdp_bf16_compiled": "FSDP (bf16 compute, compiled blocks)",
}
# a profiled step whose GPU ran kernels less than this share of it waited for the host
HOST_BOUND_BUSY = 0.8
SCHEME = {"ddp": "ddp", "sharded_optimizer": "sharded_optimizer", "fsdp": "fsdp"}
# an all-gather counts as finishing in time when compute hides at least this share of it
IN_TIME_SHARE = 0.8


def _row(df: pd.DataFrame, variant: str) -> pd.Series | None:
    rows = ok(df)[ok(df)["variant"] == variant] if len(df) else df
    return rows.iloc[0] if len(rows) else None


def _suspects(df: pd.DataFrame, variants) -> list[str]:
    """Of `variants`, those that ran only as suspect rows (no sentence may rest on them)."""
    if not len(df):
        return []
    r = ran(df)
    flagged = set(r[sanity.is_suspect(r)]["variant"])
    return [v for v in variants if v in flagged and _row(df, v) is None]


def _left_out(df: pd.DataFrame, variants) -> str:
    """' Left out of this answer: DDP (1 suspect point excluded: see Suspect numbers).' or ''."""
    sus = _suspects(df, variants)
    if not sus:
        return ""
    names = ", ".join(LABELS.get(v, v) for v in sus)
    return f" Left out of this answer: {names}{sanity.excluded(len(sus))}."


def _missing(df: pd.DataFrame, variants, failed: str) -> str:
    """What a question says when the runs it needs have no sentence: suspect, or failed."""
    return sanity.missing_answer([LABELS.get(v, v) for v in _suspects(df, variants)], failed)


def _label(variant: str, suspect) -> str:
    return mark_suspect(LABELS.get(variant, variant), bool(suspect))


def _num(r: pd.Series | None, col: str) -> float:
    if r is None or col not in r or pd.isna(r[col]):
        return math.nan
    return float(r[col])


WAITED = "compute waited for all-gathers (ms)"  # (GPU runs that measured it)


def time_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every run that ran, a suspect one's step time marked."""
    rows = []
    d = ran(df)
    for r, flag in zip(d.itertuples(), sanity.is_suspect(d), strict=True):
        g = r._asdict()
        rows.append(
            {
                "run": LABELS.get(r.variant, r.variant),
                "step (ms)": mark_suspect(f"{fmt(r.step_ms_mean)} ± {fmt(r.step_ms_std)}", flag),
                "forward (ms)": r.fwd_ms_mean,
                "backward (ms)": r.bwd_ms_mean,
                "sync after backward (ms)": r.comm_ms_mean,
                "optimizer (ms)": r.opt_ms_mean,
                "collective calls / step": _calls(g),
                "all-gather MiB / step": g.get("all_gather_into_tensor_mb", math.nan),
                "reduce-scatter MiB / step": g.get("reduce_scatter_tensor_mb", math.nan),
                "all-reduce MiB / step": g.get("all_reduce_mb", math.nan),
                "all-gather on timeline (ms)": g.get("prof_all_gather_ms", math.nan),
                "all-gather hidden": pct(g.get("prof_all_gather_overlap_share", math.nan)),
                WAITED: fmt(g.get("prof_all_gather_waited_ms", math.nan)),
                "GPU busy in the profiled step": _busy_text(g),
            }
        )
    return pd.DataFrame(rows)


def _calls(g: dict) -> str:
    kinds = (
        ("all_gather_into_tensor", "AG"),
        ("reduce_scatter_tensor", "RS"),
        ("all_reduce", "AR"),
    )
    parts = [(g.get(f"{k}_calls", math.nan), name) for k, name in kinds]
    return ", ".join(f"{int(n)} {name}" for n, name in parts if n == n and n > 0) or "0"


def _busy(g) -> float:
    """The share of the profiled step in which the GPU ran any kernel (NaN on the CPU)."""
    busy, step = g.get("prof_gpu_busy_ms", math.nan), g.get("prof_step_ms", math.nan)
    return busy / step if busy == busy and step and step == step else math.nan


def _busy_text(g) -> str:
    b = _busy(g)
    return "n/a" if b != b else f"{pct(b)} of {fmt(g['prof_step_ms'], 0)} ms"


MEMORY_ROWS = [
    ("params_mb", "parameters held"),
    ("grads_mb", "gradients held"),
    ("optimizer_state_mb", "optimizer state held"),
    ("held_mb", "parameters + gradients + optimizer state"),
    ("gathered_peak_mb", "most gathered full weights at once"),
    ("mem_init_allocated_mb", "allocated after construction"),
    ("mem_init_peak_mb", "peak during construction"),
    ("mem_forward_peak_mb", "peak during forward"),
    ("mem_backward_peak_mb", "peak during backward (and sync)"),
    ("mem_before_step_allocated_mb", "allocated before optimizer step"),
    ("mem_after_step_allocated_mb", "allocated after optimizer step"),
    ("mem_step_peak_mb", "peak during optimizer step"),
]


def memory_table(df: pd.DataFrame, measured: bool) -> pd.DataFrame:
    """Every run that ran, one column each (a suspect run's name marked)."""
    d = ran(df)
    rows = MEMORY_ROWS if measured else MEMORY_ROWS[:5]
    out = {"MiB per rank (max over ranks)": [label for _, label in rows]}
    for r, flag in zip(d.itertuples(), sanity.is_suspect(d), strict=True):
        out[_label(r.variant, flag)] = [getattr(r, col, math.nan) for col, _ in rows]
    return pd.DataFrame(out)


def analytic(df: pd.DataFrame, shown: bool = False) -> pd.DataFrame:
    """Per scheme: the analytic state bytes per rank beside the measured held bytes; runs that
    passed the sanity checks, or with `shown` (the report's table) every run that ran, a suspect
    one's name marked."""
    d = ran(df) if shown else ok(df)
    if not len(d):
        return pd.DataFrame()
    w = int(d.iloc[0].world_size)
    flags = sanity.is_suspect(d)
    rows = []
    extra = (("ddp_bf16", "ddp"), ("fsdp_bf16", "fsdp"), ("fsdp_layer", "fsdp"))
    compiled = (("ddp_bf16_compiled", "ddp"), ("fsdp_bf16_compiled", "fsdp"))
    for variant, scheme in (*SCHEME.items(), *extra, ("fsdp_bf16_layer", "fsdp"), *compiled):
        these = d[d["variant"] == variant]
        if not len(these):
            continue
        r = these.iloc[0]
        s, rep = int(r.sharded_params), int(r.replicated_params)
        expect = training_state_bytes(s, rep, w, scheme) / BYTES_PER_MB
        pad = 16 * _num(r, "fsdp_pad_elems") / BYTES_PER_MB if scheme == "fsdp" else 0.0
        expect += 0.0 if math.isnan(pad) else pad
        rows.append(
            {
                "run": _label(variant, flags[these.index[0]]),
                "analytic (MiB)": expect,
                "measured, tensors held (MiB)": float(r.held_mb),
                "measured − analytic (MiB)": float(r.held_mb) - expect,
            }
        )
    return pd.DataFrame(rows)


def _setup(first: pd.Series) -> str:
    return (
        f"model `{first['size']}` ({fmt(first['params'] / 1e6, 1)} M parameters: d_model "
        f"{int(first['d_model'])}, d_ff {int(first['d_ff'])}, {int(first['num_layers'])} layers), "
        f"context {int(first['context_length'])}, batch {int(first['batch_per_rank'])} per rank, "
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
    params = 4 * s * (1 - 1 / w) / BYTES_PER_MB
    gathered = float(fs.gathered_peak_mb)
    rises = [_num(r, "mem_backward_peak_mb") - _num(r, "mem_forward_peak_mb") for r in (so, fs)]
    before = [_num(r, "mem_before_step_allocated_mb") for r in (so, fs)]
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


def q32(df: pd.DataFrame, measured: bool) -> str:
    so, fs = _row(df, "sharded_optimizer"), _row(df, "fsdp")
    d = ok(df)
    if fs is None or not len(d):
        return ""
    s, rep, w = int(fs.sharded_params), int(fs.replicated_params), int(fs.world_size)
    saving = fsdp_saving_vs_optimizer_sharding(s, rep, w) / BYTES_PER_MB
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
        held = float(so.held_mb) - float(fs.held_mb)
        text += (
            f" The tensors each rank holds (parameters, gradients, optimizer state: counted, "
            f"max over ranks) come to {fmt(float(so.held_mb))} MiB with the sharded optimizer "
            f"and {fmt(float(fs.held_mb))} MiB with FSDP, a saving of **{fmt(held)} MiB** (the "
            f"count the formula makes, so it matches by construction"
        )
        state_gap = float(so.optimizer_state_mb) - float(fs.optimizer_state_mb)
        if abs(state_gap) > 0.01 * saving:
            text += (
                f"; the sharded optimizer assigns whole parameters to ranks, so its largest "
                f"rank holds {fmt(state_gap)} MiB more optimizer state than an even split"
            )
        text += ")."
        peak_so, peak_fs = _num(so, "mem_backward_peak_mb"), _num(fs, "mem_backward_peak_mb")
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
    return text + _left_out(df, ("sharded_optimizer",))


def _exposed(r: pd.Series) -> float:
    """The gathers' time on the profiled step's timeline outside compute (ms; rounding noise
    of the subtraction clipped at 0)."""
    t = _num(r, "prof_all_gather_ms") - _num(r, "prof_all_gather_overlapped_ms")
    return t if math.isnan(t) or t > 1e-6 else 0.0


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
            text += (
                " The rest of their time fell where the GPU had no compute kernel to run "
                "(it waited for the host), not where compute waited for them."
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
}
FSDP_RUNS = ("fsdp", "fsdp_bf16", "fsdp_layer", "fsdp_bf16_layer", "fsdp_bf16_compiled")


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


def _compiled_sentence(df: pd.DataFrame) -> str:
    """What compiling the blocks' forward changes, for DDP and FSDP under bf16, and the compiled
    FSDP step against the compiled DDP step."""
    pairs = [
        (_row(df, v), _row(df, f"{v}_compiled"), name)
        for v, name in (("ddp_bf16", "DDP"), ("fsdp_bf16", "FSDP"))
    ]
    parts = [
        f"{name}'s step from {fmt(float(e.step_ms_mean))} to {fmt(float(c.step_ms_mean))} ms "
        f"(forward {fmt(float(e.fwd_ms_mean))} → {fmt(float(c.fwd_ms_mean))} ms, GPU busy "
        f"{pct(_busy(e))} → {pct(_busy(c))} of the profiled step)"
        for e, c, name in pairs
        if e is not None and c is not None
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
        f"({fmt(r_fsdp)}× faster)"
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


def context(results_dir: Path) -> dict:
    df = load(results_dir, "fsdp")
    if len(df) == 0:
        return {"available": False}
    first = df.iloc[0]
    d = ok(df)
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    kinds = sorted(set(df.get("optimizer", pd.Series(dtype=str)).dropna().astype(str)))
    words = {"adamw_fused": "fused kernels", "adamw_foreach": "foreach kernels"}
    ctx: dict = {
        "available": True,
        "setup": _setup(first),
        "optimizer": " and ".join(words.get(k, k) for k in kinds) or "its kind not recorded",
        "n_points": len(df),
        "n_ok": len(ran(df)),
        "failed_table": md_table(failed_points(df, ["variant"]).drop_duplicates())
        if len(ran(df)) < len(df)
        else "",
        "skipped": "",
        "missing": {
            "q32": _missing(df, ("fsdp",), "The FSDP run did not succeed."),
            "q33": _missing(df, ("fsdp", "fsdp_bf16"), "No FSDP run succeeded."),
        },
    }
    if len(skipped):
        cmds = sorted(set(skipped["command"].dropna().astype(str)))
        ctx["skipped"] = (
            f"This machine could not run the stage ({skipped['status'].iloc[0]}). On a machine "
            f"that can, this command measures it (what the workflow runs with "
            f"`--config preset={first.get('preset', 'gpu')} stages='[fsdp]'`):"
        )
        ctx["commands"] = cmds
    shown = ran(df)
    if not len(shown):
        return ctx
    measured = (
        bool(shown["mem_step_peak_mb"].notna().any()) if "mem_step_peak_mb" in shown else False
    )
    ctx["measured_peaks"] = measured
    times = time_table(df)
    waited = ran(df).get("prof_all_gather_waited_ms", pd.Series(dtype=float))
    ctx["waited"] = bool(pd.to_numeric(waited, errors="coerce").notna().any())
    ctx["time_table"] = md_table(times if ctx["waited"] else times.drop(columns=WAITED))
    ctx["memory_table"] = md_table(memory_table(df, measured))
    a = analytic(df, shown=True)
    ctx["analytic_table"] = md_table(a) if len(a) else ""
    for q, text in (("q32", q32(df, measured)), ("q33", q33(df) if len(d) else "")):
        if text:
            ctx[q] = text
    traces = sorted(set(d.get("trace", pd.Series(dtype=str)).dropna().astype(str)) - {""})
    ctx["traces"] = [f"{results_dir}/fsdp/raw/{t}" for t in traces]
    return ctx


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """The section's figures (stages/fsdp/figures.py)."""
    from cs336_systems.stages.fsdp.figures import draw

    return draw(results_dir, fig_dir)


if __name__ == "__main__":
    plot_main(plot)
