"""Report context and figures for the `fsdp` stage (questions 32 and 33: fsdp_accounting).

(a) FSDP's expected saving against optimizer-state sharding comes from
`core/costs.py:training_state_bytes` (parameters, gradients and AdamW state one rank holds under
each scheme, all-gather buffers ignored) beside the measured bytes each rank holds and the
measured peaks; (b) whether the weight all-gathers finish in time comes from the profiled step:
the all-gather time on the timeline and the share of it that ran while compute ran
(`profiling/overlap.py`), with fp32 and bf16 compute, units of a block and of a layer, and the
part of the step the GPU ran anything at all (a step whose GPU idles is host-bound, whatever its
communication does) and the time compute waited for a gather; answers.py writes those sentences,
rows.py holds the runs and tables both read, figures.py the figures. Memory in MiB (2^20 bytes).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import failed_points, load, md_table, ok, plot_main, ran
from cs336_systems.reporting.hta_check import cache_path, cross_check
from cs336_systems.reporting.timelines import describe
from cs336_systems.stages.fsdp.answers import q32, q32_short, q33, q33_short, setup
from cs336_systems.stages.fsdp.figures import draw, timeline_panels
from cs336_systems.stages.fsdp.rows import WAITED, analytic, memory_table, missing, time_table


def _overview(df: pd.DataFrame) -> dict:
    """The setup, the optimizer kind, how many runs succeeded, those that did not, and what each
    question says when the runs it needs have no sentence."""
    kinds = sorted(set(df.get("optimizer", pd.Series(dtype=str)).dropna().astype(str)))
    words = {"adamw_fused": "fused kernels", "adamw_foreach": "foreach kernels"}
    return {
        "available": True,
        "setup": setup(df.iloc[0]),
        "optimizer": " and ".join(words.get(k, k) for k in kinds) or "its kind not recorded",
        "n_points": len(df),
        "n_ok": len(ran(df)),
        "failed_table": md_table(failed_points(df, ["variant"]).drop_duplicates())
        if len(ran(df)) < len(df)
        else "",
        "skipped": "",
        "missing": {
            "q32": missing(df, ("fsdp",), "The FSDP run did not succeed."),
            "q33": missing(df, ("fsdp", "fsdp_bf16"), "No FSDP run succeeded."),
        },
    }


def _skipped(df: pd.DataFrame) -> dict:
    """Where the machine could not run the stage: why, and the commands that measure it."""
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    if not len(skipped):
        return {}
    return {
        "skipped": (
            f"This machine could not run the stage ({skipped['status'].iloc[0]}). On a machine "
            f"that can, this command measures it (what the workflow runs with "
            f"`--config preset={df.iloc[0].get('preset', 'gpu')} stages='[fsdp]'`):"
        ),
        "commands": sorted(set(skipped["command"].dropna().astype(str))),
    }


def _tables(df: pd.DataFrame, shown: pd.DataFrame) -> dict:
    """The time, memory and analytic tables of the runs that ran (`shown`)."""
    measured = (
        bool(shown["mem_step_peak_mb"].notna().any()) if "mem_step_peak_mb" in shown else False
    )
    times = time_table(df)
    waited = ran(df).get("prof_all_gather_waited_ms", pd.Series(dtype=float))
    ctx: dict = {"measured_peaks": measured}
    ctx["waited"] = bool(pd.to_numeric(waited, errors="coerce").notna().any())
    ctx["time_table"] = md_table(times if ctx["waited"] else times.drop(columns=WAITED))
    ctx["memory_table"] = md_table(memory_table(df, measured))
    a = analytic(df, shown=True)
    ctx["analytic_table"] = md_table(a) if len(a) else ""
    return ctx


def _answers(df: pd.DataFrame, measured: bool, results_dir: Path) -> dict:
    """Q32 and Q33 where their runs passed the checks, and the profiled steps' traces."""
    d = ok(df)
    ctx = {}
    answers = (
        ("q32", q32_short(df, measured)),
        ("q32_details", q32(df, measured)),
        ("q33", q33_short(df) if len(d) else ""),
        ("q33_details", q33(df) if len(d) else ""),
    )
    for q, text in answers:
        if text:
            ctx[q] = text
    traces = sorted(set(d.get("trace", pd.Series(dtype=str)).dropna().astype(str)) - {""})
    # one folder per profiled step, every rank's trace in it (profiling/overlap.py:rank_trace)
    ctx["traces"] = [f"{results_dir}/fsdp/raw/{t}/" for t in traces]
    ctx.update(_hta(results_dir, df))
    # fsdp_accounting (b): the timeline figure's panels in words
    ctx["timeline_lines"] = describe(timeline_panels(results_dir))
    return ctx


def context(results_dir: Path) -> dict:
    df = load(results_dir, "fsdp")
    if len(df) == 0:
        return {"available": False}
    ctx = _overview(df)
    ctx.update(_skipped(df))
    shown = ran(df)
    if not len(shown):
        return ctx
    ctx.update(_tables(df, shown))
    ctx.update(_answers(df, ctx["measured_peaks"], results_dir))
    return ctx


def _hta(results_dir: Path, df: pd.DataFrame, keep: bool = False) -> dict:
    """HolisticTraceAnalysis beside ours for the runs that passed the checks."""
    return cross_check(Path(results_dir) / "fsdp" / "raw", ok(df) if len(df) else df, keep)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """The section's figures (stages/fsdp/figures.py), and HolisticTraceAnalysis's reading of
    the traces kept for the report (reporting/hta_check.py: seconds a GPU trace)."""
    _hta(results_dir, load(results_dir, "fsdp"), keep=True)
    return [*draw(results_dir, fig_dir), cache_path(Path(results_dir) / "fsdp" / "raw")]


if __name__ == "__main__":
    plot_main(plot)
