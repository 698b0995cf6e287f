"""The `fsdp` stage's runs as the report reads them: labels, constants, one run's row and its
numbers, the runs a sentence must leave out (suspect) and the profiled step's busy and exposed
shares. Used by analysis.py (tables, Q32) and q33.py (Q33's sentences)."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core import sanity
from cs336_systems.core.analysis import mark_suspect, ok, ran

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
    "ddp_bf16_graphed": "DDP (bf16 autocast, compiled blocks, CUDA graphs)",
    "fsdp_bf16_graphed": "FSDP (bf16 compute, compiled blocks, CUDA graphs)",
    "torch_fsdp_bf16": "PyTorch FSDP2 (bf16 compute)",
    "torch_fsdp_bf16_compiled": "PyTorch FSDP2 (bf16 compute, compiled blocks)",
}
# the peer's runs and ours they compare with
PEERS = {"torch_fsdp_bf16": "fsdp_bf16", "torch_fsdp_bf16_compiled": "fsdp_bf16_compiled"}
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


def _busy(g) -> float:
    """The share of the profiled step in which the GPU ran any kernel (NaN on the CPU)."""
    busy, step = g.get("prof_gpu_busy_ms", math.nan), g.get("prof_step_ms", math.nan)
    return busy / step if busy == busy and step and step == step else math.nan


def _exposed(r: pd.Series) -> float:
    """The gathers' time on the profiled step's timeline outside compute (ms; rounding noise
    of the subtraction clipped at 0)."""
    t = _num(r, "prof_all_gather_ms") - _num(r, "prof_all_gather_overlapped_ms")
    return t if math.isnan(t) or t > 1e-6 else 0.0
