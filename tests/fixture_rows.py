"""Small synthetic stage CSVs for the report's tests (no measuring: rows as the stages write them)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

MODES = ("forward", "forward_backward", "train_step")


def prov(machine: str = "fixture-cpu", device: str = "Fixture CPU", gpus: int = 0) -> dict:
    return {
        "machine": machine,
        "preset": "cpu" if gpus == 0 else "gpu",
        "edition": 2026,
        "device_name": device,
        "torch": "2.11.0",
        "triton": "3.6.0",
        "cuda": "13.0" if gpus else "none",
        "torch_cuda": "13.0",
        "driver": "580.1" if gpus else "–",
        "nccl": "2.27.3" if gpus else "none",
        "nsys": "absent",
        "cpu_model": "Fixture CPU",
        "cpu_cores": 2,
        "gpu_count": gpus,
        "gpu_index": ",".join(map(str, range(gpus))) if gpus else "–",
        "cpu_set": "0-1",
        "job_id": "",
        "gpu_sm_clock_max_mhz": "1980" if gpus else "–",
        "gpu_power_limit_w": "700" if gpus else "–",
        "git_commit": "abc123def456",
        "git_dirty_files": "",
        "timestamp": "2026-01-01T00:00:00+00:00",
    }


def benchmark_rows(
    ms: dict | None = None, std: float = 1.0, sizes=("tiny",), machine_kw: dict | None = None
) -> pd.DataFrame:
    """Eager naive points of `sizes` at context 32 in fp32 and bf16; `ms[(size, mode,
    precision)]` overrides a step time (default forward 10, forward+backward 30, step 35)."""
    base = {"forward": 10.0, "forward_backward": 30.0, "train_step": 35.0}
    rows = []
    for size in sizes:
        for precision in ("fp32", "bf16"):
            for mode in MODES:
                t = (ms or {}).get((size, mode, precision), base[mode])
                flops = {"forward": 1e9, "forward_backward": 3e9, "train_step": 3e9}[mode]
                rows.append(
                    {
                        **prov(**(machine_kw or {})),
                        "size": size,
                        "params": 1_000_000,
                        "context_length": 32,
                        "batch_size": 4,
                        "attention": "naive",
                        "compile_mode": "default",
                        "mode": mode,
                        "precision": precision,
                        "compile": "eager",
                        "warmup_steps": 1,
                        "measure_steps": 3,
                        "status": "ok",
                        "step_ms_mean": t,
                        "step_ms_std": std,
                        "step_ms_median": t,
                        "flops_per_step": flops,
                        "tflops": flops / (t * 1e-3) / 1e12,
                        "tokens_per_s": 4 * 32 / (t * 1e-3),
                    }
                )
    return pd.DataFrame(rows)


def ceilings_rows(
    fp32: float = 0.5, bf16: float = 0.1, autocast: float | None = 1.0, machine_kw=None
) -> pd.DataFrame:
    rows = [
        {"kind": "matmul", "dtype": "fp32", "path": "matmul", "tflops": fp32},
        {"kind": "matmul", "dtype": "bf16", "path": "matmul", "tflops": bf16},
    ]
    if autocast is not None:
        rows.append(
            {"kind": "matmul", "dtype": "bf16", "path": "autocast_linear", "tflops": autocast}
        )
    rows.append({"kind": "copy", "dtype": "fp32", "path": "copy_", "gbps": 10.0})
    return pd.DataFrame(
        [
            {**prov(**(machine_kw or {})), "size": 1024, "status": "ok", "ms_median": 1.0, **r}
            for r in rows
        ]
    )


def write_results(folder: Path, **frames: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, df in frames.items():
        df.to_csv(folder / f"{name}.csv", index=False)
    return folder
