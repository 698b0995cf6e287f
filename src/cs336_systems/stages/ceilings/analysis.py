"""Report context for the `ceilings` stage."""

from __future__ import annotations

from pathlib import Path

from cs336_systems.core.analysis import load, md_table, plot_main


def peaks(results_dir: Path) -> dict[str, float]:
    """Measured matmul TFLOP/s per dtype (bf16, tf32, fp32, ...) and copy GB/s under 'copy'."""
    df = load(results_dir, "ceilings")
    if len(df) == 0:
        return {}
    df = df[df["status"] == "ok"]
    out = df[df["kind"] == "matmul"].set_index("dtype")["tflops"].to_dict()
    copy = df[df["kind"] == "copy"]
    if len(copy):
        out["copy"] = float(copy["gbps"].iloc[0])
    return out


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return []


def context(results_dir: Path) -> dict:
    df = load(results_dir, "ceilings")
    if len(df) == 0:
        return {"available": False}
    table = df.assign(
        what=df["kind"] + " " + df["dtype"],
        rate=[
            f"{r.tflops:.1f} TFLOP/s" if r.kind == "matmul" else f"{r.gbps:.0f} GB/s"
            for r in df.itertuples()
        ],
    )[["what", "size", "ms_median", "rate", "status"]]
    return {"available": True, "table": md_table(table), "peaks": peaks(results_dir)}


if __name__ == "__main__":
    plot_main(plot)
