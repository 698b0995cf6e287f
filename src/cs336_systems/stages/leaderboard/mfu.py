"""The leaderboard's MFU: the path a variant's matmuls take (`matmul_path`), the ceilings stage's
measured bf16 peak through that path (`peak_tflops`), and the rows' MFU against it
(`with_path_mfu`). measure.py writes them into its rows; the report recomputes them for rows
written before the path was recorded. No torch: pandas, loaded when a function runs."""

from __future__ import annotations

import math
from pathlib import Path


def peak_tflops(path: str | Path | None, matmul_path: str = "matmul") -> float:
    """The ceilings stage's measured bf16 TFLOP/s through `matmul_path` (`matmul`: bf16
    weights, a plain bf16 matmul; `autocast_linear`: fp32 weights under bf16 autocast), NaN if
    absent."""
    if not path or not Path(path).exists():
        return math.nan
    from cs336_systems.core.costs import matmul_peaks
    from cs336_systems.core.results import read_csv

    return matmul_peaks(read_csv(path), matmul_path).get("bf16", math.nan)


def matmul_path(variant: str, device_type: str, world_size: int) -> str:
    """The path a variant's matmuls take: the engine's weights are bf16 when its matmuls run on
    CUDA (one device: bf16 working weights, engine/step.py resolve_master_weights; several:
    FSDP gathers them in bf16), a plain bf16 matmul; the plain model runs fp32 weights under bf16
    autocast, as does the engine on the CPU (tests/stages/leaderboard/test_leaderboard.py holds the rules
    together)."""
    engine_bf16 = variant == "engine" and device_type == "cuda"
    return "matmul" if engine_bf16 else "autocast_linear"


def with_path_mfu(df, ceilings_csv: str | Path | None):
    """`df`'s rows with `matmul_path` (inferred for rows written before it was recorded),
    `peak_tflops_per_gpu`, `peak_tflops` (every rank's) and `mfu` against the ceilings' peak of
    that path; `mfu_datasheet` against the device's datasheet bf16 peak (core/costs.py), NaN
    for a device it does not list."""
    if "tflops" not in df or len(df) == 0:
        return df
    df = df.copy()
    given = df["matmul_path"] if "matmul_path" in df else None
    df["matmul_path"] = [
        g if isinstance(g, str) and g else
        matmul_path(v, "cuda" if b == "nccl" else "cpu", int(w))
        for g, v, b, w in zip(
            given if given is not None else [None] * len(df),
            df["variant"], df["backend"], df["world_size"], strict=True,
        )
    ]  # fmt: skip
    peaks = {p: peak_tflops(ceilings_csv, p) for p in set(df["matmul_path"])}
    df["peak_tflops_per_gpu"] = df["matmul_path"].map(peaks)
    df["peak_tflops"] = df["peak_tflops_per_gpu"] * df["world_size"]
    df["mfu"] = df["tflops"] / df["peak_tflops"].where(df["peak_tflops"] > 0)
    # and against the vendor's datasheet bf16 peak of the device, every rank's
    from cs336_systems.core.costs import datasheet_peak

    names = df["device_name"] if "device_name" in df else [""] * len(df)
    df["datasheet_tflops_per_gpu"] = [datasheet_peak(n, "bf16") for n in names]
    df["mfu_datasheet"] = df["tflops"] / (df["datasheet_tflops_per_gpu"] * df["world_size"])
    return df
