"""The machines a preset's budget is estimated on: rates and fixed costs (docs/budgets.md says
which measurement each H100 constant comes from)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """What a job costs on one machine: rates and fixed costs, in seconds (docs/budgets.md says
    which measurement each H100 constant comes from)."""

    name: str
    # the model matmul rates a step reaches per precision, TFLOP/s (not the datasheet peak)
    tflops: dict
    # a step's floor when kernel launches, not FLOPs, bound it: this per layer per forward
    # (a forward+backward counts 3 forwards, a training step 3.5)
    launch_s_per_layer: float
    hbm_tbps: float  # bandwidth the attention's (n x n) score passes reach, TB/s
    job_start_s: float  # python, import torch, CUDA context
    build_s_per_gparam: float  # building and moving a model to the device, first step
    # torch.compile of one model shape (size, context) in one precision: compile_s plus
    # compile_s_per_layer a transformer block (dynamo traces, inductor lowers every block)
    compile_s: float
    compile_s_per_layer: float
    first_train_step_s: float  # a benchmark job's first training step beyond its FLOPs
    triton_model_s: float  # the flash_triton attention's kernels in a model (benchmark)
    flash_setup_s: float  # a flash job's imports and checks before its first point
    engine_s: float  # an engine row's own setup (engine/step.py), beside its build and steps
    memory_gib: float | None  # free device memory the stages' skip checks read (None: no check)
    small_compile_s: float  # torch.compile of an attention function
    triton_precompile_s: float  # our Triton kernels' variants, once per flash job
    capture_s: float  # one profiler capture and its export (nsys stats or torch.profiler)
    snapshot_s: float  # one memory snapshot written and read back
    point_s: float  # a flash point: correctness check, three do_bench windows
    gpus: int
    budget_s: float
    kernel_tests_s: float  # the kernels' pytest suite (the preset's selection, xdist workers)
    fixed_s: dict  # stages whose cost the config does not scale: seconds after the job start
    parallel: int  # jobs at once (snakemake --cores): the wall is the sum over this


# calibrated on the reference H100 run's job log (results/h100-80gb-hbm3/jobs/, 2026-11-24):
# budget/measured.py holds those times and docs/budgets.md compares them with the estimates
H100 = Device(
    name="one H100 80GB (fp32 42, bf16 160 TFLOP/s reached)",
    # xl at context 512, batch 4, eager: training step 1036 ms fp32 (41 TFLOP/s, TF32), 225 ms
    # bf16 (150), forward 326 / 84 ms (43 / 167)
    tflops={"bf16": 160.0, "fp32": 42.0},
    # small (12 layers) at 512: forward 19-21 ms in fp32 and bf16 alike, launch-bound
    launch_s_per_layer=0.0015,
    # attention d=16 n=16384 (B=8): forward 16.7 ms for 3 ms of FLOPs (naive_compiled)
    hbm_tbps=3.0,
    # status-row jobs (allreduce, ddp, fsdp on one GPU; every 10B point skipped): 5.6-6.5 s
    job_start_s=6.0,
    # xl (3.4 G parameters): its job's first point ends 21 s after the previous job, 5 s of it
    # its steps
    build_s_per_gparam=3.0,
    # a compiled model's forward and backward graphs: small (12 layers) 46 s, xl (32) 116 s
    compile_s=5.0,
    compile_s_per_layer=3.5,
    # the engine's rows at small: 9 s each (eager and compiled alike), xl eager 30 s
    engine_s=7.0,
    # benchmark small/medium/large: the fp32 training step point 4-7 s beyond its steps, and
    # small sdpa's first point 9 s after the job's start
    first_train_step_s=8.0,
    # benchmark small flash_triton: its fp32 forward+backward point 26 s (sdpa's: 1 s)
    triton_model_s=25.0,
    # flash bf16: its first point 13 s after the previous job ended
    flash_setup_s=7.0,
    memory_gib=79.0,
    # attention naive_compiled: 85 s for 20 points, ~18 s before the first
    small_compile_s=4.0,
    triton_precompile_s=45.0,  # not measured (kernel tests failed: no flash_triton points)
    # profile xl, torch.profiler (nsys wrote no report there): 6-7 s a point, steps included
    capture_s=5.0,
    # memory xl: 73 s, 8 snapshots, the ctx2048 checkpointed training steps 18 s
    snapshot_s=2.0,
    # flash bf16 32 s (40 points run, 20 skipped), fp32 22 s (16 run, 44 skipped/error/oom)
    point_s=0.3,
    gpus=1,
    budget_s=25 * 60.0,
    # the cuda selection with 16 xdist workers: 182 s (pytest's own 173 s, 79 s of it the
    # first worker's precompile); 252 s on 8 workers when every worker re-ran the precompile
    kernel_tests_s=176.0,
    # ceilings 8 s, precision 7 s; checkpointing accounting (one RMSNorm and one xl block,
    # eager and inductor): 94 s, 88.6 s of it its own log's
    fixed_s={"ceilings": 2.0, "precision": 1.0, "arithmetic": 5.0, "accounting": 88.0},
    parallel=1,
)
# a 2-core CI machine: fp32 ~0.02 TFLOP/s reached; no bf16 units (the cost guard skips bf16)
CPU2 = Device(
    name="2 CPU cores (fp32 0.02 TFLOP/s reached, snakemake --cores 2)",
    tflops={"bf16": 0.0008, "fp32": 0.02},
    launch_s_per_layer=0.0,
    hbm_tbps=0.01,
    job_start_s=4.0,
    build_s_per_gparam=20.0,
    compile_s=40.0,
    compile_s_per_layer=0.0,
    engine_s=2.0,
    first_train_step_s=0.0,
    triton_model_s=0.0,
    flash_setup_s=0.0,
    memory_gib=None,
    small_compile_s=20.0,
    triton_precompile_s=0.0,
    capture_s=3.0,
    snapshot_s=1.0,
    point_s=0.5,
    gpus=0,
    budget_s=5 * 60.0,
    # measured on a fresh clone on an idle 2-core machine (2026-11-24, `snakemake --cores 2
    # report`, 5 min 17 s in all): the kernel_tests job 35 s (90 s on a machine shared with other
    # work), ceilings 8 s, precision 8 s
    kernel_tests_s=31.0,
    fixed_s={"ceilings": 4.0, "precision": 4.0, "arithmetic": 5.0, "accounting": 5.0},
    parallel=2,
)
