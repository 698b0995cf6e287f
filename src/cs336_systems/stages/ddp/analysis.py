"""Report context and figures for the `ddp` stage (questions 23-27).

The bucket-size model (assignment's overhead equation): with total gradient bytes s, all-reduce
bandwidth w (algorithmic: message bytes / time), a fixed cost o per all-reduce call and n_b
equal buckets, and each bucket's gradient computation taking as long as its communication
(c = s / (n_b w)), bucket i is ready at i c and the communication stream falls behind by o per
call, so the last all-reduce ends at (n_b + 1) c + n_b o while backward ends at n_b c:

    overhead(n_b) = s / (n_b w) + n_b o,

minimized at n_b* = sqrt(s / (w o)), i.e. a bucket size b* = s / n_b* = sqrt(s w o), where the
overhead is 2 sqrt(s o / w). The predicted step time is the compute-only step plus the overhead.

`context` composes one small function per question; rows.py holds the runs and tables as the
report reads them, answers.py the sentences, figures.py the figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import failed_points, load, md_table, ok, plot_main, ran
from cs336_systems.reporting.hta_check import cache_path, cross_check
from cs336_systems.reporting.timelines import describe
from cs336_systems.stages.ddp import answers
from cs336_systems.stages.ddp.figures import draw, timeline_panels
from cs336_systems.stages.ddp.rows import (
    bucket_table,
    comm_fits,
    is_suspect_run,
    memory_table,
    one,
    peaks_reset,
    sharding_runs,
    shown_buckets,
    usable,
    variant_runs,
    variant_table,
)


def _overview(df: pd.DataFrame, d: pd.DataFrame) -> dict:
    """The setup, how many runs succeeded, those that did not, and what each question says
    when the runs it needs have no sentence."""
    return {
        "available": True,
        "setup": answers.setup(df),
        "setup_model": answers.handout_model(df.iloc[0]),
        "n_points": len(df),
        "n_ok": len(ran(df)),
        "failed_table": md_table(
            failed_points(df, ["kind", "variant", "bucket_size_mb"]).drop_duplicates()
        )
        if len(ran(df)) < len(df)
        else "",
        "missing": {
            "q23": answers.missing(d, ("naive",), "The naive run did not succeed."),
            "q24": answers.missing(
                d, ("naive", "flat"), "The naive or the flat run did not succeed."
            ),
            "q25": answers.missing(d, ("overlap",), "The overlapped run did not succeed."),
        },
    }


def _variants(d: pd.DataFrame, results_dir: Path, fits: dict[str, dict]) -> dict:
    """The variants table, the compute-only step, Q23-Q25 where their runs passed the checks
    (Q24 read against the all-reduce stage's fit in `fits`), and the profiled steps' traces."""
    base = one(d, "baseline")
    base_ms = float(base.step_ms_mean) if base is not None else math.nan
    ctx = {
        "variant_table": md_table(variant_table(d, base_ms)) if len(ran(d)) else "",
        "baseline": answers.baseline(d, base, base_ms),
    }
    naive, flat, overlap = one(d, "naive"), one(d, "flat"), one(d, "overlap")
    if naive is not None:
        ctx["q23"] = answers.q23(naive, base, base_ms)
    if naive is not None and flat is not None:
        ctx["q24"] = answers.q24(naive, flat)
        ctx["q24_why"] = answers.flat_vs_naive(naive, flat, fits.get("allreduce stage"))
    if overlap is not None:
        ctx["q25"] = answers.q25(d, overlap, base)
    traces = sorted(set(ok(d).get("trace", pd.Series(dtype=str)).dropna().astype(str)) - {""})
    # one folder per profiled step, every rank's trace in it (profiling/overlap.py:rank_trace)
    ctx["traces"] = [f"{results_dir}/ddp/raw/{t}/" for t in traces]
    ctx.update(_hta(results_dir, d))
    # ddp_overlap (b): the timeline figure's panels in words
    ctx["timeline_lines"] = describe(timeline_panels(results_dir))
    return ctx


def _q26(df: pd.DataFrame, d: pd.DataFrame, allreduce: pd.DataFrame) -> dict:
    """Bucket sizes against the overhead model (the fits, the table, the fastest size, the
    model's optimum and error) and against per-parameter overlap and the peer."""
    fits = comm_fits(df, allreduce)
    fit_name = next(iter(usable(fits)), None)
    fit = fits.get(fit_name) if fit_name else None
    bt = bucket_table(df, fit)
    ctx: dict = {
        "fits": answers.fit_lines(fits, d),
        "bucket_table": shown_buckets(bt) if len(bt) else "",
        "fit_used": fit_name or "",
    }
    bucketed = ok(d)[ok(d)["variant"] == "bucketed"]
    n_out = sanity.n_suspect(ran(d)[ran(d)["variant"] == "bucketed"]) if len(d) else 0
    if len(bucketed):
        best = bucketed.loc[bucketed["step_ms_mean"].idxmin()]
        base = one(d, "baseline")
        base_ms = float(base.step_ms_mean) if base is not None else math.nan
        ctx["best_bucket"] = answers.best_bucket(best, base, base_ms, n_out)
        if fit is not None:
            ctx["model_best"] = answers.model_best(best, fit, fit_name)
            good = bt[~bt["suspect"]]
            if "model step (ms)" in good and len(good):
                ctx["model_error"] = answers.model_error(good, best.backend, n_out)
    # every bucketed run may be suspect (a noisy shared CPU): the section then has no comparison
    ctx["bucket_vs_overlap"] = answers.bucket_vs_overlap(d) if len(d) else []
    ctx["peer"] = answers.peer_sentence(d) if len(d) else ""
    ctx["bucket_vs_overlap_excluded"] = sanity.excluded(n_out + is_suspect_run(d, "overlap"))
    return ctx


def _q27(df: pd.DataFrame) -> dict:
    """Optimizer-state sharding: the memory table and, where both runs passed the checks, the
    state, peaks and time sentences (or why the runs are not compared)."""
    shown = sharding_runs(df)
    if len(shown) == 0:
        return {}
    m = ok(shown)
    out = {
        "memory_table": memory_table(shown),
        "measured_peaks": bool(shown["mem_after_step_peak_mb"].notna().any()),
    }
    n_out = sanity.n_suspect(shown)
    if {"unsharded", "sharded"} <= set(shown["variant"]) and n_out:
        out["state"] = f"The two runs are not compared here{sanity.excluded(n_out)}."
    if {"unsharded", "sharded"} <= set(m["variant"]):
        u = m[m["variant"] == "unsharded"].iloc[0]
        s = m[m["variant"] == "sharded"].iloc[0]
        out.update(answers.sharding(u, s, out["measured_peaks"], peaks_reset(shown)))
    return out


def context(results_dir: Path) -> dict:
    df = load(results_dir, "ddp")
    if len(df) == 0:
        return {"available": False}
    d = variant_runs(df)
    ctx = _overview(df, d)
    allreduce = load(results_dir, "allreduce")
    ctx.update(_variants(d, results_dir, comm_fits(df, allreduce)))
    ctx.update(_q26(df, d, allreduce))
    ctx.update(_q27(df))
    return ctx


def _hta(results_dir: Path, d: pd.DataFrame, keep: bool = False) -> dict:
    """HolisticTraceAnalysis beside ours for the variant runs that passed the checks."""
    return cross_check(Path(results_dir) / "ddp" / "raw", ok(d) if len(d) else d, keep)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """The section's figures (stages/ddp/figures.py), and HolisticTraceAnalysis's reading of
    the traces kept for the report (reporting/hta_check.py: seconds a GPU trace)."""
    df = load(results_dir, "ddp")
    _hta(results_dir, variant_runs(df) if len(df) else pd.DataFrame(), keep=True)
    return [*draw(results_dir, fig_dir), cache_path(Path(results_dir) / "ddp" / "raw")]


if __name__ == "__main__":
    plot_main(plot)
