"""The one host-bound rule every section applies (benchmark: every mode and every phase of the
training step; profile: the profiled points, from the benchmark's rows of the same point).

A time is the host's (kernel launches, the Python between them), not the GPU's, where bf16
autocast shortens it by less than HOST_SPEEDUP although it shrinks the time's device work by
HOST_PEAK_RATIO or more (the bf16 matmul ceiling over the fp32 one). Work that bf16 does not
shrink (AdamW on fp32 master weights) has a ratio of 1: the rule never fires on it.
"""

from __future__ import annotations

import pandas as pd

# bf16 autocast no faster than this over fp32, where the bf16 matmul ceiling is at least
# HOST_PEAK_RATIO times the fp32 one: the time is not the GPU's matmul time
HOST_SPEEDUP = 1.25
HOST_PEAK_RATIO = 3.0
# the point's keys, but the precision (the rule compares the two)
POINT = ["size", "context_length", "compile", "attention", "mode"]


def host_bound(d: pd.DataFrame, value: str = "step_ms_mean", work: str = "peak") -> pd.DataFrame:
    """The rule on `value` (a mode's step time, or a phase's time) over `d`'s fp32 and bf16
    rows of each point (`POINT` keys present in `d`): the points it fires on, with both times,
    the speedup and the work's ratio (`work="peak"`: the bf16 over the fp32 ceiling,
    `peak_tflops`; `"same"`: 1)."""
    keys = [k for k in POINT if k in d]
    d = d[d[value].notna()] if value in d else d.iloc[:0]
    a = d[d["precision"] == "fp32"].set_index(keys)
    b = d[d["precision"] == "bf16"].set_index(keys)
    cols = [value, "peak_tflops"]
    both = a[cols].add_suffix("_fp32").join(b[cols].add_suffix("_bf16"), how="inner")
    both["speedup"] = both[f"{value}_fp32"] / both[f"{value}_bf16"]
    both["peak_ratio"] = (
        both["peak_tflops_bf16"] / both["peak_tflops_fp32"] if work == "peak" else 1.0
    )
    hb = both[(both["speedup"] < HOST_SPEEDUP) & (both["peak_ratio"] >= HOST_PEAK_RATIO)]
    return hb.reset_index()


def tested(d: pd.DataFrame, value: str = "step_ms_mean") -> pd.DataFrame:
    """The points of `d` the rule can test: both precisions ran, with a ceiling each."""
    keys = [k for k in POINT if k in d]
    d = d[d[value].notna() & d["peak_tflops"].notna()] if value in d else d.iloc[:0]
    n = d.groupby(keys)["precision"].nunique()
    return n[n == 2].reset_index()[keys]
