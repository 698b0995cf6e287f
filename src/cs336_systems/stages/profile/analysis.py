"""Report context and figures for the `profile` stage (questions 5-9): `context` composes one
function per question from the rows and tables (rows.py) and sentences (answers.py); `plot`
draws the figures (figures.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import (
    failed_points,
    load,
    md_table,
    ok,
    own_model_note,
    pct,
    plot_main,
    sort_sizes,
)
from cs336_systems.stages.profile import answers, rows
from cs336_systems.stages.profile.answers import probe_sentences
from cs336_systems.stages.profile.figures import plot
from cs336_systems.stages.profile.rows import (
    NONTRIVIAL_SHARE,
    attention_matmul_units,
    attention_split,
    cpu_only,
    gemm_shares,
    harness_comparison,
    load_kernels,
    load_points,
    nontrivial_non_gemm,
    top_kernels,
    top_kernels_forward_backward,
)

OWN_MODEL_SAYS = (
    "profiled as the course's sizes are, with its own attention: the annotated ranges "
    "(`attention.*`) need the course's attention module, so its rows have none, and its "
    "kernels count under the forward, backward and optimizer phases only."
)


def run_facts(results_dir: Path, points: pd.DataFrame) -> dict:
    """What ran (points, statuses, profilers and their notes), how (the precision, batch and
    steps; CPU operators or GPU kernels), and the contexts the probe found."""
    good = ok(points)
    s: dict = {"n_points": len(points), "n_ok": len(good)}
    s["statuses"] = points["status"].value_counts().to_dict()
    s["failed_table"] = (
        md_table(sort_sizes(failed_points(points, ["size", "context_length", "mode"])))
        if len(good) < len(points)
        else ""
    )
    s["profilers"] = sorted(points["profiler"].dropna().unique())
    notes = points.get("profiler_note", pd.Series(dtype=str)).dropna().astype(str)
    s["profiler_notes"] = sorted({n for n in notes if n and n != "nan"})
    s["cpu_only"] = cpu_only(points)
    s["unit"] = "CPU operator self time" if s["cpu_only"] else "GPU kernel time"
    s["kernel_word"] = "operator" if s["cpu_only"] else "kernel"
    first = points.iloc[0]
    s["precision"] = first["precision"]
    s["batch_size"] = int(first["batch_size"])
    s["warmup_steps"] = int(first["warmup_steps"])
    s["measure_steps"] = int(first["measure_steps"])
    s["probe_sentences"] = probe_sentences(load(results_dir, "profile_probe"))
    s["own_model_note"] = own_model_note(points, OWN_MODEL_SAYS)
    return s


def harness(points: pd.DataFrame, bench: pd.DataFrame, kernel_word: str) -> dict:
    """Q5: the forward under the profiler against the harness's time."""
    h = rows.with_q1(harness_comparison(points, bench), points, bench)
    s = {"harness_table": rows.harness_table(h, kernel_word)}
    s["q1_sentence"] = answers.q1_sentence(h, kernel_word) if len(h) else ""
    s["harness_sentence"], cov = answers.harness_sentence(h, kernel_word)
    if cov:
        s["coverage"] = cov
    return s


def top_kernel(kernels: pd.DataFrame, kernel_word: str, unit: str) -> dict:
    """Q6: the kernel that takes the most time, in forward and in forward+backward."""
    fwd_top = top_kernels(kernels, "forward", ("forward",))
    fb_top, fb_what = top_kernels_forward_backward(kernels)
    if not len(fwd_top):
        return {}
    merged = rows.top_merged(fwd_top, fb_top)
    return {
        "top_table": rows.top_table(merged, fb_what, kernel_word),
        "top_sentence": answers.top_sentence(fwd_top, merged, fb_what, kernel_word, unit),
    }


def non_gemm(kernels: pd.DataFrame, kernel_word: str, unit: str) -> dict:
    """Q7: the non-GEMM kernels that reach NONTRIVIAL_SHARE of forward time somewhere."""
    nt = nontrivial_non_gemm(kernels)
    s = {"nontrivial_threshold": pct(NONTRIVIAL_SHARE)}
    if len(nt):
        s["nontrivial_table"] = rows.nontrivial_table(nt, s["nontrivial_threshold"])
        s["nontrivial_sentence"] = answers.nontrivial_sentence(
            nt, rows.non_gemm_share(kernels), kernel_word, s["nontrivial_threshold"], unit
        )
    return s


def gemm(points: pd.DataFrame, kernels: pd.DataFrame, unit: str) -> dict:
    """Q8: the GEMM share of a forward pass against a training step's, and the other classes."""
    g = gemm_shares(points)
    if not (len(g) and {"forward", "train_step"} <= set(g.columns)):
        return {}
    s = {"gemm_table": rows.gemm_table(g)}
    both = g.dropna(subset=["forward", "train_step"])
    if len(both):
        s["other_kernels_sentence"] = answers.other_kernels(kernels, unit)
        s["gemm_sentence"] = answers.gemm_sentence(both, unit)
    return s


def attention(points: pd.DataFrame, kernels: pd.DataFrame, cpu: bool) -> dict:
    """Q9: softmax against the matmuls inside attention, in time and in FLOPs."""
    a = attention_split(points, kernels)
    if not (len(a) and a["softmax_ms"].notna().any()):
        return {}
    cols = rows.attention_columns(a)
    s = {"attention_table": rows.attention_table(a, cols)}
    s["attention_scale_note"] = answers.attention_scale_note(cols)
    s["matmul_units"] = attention_matmul_units(kernels)
    s["attention_sentence"] = answers.attention_sentence(a, s["matmul_units"], cpu)
    word = "operator" if cpu else "kernel"
    s["softmax_share"] = answers.softmax_share_sentence(
        rows.operation_share(kernels, "softmax"), word
    )
    return s


def context(results_dir: Path) -> dict:
    points, kernels = load_points(results_dir), load_kernels(results_dir)
    s: dict = {"available": len(points) > 0}
    if not s["available"]:
        return s
    bench = load(results_dir, "benchmark")
    s.update(run_facts(results_dir, points))
    if ok(points).empty or kernels.empty:
        s["available"] = False
        return s
    s.update(harness(points, bench, s["kernel_word"]))
    s.update(top_kernel(kernels, s["kernel_word"], s["unit"]))
    s.update(non_gemm(kernels, s["kernel_word"], s["unit"]))
    s.update(gemm(points, kernels, s["unit"]))
    s.update(attention(points, kernels, s["cpu_only"]))
    return s


if __name__ == "__main__":
    plot_main(plot)
