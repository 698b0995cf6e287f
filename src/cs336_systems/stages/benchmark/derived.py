"""The benchmark's derived numbers: MFU against the ceiling of the path the model takes.

Light (pandas only): the aggregate writes these columns and the analysis recomputes them, so a
CSV aggregated before a ceiling existed is read the same way as a new one.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.core.sanity import MODEL_PATH, PATH_LABEL, matmul_peaks


def add_mfu(df: pd.DataFrame, ceilings: pd.DataFrame | None) -> pd.DataFrame:
    """MFU = achieved TFLOP/s over the measured matmul peak of the path the point's precision
    takes in the model (fp32: a plain fp32 matmul; bf16: autocast F.linear on fp32 weights and
    inputs), `peak_path` naming it. Without that ceiling the MFU is left empty and `peak_path`
    says why: a plain bf16 matmul is not the model's path, and dividing by it misleads."""
    df = df.copy()
    if "tflops" not in df:
        df["tflops"] = float("nan")
    by_path = {path: matmul_peaks(ceilings, path) for path in set(MODEL_PATH.values())}
    peaks, paths = [], []
    for precision in df.get("precision", pd.Series(index=df.index, dtype=object)):
        path = MODEL_PATH.get(str(precision))
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
    return df
