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
    # the ceilings stage's measured matmul rates per precision (on the model's path), which the
    # benchmark's max_point_s guard divides by; None: `tflops`
    peak_tflops: dict | None
    # a step's floor when kernel launches, not FLOPs, bound it: this per layer per forward
    # (a forward+backward counts 3 forwards, a training step 3.5)
    launch_s_per_layer: float
    hbm_tbps: float  # bandwidth the attention's (n x n) score passes reach, TB/s
    job_start_s: float  # python, import torch, CUDA context
    # a job's first CUDA work beyond job_start_s (cuBLAS handles, the allocator, first kernels)
    # where no other constant of the job holds it (the attention jobs)
    gpu_init_s: float
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
    gloo_world_s: float  # one world of gloo processes on the host: launch, steps, teardown
    # one NCCL world of a distributed stage's job ("<stage>/<job>"), beyond the job's start;
    # a job not named costs gloo_world_s a world
    nccl_world_s: dict
    # a job's time as the run now runs it over the time the constants were fitted to (the CPU
    # constants: two jobs at once on the two cores; the runs since: each measuring job alone)
    alone: float = 1.0


# calibrated on the job log of the H100 reference run of 50ebc65 (that of dfdd876 before it, on
# another host of the kind); budget/measured.py reads the committed reference's job log
# (report/reference/h100-80gb-hbm3/jobs/, now the run of e0aec35) and docs/budgets.md compares
# it with the estimates
H100 = Device(
    name="one H100 80GB (fp32 42, bf16 200 TFLOP/s reached)",
    # xl at context 512, batch 4, eager: training step 1030 ms fp32 (41 TFLOP/s, TF32), 217 ms
    # bf16 (197), forward 324 / 66 ms (44 / 213)
    tflops={"bf16": 200.0, "fp32": 42.0},
    peak_tflops=None,  # the gpu preset sets no max_point_s
    # small (12 layers) at 512, launch-bound: forward 17-29 ms, forward+backward 50-66 ms, in
    # fp32 and bf16 alike
    launch_s_per_layer=0.0015,
    # attention d=16 n=16384 (B=8): forward 16.7 ms for 3 ms of FLOPs (naive_compiled)
    hbm_tbps=3.0,
    # status-row jobs (allreduce, ddp sharding, fsdp on one GPU; every 10B point skipped):
    # 5.3-7.2 s
    job_start_s=6.0,
    # attention naive_eager: its first point 24 s before the job's end of 34 s, 20 points
    gpu_init_s=4.0,
    # xl (3.4 G parameters): its job's first point ends 21 s after the previous job, 5 s of it
    # its steps
    build_s_per_gparam=3.0,
    # a compiled model's forward and backward graphs: small (12 layers) 46 s, xl (32) 116 s
    compile_s=5.0,
    compile_s_per_layer=3.5,
    # an engine row at small: 2 s beyond its steps (its model built first)
    engine_s=2.0,
    # benchmark small/medium/large: the fp32 training step point 4-7 s beyond its steps, and
    # small sdpa's first point 9 s after the job's start
    first_train_step_s=8.0,
    # benchmark small flash_triton: 15.3 s, as small sdpa's 15.4, its kernels read from the
    # Triton cache the kernel_tests job filled before it (41.6 s in the run of dfdd876, its fp32
    # forward+backward point 26 s)
    triton_model_s=0.0,
    # flash bf16: its first point 13 s after the previous job ended
    flash_setup_s=7.0,
    memory_gib=79.0,
    # attention naive_compiled: 85 s for 20 points, ~18 s before the first
    small_compile_s=4.0,
    triton_precompile_s=45.0,  # not measured (kernel tests failed: no flash_triton points)
    # profile small and medium: 31 and 35 s, 9 torch.profiler captures each, steps included
    capture_s=1.8,
    # memory xl: 61 s, 8 snapshots, the ctx2048 checkpointed training steps 18 s
    snapshot_s=0.5,
    # flash bf16 32 s (40 points run, 20 skipped), fp32 22 s (16 run, 44 skipped/error/oom)
    point_s=0.3,
    gpus=1,
    # 25 min until the study followed the handouts closer: a fresh process per warm-up count,
    # an inference forward per context and the FA2 grid's ten lengths (26.0 min estimated)
    budget_s=27 * 60.0,
    # the cuda selection with 16 xdist workers: 151 s (121 s on a faster host, same commit's
    # grid); 252 s on 8 workers when every worker re-ran the precompile
    kernel_tests_s=145.0,
    # ceilings 7.2 s (13 s in the run of dfdd876) for four matmuls and a copy: the job's start
    # and do_bench's windows (budget/__init__.py _ceilings), nothing beside; precision 6 s;
    # checkpointing accounting (one RMSNorm and one xl block, eager and inductor): 27 s
    fixed_s={"ceilings": 0.0, "precision": 0.5, "arithmetic": 5.0, "accounting": 21.0},
    gloo_world_s=30.0,  # not measured there (the gpu preset runs no gloo world)
    # the 4x H200 reference (9653a8c, one job at a time; the 2x H200 run of 995b90f alike):
    # ddp variants 172 s (167), sharding 52 (51), fsdp 196, all-reduce 30 s for worlds 2 and 4
    # (18 for 2)
    nccl_world_s={
        "ddp/variants": 165.0,
        "ddp/sharding": 46.0,
        "fsdp/runs": 190.0,
        "allreduce/nccl": 12.0,
    },  # fmt: skip
)
# the 2-core development machine (CI's size), `snakemake --cores 2`: calibrated on the cpu
# preset's run of 34787cd (docs/measurements/budget-cpu-34787cd/: a fresh clone, 3 min 2 s, on
# an AMD EPYC with AVX-512 bf16 units; the runs before it, on a CPU without bf16 units, measured
# bf16 autocast F.linear at 0.0096 TFLOP/s, where the cost guard skips small's bf16 points)
CPU2 = Device(
    name="2 CPU cores (fp32 0.05, bf16 0.12 TFLOP/s reached, snakemake --cores 2)",
    # small's fp32 steps 0.029-0.078 TFLOP/s, its bf16 autocast steps 0.088-0.153; tiny's
    # 0.014-0.075 in both
    tflops={"bf16": 0.12, "fp32": 0.05},
    # its ceilings stage: fp32 matmul (1024^3) 0.081, bf16 autocast F.linear (512^3) 0.18 TFLOP/s
    peak_tflops={"bf16": 0.18, "fp32": 0.081},
    launch_s_per_layer=0.0,
    hbm_tbps=0.01,
    # precision 2.7 s in all, allreduce nccl (status rows) 2.5 s
    job_start_s=2.5,
    # attention naive_eager 5.5 s, of which the other constants account for 2.7: fitted (a
    # CPU job's first work, not separated)
    gpu_init_s=2.0,
    build_s_per_gparam=20.0,
    # tiny's compiled forward: 20 s from the last eager point to its row, 4 steps included
    compile_s=20.0,
    compile_s_per_layer=0.0,
    engine_s=2.0,
    # a benchmark job's first training step: tiny's bf16 1.2 s, small's fp32 3.4 s (the run of
    # 44e11d6); 3 s fits the run of 34787cd's benchmark jobs and warm-up sweep
    first_train_step_s=3.0,
    triton_model_s=0.0,
    # flash fp32 (Triton's interpreter): 14.8 s for 14 points
    flash_setup_s=3.0,
    memory_gib=None,
    small_compile_s=20.0,
    triton_precompile_s=0.0,
    # profile tiny: 9 torch.profiler captures in 8.8 s, its job start included
    capture_s=0.5,
    # memory tiny: 12 points (RSS only, no snapshots) in 13.8 s
    snapshot_s=0.3,
    point_s=0.5,
    gpus=0,
    budget_s=5 * 60.0,
    # the kernel_tests job 19 s (35 s on the CPU without bf16 units, 90 s on a machine shared
    # with other work), ceilings 3.9 s, precision 2.4 s, checkpointing accounting 7.7 s
    kernel_tests_s=22.0,
    fixed_s={"ceilings": 1.5, "precision": 0.2, "arithmetic": 5.0, "accounting": 5.0},
    # gloo worlds of 2 host processes, each on a core of its own (the committed cpu reference,
    # e32e8b7, each job alone): ddp variants 9.9 s, sharding 6.0, fsdp 9.8, allreduce 6.0,
    # leaderboard 5.0 and 6.2 (12-20 s before the ranks were pinned)
    gloo_world_s=8.0,
    nccl_world_s={},
    # each measuring job now holds both cores alone (the `timing` resource), faster than beside
    # another: the committed cpu reference's jobs (one run of e077f4b) sum to 245 s and those
    # of fa3b785 on the same host to 297 s, against 334 s the constants above estimate
    # (budget/measured.py: calibration); 0.81 is their middle
    alone=0.81,
)
