"""Report context and figures for the `memory` stage (questions 13-17, and 2026's checkpointed
grid with part (f)): `context` composes one function per question from the rows and tables
(rows.py) and sentences (answers.py); `plot` draws the figures (figures.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import (
    failed_points,
    load,
    ok,
    own_model_note,
    plot_main,
    sort_sizes,
)
from cs336_systems.reporting.timelines import panel_title
from cs336_systems.reporting.timelines import summary as timeline_summary
from cs336_systems.stages.memory import answers, rows
from cs336_systems.stages.memory.figures import block_timeline_panel, plot
from cs336_systems.stages.memory.rows import is_cuda, load_points, md_table, peak_column, plain


def run_facts(df: pd.DataFrame, every: pd.DataFrame) -> dict:
    """What ran (the grid's counts, statuses; `every`: checkpointed points too) and how."""
    d = ok(df)
    s: dict = {"grid_counts": answers.grid_counts(every)}
    eds = pd.to_numeric(every.get("edition", pd.Series(dtype=float)), errors="coerce").dropna()
    s["edition"] = int(eds.iloc[0]) if len(eds) else 2026
    s["n_points"], s["n_ok"] = len(df), len(d)
    s["statuses"] = df["status"].value_counts().to_dict()
    s["failed_table"] = (
        md_table(sort_sizes(failed_points(df, ["size", "context_length", "mode", "precision"])))
        if len(d) < len(df)
        else ""
    )
    s["cuda"] = is_cuda(df)
    s["peak_what"] = (
        "Peak allocated memory"
        if s["cuda"]
        else "Growth of the peak resident set size (RSS) during the measured step"
    )
    s["batch_size"] = int(df["batch_size"].iloc[0])
    s["warmup_steps"] = int(df["warmup_steps"].iloc[0])
    return s


def edition_2026(df: pd.DataFrame, blocks: pd.DataFrame) -> dict:
    """The 2026 answers: the checkpointed points beside the plain ones, and part (f)."""
    s = {
        "checkpoint_sentences": answers.checkpoint_sentences(df),
        "grid_table": rows.grid_table(df),
    }
    s.update(block_answers(blocks))
    return s


def block_answers(blocks: pd.DataFrame) -> dict:
    """Part (f) per (context, precision): the top ops with shares, total, gradient bytes."""
    s: dict = {"block_sentences": [], "nsys_captures": []}
    if blocks.empty:
        return s
    good = blocks[blocks["status"] == "ok"]
    tot = good[good["part"] == "block_total"]
    ops = good[good["part"] == "saved_by_op"]
    for _, t in tot.sort_values(["context_length", "precision"]).iterrows():
        at = (ops["context_length"] == t["context_length"]) & (ops["precision"] == t["precision"])
        s["block_sentences"].append(answers.block_sentence(t, ops[at].sort_values("rank")))
    table = rows.block_ops(ops)
    s["block_table"] = md_table(table, 3) if len(table) else ""
    cap = blocks[blocks["part"] == "nsys_capture"]
    s["nsys_captures"] += [answers.nsys_capture_line(r) for _, r in cap.iterrows()]
    # what the part needs a GPU for (its evidence, __init__.py): the captures that ran, the
    # gradients' sizes read from the allocator
    s["nsys_ok"] = [answers.nsys_capture_line(r) for _, r in cap[cap["status"] == "ok"].iterrows()]
    s["allocator_grads"] = (
        tot.get("grads_from_memory_bytes", pd.Series(dtype=float)).dropna().tolist()
    )
    s["coverage"] = answers.block_coverage(cap, tot)
    return s


def block_timeline(results_dir: Path) -> str:
    """Part (f)'s timeline figure in words: what it was drawn from, and its numbers."""
    panel = block_timeline_panel(results_dir)
    if panel.timeline is None:
        return f"No timeline of one block: {panel.reason}."
    return f"The timeline above ({panel_title(panel)}): {timeline_summary(panel.timeline)}."


def timelines(d: pd.DataFrame, every: pd.DataFrame, cuda: bool) -> dict:
    """Q13: each point's timeline in words (`d`: the plain points that ran); the images the
    handout asks for (rows.timeline_choice over `every` point that ran, checkpointed ones
    too), each with its sentence."""
    if not (cuda and "trace_peak_mb" in d):
        return {"timelines": [], "timeline_skipped": answers.timeline_skipped(d)}
    s: dict = {"timelines": []}
    for _, r in sort_sizes(d, "context_length").iterrows():
        if pd.isna(r.get("trace_peak_mb", np.nan)):
            continue
        s["timelines"].append(
            {"png": r["timeline_png"], "sentence": answers.timeline_sentence(r), "mode": r["mode"]}
        )
    s["timeline_figures"] = [
        {"png": r["timeline_png"], "sentence": answers.timeline_sentence(r)}
        for r in rows.timeline_choice(ok(every))
        if not pd.isna(r.get("trace_peak_mb", np.nan))
    ]
    return s


def peaks(df: pd.DataFrame, d: pd.DataFrame, every: pd.DataFrame, cuda: bool) -> dict:
    """Q14: every context, checkpointed points beside the plain ones (marked); a context whose
    plain points did not run answers the question only partly. The peak's growth with context
    and its parts."""
    s: dict = {"peak_table": md_table(rows.peak_table(every), floatfmt=0)}
    missing = sorted(set(every["context_length"]) - set(d["context_length"]))
    if missing:
        s["coverage"] = answers.partly_measured(missing)
    # on a CPU the RSS growth is too coarse to compare points: follow the saved activations
    growth_col = peak_column(df) if cuda else "saved_activations_mb"
    growth_what = "peak" if cuda else "activations saved for backward"
    s["peak_growth"] = answers.peak_growth(d, growth_col, growth_what)
    s["inference_sentences"] = answers.inference_sentences(df, cuda)
    parts = rows.peak_parts(ok(every)) if cuda else pd.DataFrame()
    if len(parts):
        s["breakdown"] = answers.parts_sentence(parts)
        s["breakdown_table"] = rows.parts_table(parts)
    else:
        s["breakdown_table"] = rows.breakdown_table(d)
    return s


def precisions(df: pd.DataFrame, d: pd.DataFrame, cuda: bool) -> dict:
    """Q15: bf16 autocast against fp32 (a CPU's RSS growth is too coarse for a ratio: the
    activations saved are compared instead), and why."""
    ratio_col = peak_column(df) if cuda else "saved_activations_mb"
    ratio_what = "peak allocated memory" if cuda else "activation memory saved for backward"
    pr = rows.precision_ratios(df, ratio_col)
    if not cuda:  # saved activations: an inference forward has none to compare
        pr = rows.saving(pr)
    if not len(pr):
        return {}
    s = {"precision_table": rows.precision_table(pr)}
    s["precision_sentence"] = answers.precision_sentence(pr, ratio_what, cuda)
    if (why := answers.precision_why(d, cuda)) is not None:
        s["precision_why"] = why
    if inference := answers.inference_precision(d):
        s["precision_inference"] = inference
    return s


OWN_MODEL_SAYS = (
    "measured as the course's sizes are (peak memory, what autograd saved); the analytic "
    "columns, the checkpointed points and part (f) are the course model's, so it has none."
)


# what Q16 says of measured points, none where only an own model ran
ACTIVATION_KEYS = ("residual_table", "residual_sentence", "activation_table", "activation_sentence")


def activations(d: pd.DataFrame, batch_size: int, edition: int) -> dict:
    """Q16: the residual stream's size (the edition's own model by arithmetic, the run's
    measured models), and the activations against the analytic model."""
    rs = rows.residual_rows(d)
    s = {"residual_table": md_table(rs, 2)}
    hr = rows.handout_residual_rows(edition)
    s["handout_residual_sentence"] = answers.handout_residual_sentence(hr, set(d["size"]))
    s["residual_sentence"] = answers.residual_sentence(rs, batch_size)
    cmp = rows.activation_rows(d)
    s["activation_table"] = md_table(sort_sizes(cmp, "context_length"), 2)
    s["activation_sentence"] = answers.activation_sentence(cmp)
    return s


def allocations(results_dir: Path, allocs: pd.DataFrame) -> dict:
    """Q17: the forward pass's snapshot, as the handout asks (every context, checkpointed ones
    included); a run without forward snapshots: the step's largest."""
    fwd_text, fwd_table = answers.forward_allocations(load(results_dir, "memory_allocations"))
    if fwd_text:
        return {
            "alloc_sentence": fwd_text,
            "alloc_table": fwd_table,
            "alloc_point": "forward passes",
        }
    if len(allocs) and "size_mb" in allocs and (allocs["status"] == "ok").any():
        pick = rows.step_allocations(allocs)
        s = {"alloc_point": answers.step_allocation_point(pick)}
        s["alloc_table"] = rows.step_allocations_table(pick)
        s["alloc_sentence"] = answers.step_allocation_sentence(pick)
        return s
    return {"alloc_skipped": answers.allocations_skipped(allocs)}


def context(results_dir: Path) -> dict:
    df = load_points(results_dir)
    s: dict = {"available": len(df) > 0}
    if not s["available"]:
        return s
    d = ok(df)
    allocs = plain(load(results_dir, "memory_allocations"))
    every = load(results_dir, "memory")
    s.update(run_facts(df, every))
    if d.empty:
        s["available"] = False
        return s
    s["sizes"] = sorted(set(d["size"]))
    # 2026: the checkpointed points beside the plain ones, part (f)
    s["y2026"] = edition_2026(load(results_dir, "memory"), load(results_dir, "memory_blocks"))
    s["y2026"]["block_timeline"] = block_timeline(results_dir)
    s.update(timelines(d, every, s["cuda"]))
    s.update(peaks(df, d, every, s["cuda"]))
    s.update(precisions(df, d, s["cuda"]))
    s["coverage"] = {**s.get("coverage", {}), **s["y2026"].pop("coverage", {})}
    # Q16 sets each point beside the analytic model: the course's sizes only (an own model
    # has none, docs/own-model.md)
    course = d[d["own_model"].isna()] if "own_model" in d else d
    if course.empty:
        hr = rows.handout_residual_rows(s["edition"])
        s["handout_residual_sentence"] = answers.handout_residual_sentence(hr, set())
        s.update(dict.fromkeys(ACTIVATION_KEYS, ""))
    else:
        s.update(activations(course, s["batch_size"], s["edition"]))
    s["own_model_note"] = own_model_note(df, OWN_MODEL_SAYS)
    s.update(allocations(results_dir, allocs))
    return s


if __name__ == "__main__":
    plot_main(plot)
