"""What the workflow needs to plan the flash stage's jobs, from the stage's config block."""

from __future__ import annotations


def gate(stages: list[str], results: str) -> list[str]:
    """The kernel tests' CSV when that stage runs (it then gates our kernels), else nothing."""
    return [f"{results}/kernel_tests.csv"] if "kernel_tests" in stages else []


def gate_arg(gate_file: str) -> str:
    return f"--kernel-tests {gate_file}" if gate_file else ""


def options(cfg: dict) -> str:
    """The timing, cap and precision options every flash job shares."""
    timing = cfg["timing"]
    caps = ",".join(f"{k}={v}" for k, v in cfg["max_seq_len"].items())
    tiles = ",".join(str(t) for t in cfg["flash_pytorch_tiles"])
    return (
        f"--max-seq-len '{caps}' --flash-tiles {tiles}"
        f" --fp32-matmul-precision {cfg['fp32_matmul_precision']}"
        f" --warmup-ms {timing['warmup_ms']} --rep-ms {timing['rep_ms']}"
        f" --warmup-steps {timing['warmup_steps']} --steps {timing['steps']}"
    )


def leaderboard_timing(cfg: dict) -> str:
    """The leaderboard point's own do_bench windows, where configured (they override)."""
    board = cfg["leaderboard"]
    return " ".join(
        f"--{key.replace('_', '-')} {board[key]}" for key in ("warmup_ms", "rep_ms") if key in board
    )


def point_files(cfg: dict, results: str) -> list[str]:
    files = [f"{results}/flash/points/{dtype}.csv" for dtype in cfg["dtypes"]]
    return files + ([f"{results}/flash/leaderboard.csv"] if cfg.get("leaderboard") else [])
