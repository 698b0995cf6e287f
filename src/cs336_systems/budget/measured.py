"""The reference H100 run's measured job times, and the estimates of budget/__init__.py against
them (the calibration table of docs/budgets.md; tests/test_budget.py holds each within 25%)."""

from __future__ import annotations

from cs336_systems.budget import H100, Device, plan

# the reference H100 run's job log (results/h100-80gb-hbm3/jobs/<stage>/<job>.tsv, 2026-11-24,
# gpu preset of commit 6b88ea9's parent grid): seconds per (stage, job) the estimates are
# calibrated on. That run's kernel tests failed, so its flash jobs ran no flash_triton point: the
# calibration estimates them without it (MEASURED_WITHOUT)
MEASURED_H100 = {
    # re-measured after the precompile fix (one xdist worker precompiles, 16 workers): pytest
    # of the gpu selection plus tests/test_master_adamw.py, 182 s on the H100 (session 27)
    ("kernel_tests", "kernel_tests"): 182.0,
    ("ceilings", "ceilings"): 7.97,
    ("precision", "precision"): 6.83,
    ("benchmark", "small ctx512 naive"): 124.57,
    ("benchmark", "small ctx512 sdpa"): 21.42,
    ("benchmark", "small ctx512 flash_triton"): 51.28,
    ("benchmark", "medium ctx512 naive"): 33.56,
    ("benchmark", "large ctx512 naive"): 45.76,
    ("benchmark", "10B ctx512 naive"): 6.31,
    ("memory", "xl"): 72.82,
    ("attention", "naive_compiled"): 85.27,
    ("flash", "bf16"): 32.34,
    ("flash", "fp32"): 21.77,
    ("flash", "leaderboard"): 45.18,
    ("checkpointing", "accounting"): 94.30,
    ("checkpointing", "bf16"): 27.37,
    ("allreduce", "nccl"): 6.45,
    ("ddp", "sharding"): 5.56,
    ("fsdp", "runs"): 6.54,
}
MEASURED_WITHOUT = {"flash": "flash_triton"}
# the gpu blocks' keys as that run had them, where the preset has trimmed them since
RUN_KEYS = {
    "benchmark": {
        "warmup_steps": 5,
        "measure_steps": 10,
        "compile_only": {"sizes": ["small", "xl"]},
    },
    "attention": {"warmup_steps": 5, "fwd_steps": 100, "bwd_steps": 100},
    "flash": {"leaderboard": {"warmup_ms": 500, "rep_ms": 2000}},
}


def calibration(config: dict, preset: str = "gpu", dev: Device | None = None) -> list[tuple]:
    """(stage, job, measured s, estimated s) for every job of MEASURED_H100, estimated from
    `config`'s `preset` block as that run had it (MEASURED_WITHOUT's implementations left out)."""
    dev = dev or H100
    config = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for stage, keys in RUN_KEYS.items():
        block = dict(config[stage][preset])
        for key, value in keys.items():
            block[key] = {**block[key], **value} if isinstance(value, dict) else value
        config[stage][preset] = block
    for stage, impl in MEASURED_WITHOUT.items():
        block = dict(config[stage][preset])
        block["impls"] = [i for i in block["impls"] if i != impl]
        if "leaderboard" in block:
            board = dict(block["leaderboard"])
            board["impls"] = [i for i in board["impls"] if i != impl]
            block["leaderboard"] = board
        config[stage][preset] = block
    jobs = {(j.stage, j.job): j.seconds for j in plan(config, preset, dev)}
    return [(s, j, t, jobs[(s, j)]) for (s, j), t in MEASURED_H100.items() if (s, j) in jobs]


CALIBRATION_HEAD = """## Calibration: the H100 constants against the reference run's job log

The `H100` constants in budget/__init__.py come from the gpu preset's partial reference run on one H100
80GB HBM3 (2026-11-24, `results/h100-80gb-hbm3/jobs/**/*.tsv`, first column: seconds):

- rates (`tflops`): xl at context 512, batch 4, eager: training step 1036 ms in fp32 (41
  TFLOP/s through TF32), 225 ms in bf16 (150); forward 326 / 84 ms (43 / 167).
- `launch_s_per_layer`: small's forward at 512 takes 19-21 ms in fp32 and bf16 alike.
- `hbm_tbps`: attention naive_compiled, d=16, n=16384: a 16.7 ms forward for 3 ms of FLOPs.
- `job_start_s`: the jobs that only write status rows (allreduce, ddp, fsdp on one GPU;
  benchmark 10B, every point skipped): 5.6-6.5 s.
- `compile_s`, `compile_s_per_layer`: the bf16 compiled forward and forward+backward graphs of
  small (12 layers) 46 s, xl (32 layers) 116 s. `engine_s`: the engine's rows at small, 9 s
  each, eager and compiled alike (xl eager: 30 s). `first_train_step_s`: the fp32 training-step
  point of small/medium/large 4-7 s beyond its steps, sdpa's first point 9 s after its start.
  `triton_model_s`: small flash_triton's fp32 forward+backward point, 26 s (sdpa's: 1 s).
- `small_compile_s`: attention naive_compiled 85 s for 20 points, 18 s before the first.
- `capture_s`: profile xl under torch.profiler (nsys wrote no report there), 6-7 s a point.
  `snapshot_s`: memory xl, 73 s for 8 snapshots and 4 skipped points.
- `point_s`, `flash_setup_s`: flash bf16 32 s, fp32 22 s (their first point 13 s after the
  previous job); `LEADERBOARD_CHECK_S`: the flash leaderboard, 12 s an implementation.
- `kernel_tests_s`: the cuda selection on 16 xdist workers, 182 s (252 s on 8 before one
  worker alone precompiled the Triton variants); `fixed_s`: ceilings 8 s,
  precision 7 s, checkpointing accounting 94 s.

Not measured there (the run stopped, or the kernel tests failed first): benchmark xl ctx512,
profile small, attention naive_eager (cut), the leaderboard stage, flash_triton's precompile in
the flash jobs (`triton_precompile_s`), nsys captures. That run's kernel tests failed, so its
flash jobs ran no flash_triton point; their estimates below leave it out likewise.

"""


def calibration_markdown(config: dict) -> str:
    rows = calibration({k: v for k, v in config.items()})
    lines = ["| stage | job | measured (s) | estimate (s) | estimate / measured |",
             "|---|---|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {s} | {j} | {m:.0f} | {e:.0f} | {e / m:.2f} |" for s, j, m, e in rows]
    return CALIBRATION_HEAD + "\n".join(lines) + "\n"
