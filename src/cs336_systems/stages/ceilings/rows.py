"""The `ceilings` stage's rows as the report reads them: the measured peaks, what each row
measured and what reads it, every measurement of a dtype and path, and the section's table (the
best of each). Used by analysis.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.core.costs import MODEL_PATH, PATH_LABEL
from cs336_systems.reporting.analysis import load, md_table, sig


def peaks(results_dir: Path) -> dict[str, float]:
    """Measured plain-matmul TFLOP/s per dtype (bf16, tf32, fp32, ...; the best of its sizes and
    repeats) and copy GB/s under 'copy'."""
    df = load(results_dir, "ceilings")
    if len(df) == 0:
        return {}
    df = df[df["status"] == "ok"]
    mm = df[df["kind"] == "matmul"]
    if "path" in mm:
        mm = mm[mm["path"].fillna("matmul") == "matmul"]
    out = {str(k): float(v) for k, v in mm.groupby("dtype")["tflops"].max().items()}
    copy = df[df["kind"] == "copy"]
    if len(copy):
        out["copy"] = float(copy["gbps"].max())
    return out


def on_gpu(df: pd.DataFrame) -> bool:
    """The rows were measured on a CUDA device (provenance `gpu_count`; a CPU run's is 0)."""
    counts = pd.to_numeric(df.get("gpu_count", pd.Series(dtype=float)), errors="coerce")
    return bool((counts > 0).any())


def copy_what(gpu: bool) -> str:
    return "device-to-device copy" if gpu else "copy within host memory"


def _what(r, gpu: bool = True) -> str:
    if r["kind"] == "copy":
        return f"{copy_what(gpu)} of {r['size'] / 2**20:,.0f} MiB (fp32)"
    path = r.get("path") if isinstance(r.get("path"), str) else "matmul"
    how = "a @ b" if path == "matmul" else PATH_LABEL.get(path, path)
    return f"{int(r['size'])}² matmul, {r['dtype']}: {how}"


def _used_for(r, model_precisions: set[str] | None) -> str:
    """What reads the row. `model_precisions`: the precisions the run's benchmark rows have
    (None: no benchmark rows to tell)."""
    if r["kind"] == "copy":
        return "bandwidth floors"
    path = r.get("path") if isinstance(r.get("path"), str) else "matmul"
    users = [p for p, want in MODEL_PATH.items() if want == path and p == r["dtype"]]
    if users:
        text = f"MFU of the model's {', '.join(users)} points"
        if model_precisions is not None and not set(users) & model_precisions:
            text += " (none in this run)"
        return text
    if path == "matmul":
        return f"peak of kernels on {r['dtype']} tensors (attention kernels)"
    return "–"


def _measurements(g: pd.DataFrame) -> str:
    """Every measurement of one (dtype, path): '4096²: 690, 701; 8192²: 760, 773' (TFLOP/s)."""
    parts = []
    for n, h in g.groupby("size", sort=False):
        vals = ", ".join(sig(v) if st == "ok" else st for v, st in zip(h["tflops"], h["status"],
                                                                      strict=True))  # fmt: skip
        parts.append(f"{int(n)}²: {vals}")
    return "; ".join(parts)


def ceilings_table(df: pd.DataFrame, gpu: bool, model_precisions: set[str] | None) -> str:
    """Per kind, dtype and path: the best rate, its median time, every measurement, what reads
    it and its status (`df`: the rows with their `path` filled in)."""
    rows = []
    for (kind, _, _), g in df.groupby(["kind", "dtype", "path"], sort=False):
        good = g[g["status"] == "ok"]
        rate = "tflops" if kind == "matmul" else "gbps"
        best = good.loc[good[rate].idxmax()] if len(good) else g.iloc[0]
        unit = "TFLOP/s" if kind == "matmul" else "GB/s"
        rows.append(
            {
                "what": _what(best, gpu),
                "best": f"{sig(best[rate])} {unit}" if len(good) else "–",
                "median ms (best)": sig(best["ms_median"]) if len(good) else "–",
                "every measurement (TFLOP/s)": _measurements(g) if kind == "matmul" else "–",
                "used for": _used_for(best, model_precisions),
                "status": "ok" if len(good) else str(g["status"].iloc[0]),
            }
        )
    return md_table(pd.DataFrame(rows), numparse=False)
