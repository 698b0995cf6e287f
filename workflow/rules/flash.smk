# Stage `flash`: causal attention implementations (naive eager/compiled, our FlashAttention-2 in
# PyTorch and Triton, SDPA's flash/cuDNN/efficient backends) over length x head dim x dtype,
# plus the leaderboard point. Our kernels run only if the kernel_tests stage passed them.


from cs336_systems.stages.flash import plan as flash_plan

FLASH = stage_config("flash")
FLASH_PLOTS = ["latency", "tflops", "speedup"]
FLASH_SOURCES = code_stamp("flash", "cs336_systems.stages.flash")
FLASH_GATE = flash_plan.gate(STAGES, RESULTS)


rule flash:
    input:
        code=FLASH_SOURCES,
        gate=FLASH_GATE,
    output:
        f"{RESULTS}/flash/points/{{dtype}}.csv",
    log:
        f"{RESULTS}/logs/flash/{{dtype}}.log",
    benchmark:
        f"{RESULTS}/jobs/flash/{{dtype}}.tsv"
    wildcard_constraints:
        dtype=r"fp32|bf16|fp16",
    resources:
        gpu=gpus(1),
    params:
        # the job's part of the block: the sweep's axes, timing, caps, tiles and precision
        block=block_text(flash_plan.SWEEP_KNOBS.select(FLASH)),
        gate=lambda wc, input: flash_plan.gate_arg(input.gate),
        common=common_args(),
        # rows so far, rewritten after each point (not an output: Snakemake would delete it
        # with an interrupted job); a rerun keeps its ok rows and measures the rest
        partial=lambda wc: f"{RESULTS}/flash/partial/{wc.dtype}.csv",
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.flash sweep {params.common} --out {output}"
        " --partial {params.partial} --dtype {wildcards.dtype} --block {params.block:q}"
        " {params.gate} 2>&1 | $TEE {log}"


rule flash_leaderboard:
    input:
        code=FLASH_SOURCES,
        gate=FLASH_GATE,
    output:
        f"{RESULTS}/flash/leaderboard.csv",
    log:
        f"{RESULTS}/logs/flash/leaderboard.log",
    benchmark:
        f"{RESULTS}/jobs/flash/leaderboard.tsv"
    resources:
        gpu=gpus(1),
    params:
        # the job's part of the block: the leaderboard point, timing, caps, tiles, precision
        block=block_text(flash_plan.LEADERBOARD_KNOBS.select(FLASH)),
        gate=lambda wc, input: flash_plan.gate_arg(input.gate),
        common=common_args(),
        partial=f"{RESULTS}/flash/partial/leaderboard.csv",
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.flash leaderboard {params.common} --out {output}"
        " --partial {params.partial} --block {params.block:q} {params.gate} 2>&1 | $TEE {log}"


rule flash_target:
    input:
        code=FLASH_SOURCES,
        gate=FLASH_GATE,
    output:
        f"{RESULTS}/flash/target.csv",
    log:
        f"{RESULTS}/logs/flash/target.log",
    benchmark:
        f"{RESULTS}/jobs/flash/target.tsv"
    resources:
        gpu=gpus(1),
    params:
        # the job's part of the block: the target's points, timing, caps, tiles, precision
        block=block_text(flash_plan.TARGET_KNOBS.select(FLASH)),
        gate=lambda wc, input: flash_plan.gate_arg(input.gate),
        common=common_args(),
        partial=f"{RESULTS}/flash/partial/target.csv",
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.flash target {params.common} --out {output}"
        " --partial {params.partial} --block {params.block:q} {params.gate} 2>&1 | $TEE {log}"


rule flash_aggregate:
    input:
        points=flash_plan.point_files(FLASH, RESULTS),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("flash", f"{RESULTS}/flash.csv"),
    log:
        f"{RESULTS}/logs/flash_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} 2>&1 | $TEE {log}"


rule flash_plots:
    input:
        csv=str(rules.flash_aggregate.output[0]),
        code=code_stamp("flash_analysis", "cs336_systems.stages.flash.analysis"),
    output:
        figures("flash", FLASH_PLOTS),
        vector_figures("flash", FLASH_PLOTS),
    log:
        f"{RESULTS}/logs/flash_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.csv),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.flash.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "flash" in STAGES:
    REPORT_INPUTS["flash"] = [
        rules.flash_aggregate.output[0],
        *rules.flash_plots.output,
    ]
