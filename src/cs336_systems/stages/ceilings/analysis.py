"""Report context for the `ceilings` stage."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.core.analysis import load, md_table, plot_main, sig
from cs336_systems.core.sanity import MODEL_PATH, PATH_LABEL


def peaks(results_dir: Path) -> dict[str, float]:
    """Measured plain-matmul TFLOP/s per dtype (bf16, tf32, fp32, ...) and copy GB/s under
    'copy'."""
    df = load(results_dir, "ceilings")
    if len(df) == 0:
        return {}
    df = df[df["status"] == "ok"]
    mm = df[df["kind"] == "matmul"]
    if "path" in mm:
        mm = mm[mm["path"].fillna("matmul") == "matmul"]
    out = mm.set_index("dtype")["tflops"].to_dict()
    copy = df[df["kind"] == "copy"]
    if len(copy):
        out["copy"] = float(copy["gbps"].iloc[0])
    return out


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return []


def _on_gpu(df: pd.DataFrame) -> bool:
    """The rows were measured on a CUDA device (provenance `gpu_count`; a CPU run's is 0)."""
    counts = pd.to_numeric(df.get("gpu_count", pd.Series(dtype=float)), errors="coerce")
    return bool((counts > 0).any())


def _copy_what(gpu: bool) -> str:
    return "device-to-device copy" if gpu else "copy within host memory"


def _what(r, gpu: bool = True) -> str:
    if r["kind"] == "copy":
        return f"{_copy_what(gpu)} of {r['size'] / 2**20:,.0f} MiB (fp32)"
    path = r.get("path") if isinstance(r.get("path"), str) else "matmul"
    how = "a @ b" if path == "matmul" else PATH_LABEL.get(path, path)
    return f"{int(r['size'])}² matmul, {r['dtype']}: {how}"


def _used_for(r) -> str:
    if r["kind"] == "copy":
        return "bandwidth floors"
    path = r.get("path") if isinstance(r.get("path"), str) else "matmul"
    users = [p for p, want in MODEL_PATH.items() if want == path and p == r["dtype"]]
    if users:
        return f"MFU of the model's {', '.join(users)} points"
    if path == "matmul":
        return f"peak of kernels on {r['dtype']} tensors (attention kernels)"
    return "–"


def context(results_dir: Path) -> dict:
    df = load(results_dir, "ceilings")
    if len(df) == 0:
        return {"available": False}
    rates = []
    for _, r in df.iterrows():
        if r["status"] != "ok":
            rates.append("–")
        elif r["kind"] == "matmul":
            rates.append(f"{sig(r['tflops'])} TFLOP/s")
        else:
            rates.append(f"{sig(r['gbps'])} GB/s")
    table = pd.DataFrame(
        {
            "what": [_what(r, _on_gpu(df)) for _, r in df.iterrows()],
            "median ms": [sig(x) for x in df["ms_median"]],
            "rate": rates,
            "used for": [_used_for(r) for _, r in df.iterrows()],
            "status": df["status"],
        }
    )
    has_path = "path" in df and (df["path"] == "autocast_linear").any()
    return {
        "available": True,
        "copy_what": _copy_what(_on_gpu(df)),
        "table": md_table(table),
        "peaks": peaks(results_dir),
        "model_path": has_path,
    }


if __name__ == "__main__":
    plot_main(plot)
