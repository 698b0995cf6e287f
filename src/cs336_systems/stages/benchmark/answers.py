"""The benchmark section's answers in words, each from the rows it names: the run's step counts
against the handout's protocol, how long a forward and a backward take and whether the steps
vary (benchmarking_script (b)), the phases of a training step (2026), backward over forward
(Q1), what the first steps cost and why a few warm-up steps are not enough (c), bf16 autocast's
and torch.compile's speedups and how bf16's moves with model size
(benchmarking_mixed_precision (c)), the best MFU, and the speed goal's point split into forward,
backward and optimizer against fused AdamW's byte floor. A point whose time is set by the host
(its bf16 step as long as its fp32 one though its matmuls run several times faster) is named as
such, not read as a property of the GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.core.costs import PATH_LABEL
from cs336_systems.core.results import is_suspect, text_column
from cs336_systems.reporting import questions, sanity
from cs336_systems.reporting.analysis import (
    faster_or_slower,
    fmt,
    ordered_sizes,
    pct,
    plural,
    ran,
    sig,
    sort_sizes,
)
from cs336_systems.reporting.host_bound import HOST_PEAK_RATIO, HOST_SPEEDUP
from cs336_systems.stages.benchmark.rows import (
    MODE_LABEL,
    PARTS_SLACK,
    backward_ratios,
    eager_naive,
    parts_vs_whole,
)

# a step varies little when its std is below this share of its mean
SMALL_CV = 0.05


def _span(g: pd.DataFrame, col: str) -> str:
    """'18.58 ms (`small`) to 99.13 ms (`large`)': the shortest and the longest, whichever
    sizes they are (a larger model can take less where a smaller one waits on the host)."""
    low, high = g.loc[g[col].idxmin()], g.loc[g[col].idxmax()]
    text = f"{fmt(low[col])} ms (`{low['size']}`)"
    return text + (f" to {fmt(high[col])} ms (`{high['size']}`)" if len(g) > 1 else "")


def pass_times(d: pd.DataFrame, every: pd.DataFrame | None = None) -> list[str]:
    """benchmarking_script (b): forward and backward (forward+backward minus forward) per size,
    eager, naive attention, per precision and context. The forward range covers every forward
    that passed the checks (`d`), also where its forward+backward did not (so no backward);
    forwards that ran but are suspect (`every`: the rows that ran) are counted as left out."""
    fwd_all = eager_naive(d[d["mode"] == "forward"])
    r = backward_ratios(eager_naive(d))
    ran_fwd = eager_naive(every[every["mode"] == "forward"]) if every is not None else fwd_all
    out = []
    for (prec, ctx), f in fwd_all.groupby(["precision", "context_length"]):
        f = sort_sizes(f.rename(columns={"step_ms_mean": "forward_ms"}))
        g = sort_sizes(r[(r["precision"] == prec) & (r["context_length"] == ctx)])
        n_ran = int(((ran_fwd["precision"] == prec) & (ran_fwd["context_length"] == ctx)).sum())
        left = n_ran - len(f)
        text = (
            f"{prec}, context {ctx}: a forward pass takes {_span(f, 'forward_ms')} "
            f"({plural(len(f), 'size')}" + (f"; {left} suspect left out" if left > 0 else "") + ")"
        )
        if len(g):
            text += (
                f", a backward pass (forward+backward minus forward) {_span(g, 'backward_ms')} "
                f"({plural(len(g), 'size')} with both passes)"
            )
        out.append(text)
    return out


def _point(r, precision: bool = True, context: bool = False) -> str:
    """`small` forward bf16 eager, naive attention (`context`: `small` at 512 forward ...)."""
    prec = f" {r['precision']}" if precision else ""
    at = f" at {int(r['context_length'])}" if context else ""
    return (
        f"`{r['size']}`{at} {MODE_LABEL[r['mode']]}{prec} {r['compile']}, "
        f"{r['attention']} attention"
    )


WHY_VARIES = {
    "cuda": "Where the GPU waits on the host (small models, short steps) the step time follows "
    "the host's scheduling, so it varies more.",
    "cpu": "On a CPU the step shares its cores with the operating system's work, so short "
    "steps vary most.",
}
WHY_FEW = {
    "cuda": "A step or two does not finish every one-time cost: the GPU's clocks still ramp up "
    "from idle, and the allocator and the libraries' algorithm choices meet some shapes (the "
    "optimizer's, the loss's) for the first time in the first full steps",
    "cpu": "A step or two does not finish every one-time cost: the allocator's free lists and "
    "the caches still fill, and the kernels' first calls at a shape pay their dispatch",
}


def variability(d: pd.DataFrame, n_steps: int, device: str = "cuda") -> str:
    """benchmarking_script (b): is the std small? The std over the measured steps as a share
    of the mean, over every point that passed the checks."""
    pts = d[d["step_ms_mean"] > 0].assign(cv=lambda x: x["step_ms_std"] / x["step_ms_mean"])
    if not len(pts):
        return ""
    high = sort_sizes(pts[pts["cv"] > SMALL_CV])
    worst = pts.loc[pts["cv"].idxmax()]
    ctx = pts["context_length"].nunique() > 1  # name the context where points differ in it
    text = (
        f"Over the {plural(len(pts), 'point')} ({n_steps} measured steps each), the std is "
        f"{pct(pts['cv'].median())} of the mean (median; at most {pct(worst['cv'])}, "
        f"{_point(worst, context=ctx)}): "
    )
    if not len(high):
        return text + f"small everywhere (below {pct(SMALL_CV)})."
    names = ", ".join(
        f"{_point(r, context=ctx)} ({pct(r['cv'])})" for _, r in high.head(6).iterrows()
    )
    return (
        text + f"small at {len(pts) - len(high)} of them, above {pct(SMALL_CV)} at "
        f"{len(high)}: {names}{', …' if len(high) > 6 else ''}. "
        + WHY_VARIES.get(device, WHY_VARIES["cpu"])
        + _beside(high)
    )


def _beside(high: pd.DataFrame) -> str:
    """How many of the varying points ran beside other jobs (sanity's `measured_beside`)."""
    if sanity.BESIDE not in high:
        return ""
    n = int((text_column(high[sanity.BESIDE]).str.len() > 0).sum())
    return f" {n} of them ran beside other jobs (see Suspect numbers)." if n else ""


PHASE_NAME = {"fwd": "forward phase", "bwd": "backward phase", "opt": "optimizer phase"}


def host_bound_note(hb: pd.DataFrame) -> str:
    """The host-bound points (rows.host_bound on every mode and every phase of the training
    step: one rule), each with what fired it."""
    if not len(hb):
        return ""
    has_phase = "phase" in hb
    items = ", ".join(
        _point(r, False)
        + (
            f" ({PHASE_NAME[r['phase']]} of the train step)"
            if has_phase and isinstance(r.get("phase"), str)
            else ""
        )
        + f" (bf16 {faster_or_slower(r['speedup'])} for a {r['peak_ratio']:.1f}× faster matmul)"
        for _, r in sort_sizes(hb).head(8).iterrows()
    )
    more = f" and {len(hb) - 8} more" if len(hb) > 8 else ""
    return (
        f"Host-bound (one rule for every mode and every phase of the training step: bf16 "
        f"shortens the time by less than {HOST_SPEEDUP}× though it shrinks the matmuls' time "
        f"{HOST_PEAK_RATIO:.0f}× or more; the optimizer's work, fp32 in both, is not shrunk, so "
        f"the rule leaves it to its point): {items}{more}. The host (kernel launches, the "
        "Python between them) sets their time, in every pass and phase of the point and in "
        "both precisions: ratios there describe the host, not the GPU, and the backward/forward "
        "and phase sentences leave those points out alike."
    )


def _se(r: pd.Series) -> float:
    """The standard error of a summary row's mean (`std_ms` over its `n_measured` steps)."""
    return float(r["std_ms"]) / max(int(r.get("n_measured", 1)), 1) ** 0.5


def _versus(a: pd.Series, b: pd.Series) -> tuple[float, float, str]:
    """(a's mean minus b's, twice their combined standard error, 'slower'/'faster'/'the same')."""
    diff = float(a["mean_ms"] - b["mean_ms"])
    noise = 2 * (_se(a) ** 2 + _se(b) ** 2) ** 0.5
    verdict = "the same" if abs(diff) <= noise else "slower" if diff > 0 else "faster"
    return diff, noise, verdict


def warmup_after(g: pd.DataFrame, device: str = "cuda") -> str:
    """benchmarking_script (c): the mean after 1 and 2 warm-up steps against the longest
    warm-up's, each count from a process of its own, and what follows from the difference: one
    or two steps too few (slower beyond twice the combined standard error), enough here (within
    it), or the longer warm-up slower, which no warm-up effect explains (a slow step fell in its
    measured window: its first step and std say where)."""
    if g.index.max() <= 2 or not any(k in g.index for k in (1, 2)):
        return ""
    top = int(g.index.max())
    ref = g.loc[top]
    parts, verdicts = [], {}
    for k in (1, 2):
        if k not in g.index:
            continue
        diff, noise, verdicts[k] = _versus(g.loc[k], ref)
        parts.append(
            f"after {k} warm-up step{'s' if k > 1 else ''} the mean is {fmt(g.loc[k, 'mean_ms'])} "
            f"ms against {fmt(ref['mean_ms'])} after {top} ({diff:+.2f} ms; twice the combined "
            f"standard error {fmt(noise)} ms: {verdicts[k]})"
        )
    text = "; ".join(parts)
    text = text[0].upper() + text[1:] + ". "
    seen = set(verdicts.values())
    if "slower" in seen:
        text += WHY_FEW.get(device, WHY_FEW["cpu"]) + "."
    elif "faster" in seen:
        text += _longest_slower(g, ref, top)
    else:
        reasons = WHY_FEW.get(device, WHY_FEW["cpu"]).split(": ", 1)[-1]
        text += (
            "So on this machine one or two warm-up steps leave no one-time cost that shows "
            "beyond the steps' spread. Elsewhere (a larger model, a device idle before the run) "
            f"they may: {reasons}."
        )
    return text + _late_slow_step(ref, top)


# medians within this share of each other: the counts' typical step is the same
SAME_MEDIAN = 0.03


def _longest_slower(g: pd.DataFrame, ref: pd.Series, top: int) -> str:
    """Why the longest warm-up's mean is the slower one: a slow first step, a few slow steps
    (its median what the shorter counts' medians are), or its whole window slower."""
    head = f"The {top}-warm-up run is the slower one, which more warm-up cannot cause: "
    slow = "it is a slow step inside its measured window, not a one-time cost left unpaid"
    if ref["first_measured_ms"] / ref["median_ms"] > 1.5:
        return head + slow + "."
    others = g.loc[[k for k in (1, 2) if k in g.index], "median_ms"]
    if ((others - ref["median_ms"]).abs() <= SAME_MEDIAN * others).all():
        return head + slow + f" (its median, {fmt(ref['median_ms'])} ms, is what the counts share)."
    return head + (
        f"its whole measured window ran slower (its median {fmt(ref['median_ms'])} ms against "
        f"{' and '.join(fmt(v) for v in others)} ms after fewer warm-up steps): that process "
        "ran slower throughout, not a one-time cost left unpaid."
    )


def warmup_vs_q1(g: pd.DataFrame, q1: pd.Series | None) -> str:
    """The sweep's point at Q1's warm-up count against Q1's same point (size, context, mode,
    precision, eager, naive attention), which ran in a process that had measured the point's
    other modes first: by how much they differ, and whether beyond twice the combined standard
    error; where they do, whether the medians agree (a few slow steps in one window) or not."""
    if q1 is None:
        return ""
    k = int(q1["warmup_steps"])
    if k not in g.index:
        return (
            f"Q1 measured this point after {k} warm-up steps, a count the sweep does not run, so "
            "the two are not compared."
        )
    mine = g.loc[k]
    other = pd.Series({"mean_ms": q1["step_ms_mean"], "std_ms": q1["step_ms_std"],
                       "n_measured": q1["measure_steps"]})  # fmt: skip
    diff, noise, verdict = _versus(mine, other)
    text = (
        f"Q1's same point (also {k} warm-up steps, in the process that had just measured the "
        f"point's other modes) took {fmt(q1['step_ms_mean'])} ms; the sweep's {k}-warm-up "
        f"run {fmt(mine['mean_ms'])} ms, {diff:+.2f} ms ({diff / q1['step_ms_mean']:+.1%})"
    )
    if verdict == "the same":
        return (
            text
            + f", within twice the combined standard error ({fmt(noise)} ms): they agree within the noise."
        )
    med = float(mine["median_ms"] - q1["step_ms_median"])
    if abs(med) <= noise:
        why = (
            f"their medians differ by only {med:+.2f} ms, so a few slow steps in one measured "
            "window make the difference, not the warm-up"
        )
    else:
        why = (
            f"their medians differ too ({med:+.2f} ms): the fresh process runs at another speed "
            "throughout, which the warm-up steps alone do not explain (unmeasured here: clocks, "
            "what the other job on the machine did)"
        )
    return text + f", beyond twice the combined standard error ({fmt(noise)} ms): {why}."


def _late_slow_step(ref: pd.Series, k: int) -> str:
    """The longest warm-up's own first measured step, where it is slow (over 1.5× its median):
    a slow step falls after any warm-up count, which one run per count cannot separate."""
    ratio = ref["first_measured_ms"] / ref["median_ms"]
    if not ratio > 1.5:
        return ""
    return (
        f" After {k} warm-up steps the first measured step still took "
        f"{fmt(ref['first_measured_ms'])} ms, {ratio:.1f}× that run's median, and its std is "
        f"{fmt(ref['std_ms'])} ms: a slow step can fall after any warm-up count, and one run "
        "per count does not tell it from the warm-up's effect."
    )


def speedup_trend(sp: pd.DataFrame) -> str:
    """benchmarking_mixed_precision (c): how the speedup moves as the model grows, per mode
    (the median over contexts of each size)."""
    out = []
    for mode in [m for m in MODE_LABEL if m in set(sp["mode"])]:
        g = sp[sp["mode"] == mode].groupby("size")["speedup"].median()
        g = g.reindex(ordered_sizes(g.index))
        if len(g) < 2:
            continue
        steps = g.diff().dropna()
        shape = (
            "grows with every size"
            if (steps > 0).all()
            else "falls with every size"
            if (steps < 0).all()
            else "grows overall"
            if g.iloc[-1] > g.iloc[0]
            else "does not grow"
        )
        out.append(
            f"{MODE_LABEL[mode]}: {shape}, {g.iloc[0]:.2f}× at `{g.index[0]}` to "
            f"{g.iloc[-1]:.2f}× at `{g.index[-1]}`"
        )
    return "; ".join(out)


def protocol_sentence(warmup: int, measured: int, df: pd.DataFrame) -> str:
    """The run's step counts against the handout's (5 and 10), and why a preset departs."""
    want = questions.PROTOCOL["benchmark"]
    if (warmup, measured) == (want["warmup_steps"], want["measure_steps"]):
        return "the handout's protocol"
    preset = str(df["preset"].iloc[0]) if "preset" in df else "?"
    why = questions.PROTOCOL_WHY.get(preset, f"the `{preset}` preset's config sets them")
    return (
        f"the handout asks {want['warmup_steps']} and {want['measure_steps']}; this run takes "
        f"fewer because {why}"
    )


def _spread(values: pd.Series, show) -> str:
    """The median of `values` per size, with its range where there are several."""
    if len(values) == 1:
        return f"{show(values.iloc[0])} (`{values.index[0]}`)"
    return (
        f"{show(values.median())} (median; {show(values.min())} at `{values.idxmin()}` to "
        f"{show(values.max())} at `{values.idxmax()}`)"
    )


def range_sentence(values: pd.Series, what: str) -> str:
    """'1.20× (0.94–1.70× across 3 points)'; one value: '1.41× (one point)' (`what` singular)."""
    if len(values) == 1:
        return f"{values.iloc[0]:.2f}× (one {what})"
    return (
        f"{values.median():.2f}× ({values.min():.2f}–{values.max():.2f}× across "
        f"{plural(len(values), what)})"
    )


# ---- the phases of a training step (2026) -------------------------------------------------

# the in-step phases' backward/forward and Q1's (its passes in runs of their own) differ by
# more than this at a size: both are shown, neither stands for the other
PASSES_DISAGREE = 0.2


def _sum_clause(g: pd.DataFrame, host: set) -> str:
    """What the three phases add up to (`parts_vs_whole`), the host-bound sizes left out, and
    every size whose parts exceed its step flagged with the gap."""
    pw = parts_vs_whole(g)
    kept = pw.drop(index=[x for x in pw.index if x in host])
    text = (
        f"the three phases add up to {_spread(kept['share'], pct)} of the whole step "
        f"({pw.attrs['stat']}s; the rest is zeroing the gradients and the synchronization "
        "around the step)"
        if len(kept)
        else "the phases' sum is not summarized (every size host-bound)"
    )
    over = pw[pw["over"]]
    if len(over):
        text += (
            "; **suspect**: at "
            + ", ".join(
                f"`{x}` the parts exceed the step by {fmt(-r.gap_ms)} ms ({pct(r.share)})"
                for x, r in over.iterrows()
            )
            + ", which cannot be: each phase lies inside the step"
        )
    return text


def backward_shorter(g: pd.DataFrame, host: set) -> str:
    """Each size of `g` whose backward phase is shorter than its forward (it has twice the
    forward's matmul FLOPs): explained where the size is host-bound (its forward is the host's
    launch time, which backward, launched by autograd's C++ engine, pays less of), else
    flagged as suspect."""
    short = g[g["bwd_ms_median"] < g["fwd_ms_median"]]
    out = []
    for x, r in short.iterrows():
        head = f"`{x}`'s backward ({fmt(r.bwd_ms_median)} ms) is shorter than its forward ({fmt(r.fwd_ms_median)} ms)"
        if x in host:
            out.append(
                head + ", though it has twice its matmul FLOPs: the size is host-bound, so "
                "the forward's time is the host launching its kernels one by one from Python, "
                "which backward (launched by autograd's C++ engine) pays less of"
            )
        else:
            out.append(
                head + ", though it has twice its matmul FLOPs and the size is not host-bound: "
                "**suspect**, the marks between the phases may be misplaced"
            )
    return "; ".join(out)


def host_sizes(hb: pd.DataFrame | None, prec: str, ctx: int) -> set:
    """The sizes at `ctx` whose eager naive point the host-bound rule fired on (`hb`:
    rows.host_bound_points), in `prec`."""
    if hb is None or not len(hb):
        return set()
    at = hb[(hb["context_length"] == ctx) & (hb["precision"] == prec)]
    return set(at[(at["compile"] == "eager") & (at["attention"] == "naive")]["size"])


def phase_sentence(
    d: pd.DataFrame, g: pd.DataFrame, prec: str, ctx: int, hb: pd.DataFrame | None
) -> str:
    """One precision's phases (`g`: its eager naive training steps at `ctx`, by size): the
    optimizer's share, backward over forward and what the three phases add up to. A host-bound
    size (`hb`: every mode, phase and precision of a point where the rule fired) is left out of
    all three alike; sizes where Q1 disagrees leave the ratio; a backward shorter than its
    forward is explained or flagged. A suspect size leaves the ratio (named by count): one
    whose backward phase is shorter than its forward (`backward_shorter` flags it) and one the
    sanity checks doubt the times of (`g`'s `sanity` column, where it has one)."""
    host = host_sizes(hb, prec, ctx) & set(g.index)
    kept = g.drop(index=[x for x in g.index if x in host])
    share = kept["opt_ms_median"] / kept["step_ms_median"]
    ratio = kept["bwd_ms_median"] / kept["fwd_ms_median"]
    low = ratio.index[ratio < 1]
    doubted = kept.index[is_suspect(kept, "time").to_numpy()].difference(low)
    ratio = ratio.drop(index=[*low, *doubted])
    out = _left_out((len(low), SHORT_WHY), (len(doubted), "suspect, see Suspect numbers"))
    left = (
        f" ({', '.join(f'`{x}`' for x in sorted(host))} left out of each of these: host-bound, "
        "see above)"
        if host
        else ""
    )
    off, clause = _passes_disagree(d, prec, ctx, ratio)
    ratio = ratio.drop(index=off)
    text = (
        f"{prec}{left}: the optimizer step takes "
        + (f"{_spread(share, pct)} of the training step, " if len(share) else "– of the step, ")
        + (
            f"backward {_spread(ratio, lambda v: f'{v:.2f}×')} the forward time{out}{clause}, "
            if len(ratio)
            else f"backward/forward not given{out}{clause}, "
        )
        + "and "
        + _sum_clause(g, host)
    )
    short = backward_shorter(g, host)
    return text + (f". {short[0].upper()}{short[1:]}" if short else "")


def _passes_disagree(d: pd.DataFrame, prec: str, ctx: int, ratio: pd.Series):
    """The sizes where Q1's backward/forward (forward+backward minus forward, runs of their
    own) and the in-step phases' differ by more than PASSES_DISAGREE, and a clause naming both
    and which pass parts: each pass in the step against Q1's, and the other precision's forward
    at the same size for contrast."""
    q1 = eager_naive(backward_ratios(d))
    q1 = q1[q1["context_length"] == ctx].set_index(["precision", "size"])
    mine = q1.loc[prec] if prec in q1.index.get_level_values(0) else q1.iloc[:0]
    off = [
        x
        for x in ratio.index
        if x in mine.index and abs(ratio[x] / mine.loc[x, "ratio"] - 1) > PASSES_DISAGREE
    ]
    if not off:
        return [], ""
    each = ", ".join(
        f"`{x}` {ratio[x]:.2f}× in the step, {mine.loc[x, 'ratio']:.2f}× in Q1" for x in off
    )
    step = eager_naive(ran(d))
    step = step[(step["mode"] == "train_step") & (step["context_length"] == ctx)]
    step = step.set_index(["precision", "size"])
    passes = []
    for x in off:
        if (prec, x) not in step.index:
            continue
        r, q = step.loc[(prec, x)], mine.loc[x]
        text = (
            f"`{x}`: forward {fmt(r['fwd_ms_median'])} ms in the step against "
            f"{fmt(q['forward_ms'])} in Q1's forward run ({r['fwd_ms_median'] / q['forward_ms']:.2f}×), "
            f"backward {fmt(r['bwd_ms_median'])} against {fmt(q['backward_ms'])} "
            f"({r['bwd_ms_median'] / q['backward_ms']:.2f}×)"
        )
        other = next((o for o in ("fp32", "bf16") if o != prec and (o, x) in step.index), None)
        if other and (other, x) in q1.index:
            f_o = step.loc[(other, x), "fwd_ms_median"] / q1.loc[(other, x), "forward_ms"]
            text += f"; {other}'s forward {f_o:.2f}× its Q1 run's"
        passes.append(text)
    return off, (
        f" (left out where Q1's passes, each timed in runs of its own, disagree by more than "
        f"{PASSES_DISAGREE:.0%}: {each}"
        + (f"; per pass, {'; '.join(passes)}" if passes else "")
        + "; neither timing checks the other, and what makes them part was not measured)"
    )


# ---- Q1: backward over forward -------------------------------------------------------------


def backward_short(r: pd.DataFrame) -> pd.Series:
    """Which of Q1's points have backward shorter than forward (suspect: `q1_backward_shorter`)."""
    return r["ratio"] < 1


# why a point whose backward is shorter than its forward is left out of a ratio
SHORT_WHY = "suspect, see its note"


def _left_out(*counted: tuple[int, str]) -> str:
    """' (1 point left out: suspect, see its note; ...)' for each (count, why) with a count."""
    said = [f"{plural(n, 'point')} left out: {why}" for n, why in counted if n]
    return f" ({'; '.join(said)})" if said else ""


def backward_sentences(r: pd.DataFrame, dropped: pd.DataFrame) -> dict[str, str]:
    """{precision: backward/forward over the points `r` kept, less the ones
    `q1_backward_shorter` calls suspect, and how many of `dropped` (every point that ran) it
    left out}."""
    out = {}
    for prec, g in r.groupby("precision"):
        kept = g[~backward_short(g)]
        n_out = int((dropped["precision"] == prec).sum()) - len(g)
        text = range_sentence(kept["ratio"], "size/context point") if len(kept) else "–"
        out[prec] = text + _left_out(
            (len(g) - len(kept), SHORT_WHY), (n_out, "suspect or host-bound")
        )
    return out


def q1_backward_shorter(r: pd.DataFrame) -> str:
    """Q1's points (`r`: not host-bound, not suspect) whose backward (forward+backward minus
    forward) is shorter than their forward though it has twice its matmul FLOPs: suspect."""
    short = sort_sizes(r[backward_short(r)])
    if not len(short):
        return ""
    items = ", ".join(
        f"`{x['size']}` context {x['context_length']} {x['precision']} ({fmt(x['backward_ms'])} "
        f"against {fmt(x['forward_ms'])} ms)"
        for _, x in short.iterrows()
    )
    return (
        f"**Suspect**: backward shorter than forward at {items}, though backward has twice the "
        "forward's matmul FLOPs and these points are not host-bound: the difference of two "
        "separately timed modes, each with its own step-to-step spread, does not hold there."
    )


def backward_extremes(r: pd.DataFrame) -> str:
    """The largest and the smallest backward/forward ratio, with their points, over the points
    `q1_backward_shorter` does not call suspect ("" below two of them)."""
    kept = r[~backward_short(r)]
    if len(kept) < 2:
        return ""
    hi = kept.loc[kept["ratio"].idxmax()]
    lo = kept.loc[kept["ratio"].idxmin()]
    return (
        f"the largest ratio is {hi.ratio:.2f}× ({hi['size']}, context {hi.context_length}, "
        f"{hi.precision}) and the smallest {lo.ratio:.2f}× ({lo['size']}, context "
        f"{lo.context_length}, {lo.precision})" + _left_out((len(r) - len(kept), SHORT_WHY))
    )


# ---- Q2: the first steps and warm-up -------------------------------------------------------

WHY_FIRST_STEP = {
    "cuda": "The first step costs more because it pays one-time work that later steps reuse: "
    "library handles (cuBLAS, cuDNN) are created, kernels are loaded and their algorithms chosen, "
    "and the caching allocator grows its pool with real cudaMalloc calls.",
    "cpu": "The first step costs more because it pays one-time work that later steps reuse: the "
    "allocator grows the process's heap (page faults on fresh memory), and the CPU kernels' "
    "one-time dispatch and primitive caches are filled.",
}


def why_first_step(w: pd.DataFrame) -> str:
    return WHY_FIRST_STEP.get(str(w["device"].iloc[0]), WHY_FIRST_STEP["cpu"])


def first_steps(size: str, g: pd.DataFrame) -> dict:
    """Without warm-up (`g`: the sweep's summary of `size` by warm-up count): the first measured
    step against the median, and the std after each warm-up count against none's."""
    if 0 not in g.index:
        return {}
    z = g.loc[0]
    out: dict = {"first_ratio": z.first_measured_ms / z.median_ms}
    out["sentence0"] = (
        f"With no warm-up, the first measured step of `{size}` takes "
        f"{z.first_measured_ms:.1f} ms, {out['first_ratio']:.1f}× the median step "
        f"({z.median_ms:.1f} ms); the std over the measured steps is {z.std_ms:.2f} ms "
        f"(mean {z.mean_ms:.1f} ms)."
    )
    for k in sorted(i for i in g.index if i > 0):
        row = g.loc[k]
        change = 1 - row.std_ms / z.std_ms if z.std_ms > 0 else float("nan")
        out.setdefault("after", []).append(
            f"with {k} warm-up step{'s' if k > 1 else ''} the std is {row.std_ms:.2f} ms "
            f"({'−' if change >= 0 else '+'}{abs(100 * change):.1f}%) and the mean {row.mean_ms:.1f} ms"
        )
    return out


# ---- Q3: bf16 and compile speedups ---------------------------------------------------------


def no_pairs(what: str, n_excluded: int = 0) -> str:
    return f"No pairs of points to compare for {what}" + sanity.excluded(n_excluded, "pair") + "."


def speedup_sentence(sp: pd.DataFrame, what: str, n_excluded: int = 0) -> str:
    """`what`'s speedup over the pairs `sp`: median and range, the suspect pairs left out."""
    excluded = sanity.excluded(n_excluded, "pair")
    return (
        f"{what}: {range_sentence(sp['speedup'], 'point')} (median, range"
        + excluded.replace(" (", "; ", 1).removesuffix(")")
        + ")."
        if len(sp) > 1
        else f"{what}: {range_sentence(sp['speedup'], 'point')}{excluded}."
    )


def _host_mask(sp: pd.DataFrame, hb: pd.DataFrame | None) -> np.ndarray:
    """Which of the speedup pairs `sp` the host-bound rule fired on (`hb`: its points)."""
    if hb is None or not len(hb) or not len(sp):
        return np.zeros(len(sp), dtype=bool)
    keys = ["size", "context_length", "compile", "attention", "mode"]
    hit = sp.merge(hb[keys].drop_duplicates(), on=keys, how="left", indicator=True)
    return (hit["_merge"] == "both").to_numpy()


def without_host_bound(sp: pd.DataFrame, hb: pd.DataFrame | None) -> str:
    """The bf16 speedup's pairs the host-bound rule fires on (rows.host_bound: the host sets
    their time), and the median and range without them."""
    mask = _host_mask(sp, hb)
    if not mask.any():
        return ""
    kept = sp[~mask]
    rest = (
        f"without them {range_sentence(kept['speedup'], 'point')}"
        if len(kept)
        else "no pair is left without them"
    )
    return (
        f"{plural(int(mask.sum()), 'pair')} of these are host-bound (the rule in Q1's note: "
        f"bf16 barely shortens them), so the speedup there is the host's; {rest}."
    )


def losers(sp: pd.DataFrame) -> str:
    """The points where the speedup is below 1, or that it pays everywhere."""
    lose = sp[sp["speedup"] < 1.0]
    if not len(lose):
        return "It pays at every measured point."
    # the attention names the point where a size, context and mode repeat across attentions
    many = "attention" in lose and lose["attention"].nunique() > 1
    items = ", ".join(
        f"{r['size']} ctx {r.context_length} {MODE_LABEL[r['mode']]}"
        + (f" ({r['attention']} attention, {r.speedup:.2f}×)" if many else f" ({r.speedup:.2f}×)")
        for _, r in sort_sizes(lose).head(8).iterrows()
    )
    where = (
        "any measured point"
        if len(lose) == len(sp)
        else f"{plural(len(lose), 'point')} of {len(sp)}"
    )
    return f"It does not pay (speedup below 1) at {where}: {items}."


def other_attentions(sp: pd.DataFrame, hb: pd.DataFrame | None = None) -> str:
    """bf16's speedup per attention other than naive, and without the pairs the host-bound
    rule fires on (`hb`), as naive's headline gives it."""
    out = []
    for att, g in sp.groupby("attention"):
        text = f"{att} attention: {range_sentence(g['speedup'], 'point')}"
        mask = _host_mask(g.reset_index(drop=True), hb)
        if mask.any():
            kept = g["speedup"].to_numpy()[~mask]
            rest = range_sentence(pd.Series(kept), "point") if len(kept) else "none left"
            text += f" ({plural(int(mask.sum()), 'pair')} host-bound; without them {rest})"
        out.append(text)
    return "; ".join(out)


# ---- Q4: MFU ---------------------------------------------------------------------------------


def mfu_missing(r: pd.DataFrame) -> list[str]:
    """'precision: why' of the ceilings the rows `r` lack (no MFU without them)."""
    return sorted(
        {
            f"{p}: {str(path).removeprefix('missing: ')}"
            for p, path in zip(r["precision"], r["peak_path"], strict=True)
            if str(path).startswith("missing")
        }
    )


def mfu_paths(r: pd.DataFrame) -> list[str]:
    """'precision: path' of the ceilings the rows `r` are held to."""
    return sorted(
        {
            f"{p}: {PATH_LABEL.get(path, path)}"
            for p, path in zip(r["precision"], r["peak_path"], strict=True)
            if not str(path).startswith("missing")
        }
    )


def against_datasheet(r: pd.Series) -> str:
    """', X% of the datasheet's Y TFLOP/s (dense <precision>, <device>)' or why there is none."""
    sheet = r.get("mfu_datasheet")
    if sheet is None or pd.isna(sheet):
        return (
            f"; no datasheet MFU (`{r.get('device_name', '?')}` is not in core/costs.py "
            "DATASHEET_TFLOPS)"
        )
    return (
        f"; {pct(sheet)} of the datasheet's {sig(r['datasheet_tflops'])} TFLOP/s (dense "
        f"{r['precision']}, {r.get('device_name', '?')})"
    )


def mfu_best(d: pd.DataFrame) -> str:
    """The point with the highest MFU, with its TFLOP/s, the ceiling it is held to and its MFU
    against the datasheet's peak."""
    best = d.loc[d["mfu"].idxmax()]
    return (
        f"{pct(best.mfu)} MFU ({sig(best.tflops)} TFLOP/s of a measured "
        f"{sig(best.peak_tflops)} TFLOP/s through "
        f"{PATH_LABEL.get(best.peak_path, best.peak_path)}{against_datasheet(best)}) "
        f"for `{best['size']}` at context {best.context_length}, {MODE_LABEL[best['mode']]}, "
        f"{best.precision}, {best['compile']}"
    )


def datasheet_peaks(d: pd.DataFrame) -> str:
    """'fp32 67, bf16 989.5 TFLOP/s (NVIDIA H100 80GB HBM3)': the datasheet peaks the rows are
    held to, or why there are none."""
    if "datasheet_tflops" not in d or d["datasheet_tflops"].isna().all():
        names = sorted({str(x) for x in d.get("device_name", pd.Series(["?"])).dropna()})
        return f"none: {', '.join(names) or 'the device'} is not in core/costs.py DATASHEET_TFLOPS"
    g = d.dropna(subset=["datasheet_tflops"]).groupby("precision")["datasheet_tflops"].first()
    dev = ", ".join(sorted({str(x) for x in d.get("device_name", pd.Series(dtype=str)).dropna()}))
    return ", ".join(f"{p} {sig(v)}" for p, v in g.items()) + f" TFLOP/s ({dev})"


# ---- the speed goal's point -------------------------------------------------------------

# fused AdamW per fp32 parameter: reads param, grad, exp_avg, exp_avg_sq; writes all but grad
ADAMW_BYTES_PER_PARAM = 4 * 4 + 3 * 4


def goal_breakdown(d: pd.DataFrame, ceilings: pd.DataFrame) -> list[str]:
    """The speed goal's point (xl, context 512, bf16, compiled, train step), per attention, with
    the step split into forward, backward and optimizer by the step's own phase marks (where
    they are missing, by the differences of the three modes' means, said as such: runs made
    before the forward_backward mode set the gradients to None added into them, which put that
    difference below the optimizer's floor). An optimizer time below fused AdamW's byte floor
    at the measured copy bandwidth cannot be right: it is shown as suspect."""
    sel = d[
        (d["size"] == "xl")
        & (d["context_length"] == 512)
        & (d["precision"] == "bf16")
        & (d["compile"] == "compiled")
    ]
    if "engine" in sel:
        sel = sel[sel["engine"].fillna("plain") == "plain"]
    copy = (
        ceilings[(ceilings.get("kind") == "copy") & (ceilings.get("status") == "ok")]
        if len(ceilings)
        else ceilings
    )
    copy_gbps = float(copy["gbps"].iloc[0]) if len(copy) else float("nan")
    out = []
    for attention, g in sel.groupby("attention"):
        t = g.set_index("mode")["step_ms_mean"]
        if "train_step" not in t:
            continue
        row = g[g["mode"] == "train_step"].iloc[0]
        text = (
            f"attention `{attention}`: {row.step_ms_mean:.1f} ms per step, {sig(row.tflops)} "
            + (
                f"TFLOP/s, **{pct(row.mfu)} MFU** against the measured bf16 peak of the model's "
                f"path ({sig(row.peak_tflops)} TFLOP/s){against_datasheet(row)}"
                if row.mfu == row.mfu
                else "TFLOP/s (no MFU: this run has no bf16 ceiling through the model's path)"
            )
        )
        phases = [row.get(f"{p}_ms_mean", float("nan")) for p in ("fwd", "bwd", "opt")]
        if all(x == x for x in phases):
            fwd, bwd, opt = phases
            how = "timed between marks within the step"
        elif {"forward", "forward_backward"} <= set(t.index):
            fwd, fb = t["forward"], t["forward_backward"]
            bwd, opt = fb - fwd, row.step_ms_mean - fb
            how = "differences of the forward, forward+backward and step modes' means"
        else:
            out.append(text)
            continue
        floor = ADAMW_BYTES_PER_PARAM * row.params / (copy_gbps * 1e9) * 1e3
        text += (
            f". Of the step ({how}), forward takes {fwd:.1f} ms, backward {bwd:.1f} ms and the "
            f"optimizer {opt:.1f} ms ({100 * opt / row.step_ms_mean:.0f}% of the step, which "
            "adds no counted FLOPs)"
        )
        gap = row.step_ms_mean - (fwd + bwd + opt)
        text += (
            f", {gap:.1f} ms of the step outside the three (zeroing the gradients, the "
            "synchronization)"
            if gap >= -PARTS_SLACK * row.step_ms_mean
            else f"; **suspect**: the three exceed the step by {-gap:.1f} ms, which cannot be"
        )
        fb_rows = g[g["mode"] == "forward_backward"]
        if len(fb_rows) and fb_rows.iloc[0].mfu == fb_rows.iloc[0].mfu:
            text += (
                f"; forward+backward alone (its own mode) runs at {pct(fb_rows.iloc[0].mfu)} MFU"
            )
        if floor == floor:
            text += (
                f". Fused AdamW must move {ADAMW_BYTES_PER_PARAM} bytes per fp32 parameter, a "
                f"floor of {floor:.1f} ms at the measured copy bandwidth ({copy_gbps:.0f} GB/s)"
            )
            if opt < floor:
                text += (
                    f": **suspect**, the optimizer's {opt:.1f} ms is below it, so this split "
                    "cannot be right"
                )
            else:
                text += f", {floor / opt:.0%} of the optimizer's time"
        out.append(text)
    return out
