"""The benchmark's derived numbers: MFU against the ceiling of the path the model takes.

Light (pandas only): the aggregate writes these columns and the analysis recomputes them, so a
CSV aggregated before a ceiling existed is read the same way as a new one.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.core.costs import MODEL_PATH, PATH_LABEL, datasheet_peak, matmul_peaks


def model_rates(ceilings: pd.DataFrame | None) -> dict[str, tuple[float, str]]:
    """{precision: (measured TFLOP/s, path)} through the path each precision's matmuls take in
    the model; a precision without such a ceiling is absent."""
    out = {}
    for precision, path in MODEL_PATH.items():
        peak = matmul_peaks(ceilings, path).get(precision)
        if peak is not None and peak > 0:
            out[precision] = (peak, path)
    return out


def too_costly(
    flops_per_step: float,
    steps: int,
    precision: str,
    rates: dict[str, tuple[float, str]],
    max_seconds: float | None,
) -> str:
    """`skipped: <why>` when `steps` steps of `flops_per_step` would take more than
    `max_seconds` at the measured rate of the precision's path (a lower bound: the model reaches
    at most that rate), else empty. Unknown rate or no limit: empty (the point runs)."""
    if not max_seconds or precision not in rates:
        return ""
    tflops, path = rates[precision]
    seconds = steps * flops_per_step / (tflops * 1e12)
    if seconds <= max_seconds:
        return ""
    return (
        f"skipped: at least {seconds:.0f} s ({steps} steps of {flops_per_step / 1e9:.1f} GFLOP at "
        f"this machine's measured {precision} rate of {tflops:.3g} TFLOP/s through "
        f"{PATH_LABEL.get(path, path)}), above the preset's max_point_s of {max_seconds:g} s"
    )


def add_mfu(df: pd.DataFrame, ceilings: pd.DataFrame | None) -> pd.DataFrame:
    """MFU = achieved TFLOP/s over the measured matmul peak of the path the point's precision
    takes in the model (fp32: a plain fp32 matmul; bf16: autocast F.linear on fp32 weights and
    inputs), `peak_path` naming it. Without that ceiling the MFU is left empty and `peak_path`
    says why: a plain bf16 matmul is not the model's path, and dividing by it misleads. Beside
    it, `mfu_datasheet` against the vendor's dense peak of the row's device (core/costs.py
    DATASHEET_TFLOPS), NaN for a device the table does not list."""
    df = df.copy()
    if "tflops" not in df:
        df["tflops"] = float("nan")
    by_path = {path: matmul_peaks(ceilings, path) for path in {*MODEL_PATH.values(), "matmul"}}
    peaks, paths = [], []
    own = df["matmul_path"] if "matmul_path" in df else pd.Series(index=df.index, dtype=object)
    for precision, row_path in zip(
        df.get("precision", pd.Series(index=df.index, dtype=object)), own, strict=True
    ):
        # a row that names its own matmul path (the engine's bf16 working weights: plain bf16
        # matmuls) is held to that path's ceiling, else its precision's path in the model
        path = (
            row_path if isinstance(row_path, str) and row_path else MODEL_PATH.get(str(precision))
        )
        peak = by_path.get(path, {}).get(str(precision)) if path else None
        if peak is None:
            peaks.append(float("nan"))
            paths.append(
                f"missing: no {precision} ceiling through {PATH_LABEL.get(path, path)} "
                "in this run's ceilings"
            )
        else:
            peaks.append(peak)
            paths.append(path)
    df["peak_tflops"] = peaks
    df["peak_path"] = paths
    df["mfu"] = df["tflops"] / df["peak_tflops"].astype(float)
    # and against the vendor's datasheet peak of the row's device and precision
    names = df["device_name"] if "device_name" in df else pd.Series("", index=df.index)
    precs = df.get("precision", pd.Series("", index=df.index))
    df["datasheet_tflops"] = [datasheet_peak(n, p) for n, p in zip(names, precs, strict=True)]
    df["mfu_datasheet"] = df["tflops"] / df["datasheet_tflops"]
    if "pipelined_ms" in df and "step_ms_mean" in df:
        # the same FLOPs at the back-to-back rate (harness.pipelined_ms)
        per_step = df["tflops"] * pd.to_numeric(df["step_ms_mean"], errors="coerce")
        df["pipelined_tflops"] = per_step / pd.to_numeric(df["pipelined_ms"], errors="coerce")
        df["pipelined_mfu"] = df["pipelined_tflops"] / df["peak_tflops"].astype(float)
        df["pipelined_mfu_datasheet"] = df["pipelined_tflops"] / df["datasheet_tflops"]
    return df
