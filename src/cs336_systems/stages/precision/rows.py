"""The `precision` stage's rows as the report reads them: the accumulation table, the dtype of
each tensor under autocast, the LayerNorm errors per input and dtype, and bf16 against fp32
speed (benchmark stage) and memory (memory stage). Used by analysis.py, answers.py and
figures.py."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import md_table, ok
from cs336_systems.reporting.host_bound import host_bound

TENSOR_ORDER = [
    "fc1.weight",
    "ln.weight",
    "ln.bias",
    "fc2.weight",
    "fc1 output",
    "ReLU output",
    "LayerNorm output",
    "logits (fc2 output)",
    "loss",
    "fc1.weight.grad",
    "ln.weight.grad",
    "ln.bias.grad",
    "fc2.weight.grad",
]
QUANTITY_LABEL = {
    "mean": "mean",
    "variance": "variance",
    "variance_naive": "variance as E[x²]−E[x]²",
    "output": "normalized output",
}


def exact(x: float) -> str:
    """Every digit of a float, as code (so table formatting leaves it alone)."""
    return f"`{float(x)!r}`"


def accumulation_table(acc: pd.DataFrame) -> str:
    """Each device and variant's sum, its error, 0.01 as stored and the spacing at 10."""
    show = acc[
        [
            "device",
            "variant",
            "value",
            "error",
            "addend_stored",
            "accumulator_ulp_at_target",
        ]
    ].copy()
    for c in ("value", "addend_stored"):
        show[c] = show[c].map(exact)
    show["error"] = show["error"].map(lambda e: f"{e:+.3g}")
    show["accumulator_ulp_at_target"] = show["accumulator_ulp_at_target"].map(lambda u: f"{u:.3g}")
    return md_table(
        show.rename(
            columns={
                "addend_stored": "0.01 as stored",
                "accumulator_ulp_at_target": "accumulator spacing at 10",
            }
        )
    )


def devices_agree(acc: pd.DataFrame) -> bool:
    """Whether every variant gave the same sum on each device."""
    piv = acc.pivot_table(index="variant", columns="device", values="value", aggfunc="first")
    return bool((piv.nunique(axis=1) == 1).all())


def dtypes_table(good: pd.DataFrame) -> str:
    """Each tensor's dtype per device and autocast dtype."""
    t = good.pivot_table(
        index="tensor", columns=["device", "autocast"], values="dtype", aggfunc="first"
    )
    t = t.reindex([x for x in TENSOR_ORDER if x in t.index])
    t.columns = [f"{d} {a} autocast" for d, a in t.columns]
    return md_table(t.reset_index())


def layernorm_rows(good: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The LayerNorm rows of one device (CUDA where it ran) with their input case and table
    cell, and the device."""
    dev = "cuda" if (good["device"] == "cuda").any() else "cpu"
    d = good[good["device"] == dev].copy()
    d["case"] = [f"{o:g} + {sp:g}·N(0,1)" for o, sp in zip(d["offset"], d["spread"], strict=True)]
    d["cell"] = [
        "inf/nan" if nf == 1 else (f"{e:.2g}" + (f" ({100 * nf:.0f}% inf/nan)" if nf > 0 else ""))
        for e, nf in zip(d["max_error"], d["nonfinite_fraction"], strict=True)
    ]
    return d, dev


def layernorm_table(d: pd.DataFrame) -> str:
    """Per input case and dtype: each quantity's max error."""
    t = d.pivot_table(
        index=["case", "dtype"], columns="quantity", values="cell", aggfunc="first", sort=False
    )
    t = t[[q for q in QUANTITY_LABEL if q in t.columns]].rename(columns=QUANTITY_LABEL)
    return md_table(t.reset_index())


def speedups(bench: pd.DataFrame) -> pd.DataFrame:
    """bf16 autocast against fp32 step time per (size, context, mode) of the plain model's
    eager, naive-attention benchmark rows, with the speed-up."""
    b = ok(bench)
    b = b[(b.get("compile", "eager") == "eager") & (b.get("attention", "naive") == "naive")]
    if "engine" in b:  # the plain model's rows (the engine's are the benchmark's own table)
        b = b[b["engine"].fillna("plain") == "plain"]
    keys = ["size", "context_length", "mode"]
    a = b[b["precision"] == "fp32"].set_index(keys)["step_ms_mean"]
    c = b[b["precision"] == "bf16"].set_index(keys)["step_ms_mean"]
    sp = pd.concat({"fp32": a, "bf16": c}, axis=1).dropna()
    if len(sp):
        sp["speedup"] = sp["fp32"] / sp["bf16"]
        # the one host-bound rule (reporting/host_bound.py): a pair it fires on is the host's
        hb = host_bound(b) if "peak_tflops" in b else pd.DataFrame()
        fired = {tuple(r[k] for k in keys) for _, r in hb.iterrows()}
        sp["host_bound"] = [k in fired for k in sp.index]
    return sp


def memory_ratio(mem: pd.DataFrame) -> tuple[pd.Series | None, bool]:
    """bf16 over fp32 memory per (size, context, mode) without checkpointing (None where no
    pair), and whether it is the allocator's peak (CUDA) rather than the activations saved."""
    m = ok(mem)
    if "checkpoint" in m:  # the checkpointed points of the 2026 grid compare in Memory
        m = m[m["checkpoint"].fillna("none") == "none"]
    cuda = "peak_allocated_mb" in m and m["peak_allocated_mb"].notna().any()
    # a CPU's RSS growth is too coarse for a ratio: compare the activations saved instead
    col = "peak_allocated_mb" if cuda else "saved_activations_mb"
    keys = ["size", "context_length", "mode"]
    a = m[m["precision"] == "fp32"].set_index(keys)[col]
    c = m[m["precision"] == "bf16"].set_index(keys)[col]
    r = pd.concat({"fp32": a, "bf16": c}, axis=1).dropna()
    if not len(r):
        return None, cuda
    return (r["bf16"] / r["fp32"]).replace([np.inf, -np.inf], np.nan).dropna(), cuda
