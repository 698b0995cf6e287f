"""Report context for the `flash` stage: latency and TFLOP/s of causal attention implementations
over length x head dim x dtype, speedups of our Triton FlashAttention-2, the tiles autotuning
chose, the leaderboard point and the fixed-cost target. rows.py holds the tables, answers.py the
sentences, figures.py the figures; each question's part of the context is composed here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, plot_main, status_counts
from cs336_systems.reporting.analysis import ok as trusted
from cs336_systems.stages.flash import answers
from cs336_systems.stages.flash.answers import oom_sentences, speedup_sentences
from cs336_systems.stages.flash.figures import draw
from cs336_systems.stages.flash.rows import (
    TARGET_PAIR,
    all_impls_table,
    bf16_peak,
    errors_table,
    grid_rows,
    has_compiled,
    impls_of,
    label,
    leaderboard_ms,
    leaderboard_table,
    pair_impls,
    skipped_table,
    sweep,
    target_points,
    target_table,
    tflops_table,
    tiles_autotuned,
    tiles_table,
    triton_vs_pytorch_table,
)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return draw(results_dir, fig_dir)


def leaderboard(df: pd.DataFrame, ceilings: pd.DataFrame | None = None) -> dict:
    """The leaderboard point: each implementation's passes, the leaderboard's own compiled
    measurement (`lb_*`, CUDA only), our time against each SDPA backend's, and our TFLOP/s
    against the bf16 matmul peak measured by the ceilings stage on the same machine."""
    lb = grid_rows(df, "leaderboard")
    if len(lb) == 0:
        return {"available": False}
    first = lb.iloc[0]
    compiled = has_compiled(lb)
    table = leaderboard_table(lb)
    ok = trusted(lb).set_index("impl")
    return {
        "available": True,
        "config": (
            f"batch {int(first['batch_size'])}, {int(first['heads'])} heads, n = {int(first['seq_len'])}, "
            f"d = {int(first['d_head'])}, {first['dtype']}, causal, forward+backward"
        ),
        "table": table,
        "ours_ms": leaderboard_ms(ok, "flash_triton", compiled),
        "sentences": answers.leaderboard_sentences(ok, compiled, bf16_peak(ceilings)),
    }


def fixed_cost(df: pd.DataFrame) -> dict:
    """The target point set (rows grid=target): per head dim and length, our forward+backward,
    SDPA cuDNN's, their ratio and whether it is within the target's bound; sentences saying
    where it is met and where not."""
    t = grid_rows(df, "target")
    if len(t) == 0:
        return {"available": False}
    first = t.iloc[0]
    ok = t[t["status"] == "ok"]
    out = {
        "available": True,
        "config": f"{first['dtype']}, causal, batch {int(first['batch_size'])}, "
        f"{int(first['heads'])} heads",
        "sentences": [],
        "table": "",
    }
    if missing := sorted(set(TARGET_PAIR) - set(ok["impl"])):
        out["sentences"].append(answers.target_missing(t, missing))
        return out
    points = target_points(ok)
    out["table"] = target_table(points)
    out["sentences"] += answers.target_sentences(points)
    return out


def _setting(df: pd.DataFrame, sw: pd.DataFrame) -> dict:
    """What ran: the preset, the jobs, the device and timer, the sweep's axes."""
    first = df.iloc[0]
    have = len(sw) > 0
    return {
        "preset": str(first.get("preset", "?")),
        "grids": sorted(set(df["grid"])) if "grid" in df else ["sweep"],
        "device": first.get("device", "?"),
        "timer": first.get("timer", "?"),
        # our Triton kernel on a CPU runs in Triton's interpreter: its times are the
        # interpreter's, so no speed-up or host-overhead reading of them is given
        "interpreter": first.get("device", "") == "cpu",
        "tiles_autotuned": tiles_autotuned(sw),
        "fp32_precision": first.get("fp32_matmul_precision", "highest"),
        "dtypes": sorted(sw["dtype"].unique()) if have else [],
        "head_dims": sorted(int(x) for x in sw["d_head"].unique()) if have else [],
        "seq_lens": sorted(int(x) for x in sw["seq_len"].unique()) if have else [],
        "impls": [label(i) for i in impls_of(sw)] if have else [],
    }


def _gate(df: pd.DataFrame) -> dict:
    """The kernel tests' verdicts on our kernels and which ones they kept from running."""
    gated = df[df["status"].astype(str).str.startswith("skipped: kernel tests")]
    return {
        "verdicts": answers.gate_verdicts(df),
        "gated": sorted(gated["impl"].map(label).unique()),
        # why: the kernel tests failed, or none of the selected tests checked the kernel
        "gated_why": "; ".join(sorted(set(gated["status"].str.removeprefix("skipped: ")))),
    }


def _benchmarking(df: pd.DataFrame, sw: pd.DataFrame, dtypes: list, interpreter: bool) -> dict:
    """flash_benchmarking (a): our kernels against naive attention, every implementation's
    forward+backward, TFLOP/s, tiles, speed-ups, out-of-memory points and errors."""
    return {
        "pairs": {dt: triton_vs_pytorch_table(df, dt, not interpreter) for dt in dtypes},
        "pair_caption": answers.pair_caption(pair_impls(sw)),
        "host_note": "" if interpreter else answers.host_note(trusted(sw)),
        "all_fwd_bwd": {dt: all_impls_table(df, dt) for dt in dtypes},
        "tflops": tflops_table(df),
        "tiles": tiles_table(df),
        "speedups": [] if interpreter else speedup_sentences(df),
        "ooms": oom_sentences(df),
        "errors": errors_table(sw),
        "skipped": skipped_table(sw),
    }


def context(results_dir: Path) -> dict:
    df = load(results_dir, "flash")
    if len(df) == 0:
        return {"available": False}
    sw = sweep(df)
    setting = _setting(df, sw)
    setting["deviation"] = (
        answers.grid_deviation(
            setting["seq_lens"], setting["head_dims"], setting["dtypes"], setting["preset"]
        )
        if len(sw)
        else ""
    )
    statuses = status_counts(df)
    gate = _gate(df)
    coverage = answers.coverage(
        len(sw) > 0, setting["interpreter"], setting["grids"], setting["preset"]
    )
    return {
        "coverage": coverage,
        "available": True,
        "has_sweep": len(sw) > 0,
        **setting,
        "n_points": len(df),
        "statuses": statuses,
        **gate,
        **_benchmarking(df, sw, setting["dtypes"], setting["interpreter"]),
        "leaderboard": leaderboard(df, load(results_dir, "ceilings")),
        "target": fixed_cost(df),
        "batch": int(sw["batch_size"].iloc[0]) if len(sw) else None,
        "heads": int(sw["heads"].iloc[0]) if len(sw) and "heads" in sw else None,
    }


if __name__ == "__main__":
    plot_main(plot)
