# Stage `benchmark`: end-to-end model latency over size x context x mode x precision x compile,
# one job per (size, context length, attention); plus the warm-up sweep.

from cs336_systems.stages.benchmark import plan as benchmark_plan

BENCHMARK = stage_config("benchmark")
BENCHMARK_POINTS = f"{RESULTS}/benchmark/points/{{size}}_ctx{{ctx}}_{{attention}}.csv"
# a big sweep has a job per point (ten thousand and more): one stamp file stands for the code
# inputs, and the options every point shares are one string, so each job costs Snakemake little
BENCHMARK_CODE = code_stamp("benchmark", "cs336_systems.stages.benchmark")


wildcard_constraints:
    size=r"[A-Za-z0-9.-]+",
    ctx=r"\d+",
    attention=r"[a-z_]+",


rule benchmark:
    input:
        code=BENCHMARK_CODE,
        # the measured matmul rates: a point too slow at them is a `skipped:` row (max_point_s)
        ceilings=f"{RESULTS}/ceilings.csv",
    output:
        BENCHMARK_POINTS,
    log:
        f"{RESULTS}/logs/benchmark/{{size}}_ctx{{ctx}}_{{attention}}.log",
    benchmark:
        f"{RESULTS}/jobs/benchmark/{{size}}_ctx{{ctx}}_{{attention}}.tsv"
    resources:
        gpu=gpus(1),
    params:
        compile=lambda wc: benchmark_plan.compile_arg(
            BENCHMARK, wc.size, int(wc.ctx), wc.attention
        ),
        # the part of the block every point's job reads alike (modes, precisions, compile
        # filters and mode, batch size, warm-up and measured steps), formatted once
        block=block_text(benchmark_plan.run_block(BENCHMARK)),
        # plain; fast (engine/step.py) and hf_gpt2 in the first attention's job
        engines=lambda wc: benchmark_plan.engines_arg(BENCHMARK, wc.attention),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.benchmark run {params.common} --out {output}"
        " --size {wildcards.size} --context-length {wildcards.ctx}"
        " --attention {wildcards.attention} --compile={params.compile}"
        " --engines {params.engines} --block {params.block:q}"
        " --ceilings {input.ceilings}"
        " 2>&1 | $TEE {log}"


rule benchmark_warmup:
    input:
        BENCHMARK_CODE,
    output:
        f"{RESULTS}/benchmark/warmup/{{size}}.csv",
    log:
        f"{RESULTS}/logs/benchmark/warmup_{{size}}.log",
    benchmark:
        f"{RESULTS}/jobs/benchmark/warmup_{{size}}.tsv"
    resources:
        gpu=gpus(1),
    params:
        # its part of the block: the sweep and the batch size
        block=block_text(benchmark_plan.WARMUP_KNOBS.select(BENCHMARK)),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.benchmark warmup {params.common} --out {output}"
        " --size {wildcards.size} --block {params.block:q} 2>&1 | $TEE {log}"


rule benchmark_aggregate:
    input:
        points=[
            BENCHMARK_POINTS.format(
                size=p["size"], ctx=p["context_length"], attention=p["attention"]
            )
            for p in benchmark_plan.points(BENCHMARK)
        ],
        ceilings=f"{RESULTS}/ceilings.csv",
        code=code_stamp(
            "benchmark_aggregate", "cs336_systems.stages.benchmark.aggregate"
        ),
    output:
        report_table("benchmark", f"{RESULTS}/benchmark.csv"),
    log:
        f"{RESULTS}/logs/benchmark_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.stages.benchmark.aggregate --ceilings {input.ceilings}"
        " --out {output} {input.points} 2>&1 | $TEE {log}"


rule benchmark_warmup_aggregate:
    input:
        points=expand(
            rules.benchmark_warmup.output[0], size=BENCHMARK.warmup_sweep.sizes
        ),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("benchmark", f"{RESULTS}/benchmark_warmup.csv"),
    log:
        f"{RESULTS}/logs/benchmark_warmup_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} 2>&1 | $TEE {log}"


BENCHMARK_PLOTS = ["latency", "bwd_fwd", "warmup", "speedups", "mfu"]
BENCHMARK_FIGURES = figures("benchmark", BENCHMARK_PLOTS)


rule benchmark_plots:
    input:
        benchmark=str(rules.benchmark_aggregate.output[0]),
        warmup=str(rules.benchmark_warmup_aggregate.output[0]),
        code=code_stamp("benchmark_analysis", "cs336_systems.stages.benchmark.analysis"),
    output:
        BENCHMARK_FIGURES,
        vector_figures("benchmark", BENCHMARK_PLOTS),
    log:
        f"{RESULTS}/logs/benchmark_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.benchmark),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.benchmark.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "benchmark" in STAGES:
    REPORT_INPUTS["benchmark"] = [
        rules.benchmark_aggregate.output[0],
        rules.benchmark_warmup_aggregate.output[0],
        *BENCHMARK_FIGURES,
    ]
