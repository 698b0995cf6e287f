"""The profile section's answers in words: the profiled forward against the harness's time at
every profiled point (nsys_profile (a)), and how the other kernel classes' shares move from a
forward pass to a training step ((d): "how about other kernels?")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.core.analysis import ok, pct, sort_sizes
from cs336_systems.profiling.kernel_classes import KERNEL_CLASSES

# the profiled forward "matches" the harness's within this share
MATCH = 0.10


def harness_comparison(points: pd.DataFrame, bench: pd.DataFrame) -> pd.DataFrame:
    """Q5: the forward step under the profiler vs the benchmark stage's harness timing."""
    p = ok(points)
    p = p[p["mode"] == "forward"]
    if p.empty:
        return pd.DataFrame()
    cols = {
        "size": p["size"],
        "context_length": p["context_length"],
        "profiled_step_ms": p["step_ms_mean"],
        "range_ms": p.get("step_range_ms_mean", np.nan),
        "kernel_ms": p["step_kernel_ms_mean"],
    }
    out = pd.DataFrame(cols)
    out["harness_ms"] = np.nan
    out["harness_from"] = ""
    own = pd.to_numeric(p.get("harness_ms_mean", pd.Series(np.nan, index=p.index)), errors="coerce")
    if own.notna().any():
        # the profile job timed its forward as the harness does, before the capture
        out["harness_ms"] = own.to_numpy()
        out["harness_from"] = np.where(own.notna(), "this job", "")
    if len(bench) and out["harness_ms"].isna().any():
        b = ok(bench)
        b = b[
            (b["mode"] == "forward")
            & (b.get("compile", "eager") == "eager")
            & (b.get("attention", "naive") == "naive")
            & (b.get("batch_size", p["batch_size"].iloc[0]) == p["batch_size"].iloc[0])
        ]
        prec = str(p["precision"].iloc[0])
        b = b[b["precision"] == prec]
        h = b.set_index(["size", "context_length"])["step_ms_mean"]
        from_bench = [
            h.get((s, c), np.nan) for s, c in zip(out["size"], out["context_length"], strict=True)
        ]
        missing = out["harness_ms"].isna().to_numpy()
        out.loc[missing, "harness_ms"] = np.asarray(from_bench)[missing]
        out.loc[missing & out["harness_ms"].notna().to_numpy(), "harness_from"] = "benchmark"
    out["profiled_over_harness"] = out["profiled_step_ms"] / out["harness_ms"]
    out["kernel_over_harness"] = out["kernel_ms"] / out["harness_ms"]
    return sort_sizes(out, "context_length").reset_index(drop=True)


def harness_sentence(h: pd.DataFrame, kernel_word: str) -> tuple[str, dict]:
    """(the sentence, a coverage note where some point has no harness time)."""
    cov: dict = {}
    hh = h.dropna(subset=["harness_ms"])
    if len(hh):
        r = hh["profiled_over_harness"]
        close = (r - 1).abs() <= MATCH
        where = f"every one of the {len(h)}" if len(hh) == len(h) else f"{len(hh)} of the {len(h)}"
        own = (hh["harness_from"] == "this job").all()
        sentence = (
            f"At {where} profiled forward point{'s' if len(h) > 1 else ''} the harness's time "
            + (
                "was measured by the profile job itself, before its capture (the benchmark's "
                "method and step counts)"
                if own
                else "comes from the benchmark stage's same point"
            )
            + f": the step timed under the profiler takes {r.median():.2f}× it (median; "
            f"{r.min():.2f}–{r.max():.2f}×), within ±{MATCH:.0%} at {int(close.sum())} of "
            f"{len(hh)}, and the summed {kernel_word} time is "
            f"{hh['kernel_over_harness'].median():.2f}× it ("
            f"{hh['kernel_over_harness'].min():.2f}–{hh['kernel_over_harness'].max():.2f}×). "
            + (
                "So the profiled forward matches the Python timing"
                if close.all()
                else "So the profiled forward does not match the Python timing everywhere"
            )
            + f": the profiler's own work (recording every {kernel_word} and range) "
            "lengthens the profiled step, while the kernels alone leave out the host's gaps "
            "between launches."
        )
        if len(hh) < len(h):
            cov = {
                "nsys_profile.a": {
                    "status": "partly",
                    "why": f"{len(h) - len(hh)} profiled forward point(s) have no harness time",
                    "how": "the profile stage's `harness` block (config/stages/profile.yaml)",
                }
            }
    else:
        sentence = (
            "Neither the profile job (its `harness` block) nor the benchmark stage timed these "
            "forward points outside the profiler, so only the profiled times are shown."
        )
        cov = {
            "nsys_profile.a": {
                "status": "partly",
                "why": "no harness time at the profiled points",
                "how": "the profile stage's `harness` block (config/stages/profile.yaml)",
            }
        }

    return sentence, cov


def other_kernels(kernels: pd.DataFrame, unit: str) -> str:
    """Each kernel class but GEMM: its median share of a forward pass's and of a training
    step's time (the whole step's kernels), and which way it moves."""
    k = kernels[(kernels["phase"] == "step") & kernels["mode"].isin(["forward", "train_step"])]
    if k.empty:
        return ""
    per = k.groupby(["size", "context_length", "mode", "kernel_class"])["ms_per_step"].sum()
    share = per / per.groupby(["size", "context_length", "mode"]).transform("sum")
    med = share.groupby(["mode", "kernel_class"]).median().unstack("mode").fillna(0.0)
    if not {"forward", "train_step"} <= set(med.columns):
        return ""
    parts = []
    for cls in [c for c in KERNEL_CLASSES if c != "gemm" and c in med.index]:
        f, t = med.loc[cls, "forward"], med.loc[cls, "train_step"]
        if max(f, t) < 0.005:
            continue
        move = "rises" if t > f * 1.1 else "falls" if t < f / 1.1 else "stays"
        parts.append(f"{cls} {pct(f)} → {pct(t)} ({move})")
    if not parts:
        return ""
    return (
        f"The other kernel classes' median shares of {unit}, forward → training step: "
        + "; ".join(parts)
        + ". Backward brings the elementwise and reduction gradients of every norm, activation "
        "and softmax, and the optimizer adds its own elementwise class over every parameter."
    )
