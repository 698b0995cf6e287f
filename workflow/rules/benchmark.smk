# Stage `benchmark`: end-to-end model latency over size x context x mode x precision x compile,
# one job per (size, context length, attention); plus the warm-up sweep.

from cs336_systems.stages.benchmark import plan as benchmark_plan

BENCHMARK_POINTS = f"{RESULTS}/benchmark/points/{{size}}_ctx{{ctx}}_{{attention}}.csv"
BENCHMARK_SOURCES = code("cs336_systems.stages.benchmark")


wildcard_constraints:
    size=r"[A-Za-z0-9.]+",
    ctx=r"\d+",
    attention=r"[a-z_]+",


rule benchmark:
    input:
        BENCHMARK_SOURCES,
    output:
        BENCHMARK_POINTS,
    log:
        f"{RESULTS}/logs/benchmark/{{size}}_ctx{{ctx}}_{{attention}}.log",
    benchmark:
        f"{RESULTS}/jobs/benchmark/{{size}}_ctx{{ctx}}_{{attention}}.tsv"
    params:
        modes=lambda wc: cli_list(stage_config("benchmark")["modes"]),
        precisions=lambda wc: cli_list(stage_config("benchmark")["precisions"]),
        compile=lambda wc: benchmark_plan.compile_arg(
            stage_config("benchmark"), wc.size, int(wc.ctx)
        ),
        compile_modes=lambda wc: benchmark_plan.compile_filter(
            stage_config("benchmark"), "modes"
        ),
        compile_precisions=lambda wc: benchmark_plan.compile_filter(
            stage_config("benchmark"), "precisions"
        ),
        compile_mode=lambda wc: stage_config("benchmark").get("compile_mode", "default"),
        batch=lambda wc: stage_config("benchmark")["batch_size"],
        warmup=lambda wc: stage_config("benchmark")["warmup_steps"],
        steps=lambda wc: stage_config("benchmark")["measure_steps"],
        common=common_args(),
    shell:
        "python3 -m cs336_systems.stages.benchmark run {params.common} --out {output}"
        " --size {wildcards.size} --context-length {wildcards.ctx}"
        " --attention {wildcards.attention} --modes {params.modes}"
        " --precisions {params.precisions} --compile {params.compile}"
        " --compile-modes {params.compile_modes}"
        " --compile-precisions {params.compile_precisions}"
        " --compile-mode {params.compile_mode}"
        " --batch-size {params.batch} --warmup {params.warmup} --steps {params.steps}"
        " 2>&1 | tee {log}"


rule benchmark_warmup:
    input:
        BENCHMARK_SOURCES,
    output:
        f"{RESULTS}/benchmark/warmup/{{size}}.csv",
    log:
        f"{RESULTS}/logs/benchmark/warmup_{{size}}.log",
    benchmark:
        f"{RESULTS}/jobs/benchmark/warmup_{{size}}.tsv"
    params:
        cfg=lambda wc: stage_config("benchmark")["warmup_sweep"],
        warmups=lambda wc: cli_list(
            stage_config("benchmark")["warmup_sweep"]["warmups"]
        ),
        batch=lambda wc: stage_config("benchmark")["batch_size"],
        common=common_args(),
    shell:
        "python3 -m cs336_systems.stages.benchmark warmup {params.common} --out {output}"
        " --size {wildcards.size} --context-length {params.cfg[context_length]}"
        " --warmups {params.warmups} --steps {params.cfg[measure_steps]}"
        " --mode {params.cfg[mode]} --precision {params.cfg[precision]}"
        " --batch-size {params.batch} 2>&1 | tee {log}"


rule benchmark_aggregate:
    input:
        points=lambda wc: [
            BENCHMARK_POINTS.format(
                size=p["size"], ctx=p["context_length"], attention=p["attention"]
            )
            for p in benchmark_plan.points(stage_config("benchmark"))
        ],
        ceilings=f"{RESULTS}/ceilings.csv",
        code=code("cs336_systems.stages.benchmark"),
    output:
        f"{RESULTS}/benchmark.csv",
    log:
        f"{RESULTS}/logs/benchmark_aggregate.log",
    localrule: True
    shell:
        "python3 -m cs336_systems.stages.benchmark aggregate --ceilings {input.ceilings}"
        " --out {output} {input.points} 2>&1 | tee {log}"


rule benchmark_warmup_aggregate:
    input:
        points=lambda wc: expand(
            rules.benchmark_warmup.output[0],
            size=stage_config("benchmark").get("warmup_sweep", {}).get("sizes", []),
        ),
        code=code("cs336_systems.core.results"),
    output:
        f"{RESULTS}/benchmark_warmup.csv",
    log:
        f"{RESULTS}/logs/benchmark_warmup_aggregate.log",
    localrule: True
    shell:
        "python3 -m cs336_systems.core.results --out {output} {input.points} 2>&1 | tee {log}"


BENCHMARK_FIGURES = [
    f"{REPORT_DIR}/figures/benchmark_{name}.png"
    for name in ("latency", "bwd_fwd", "warmup", "speedups", "mfu")
]


rule benchmark_plots:
    input:
        benchmark=rules.benchmark_aggregate.output[0],
        warmup=rules.benchmark_warmup_aggregate.output[0],
        code=code("cs336_systems.stages.benchmark.analysis"),
    output:
        BENCHMARK_FIGURES,
    log:
        f"{RESULTS}/logs/benchmark_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.benchmark),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "python3 -m cs336_systems.stages.benchmark.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | tee {log}"


if "benchmark" in STAGES:
    REPORT_INPUTS["benchmark"] = [
        rules.benchmark_aggregate.output[0],
        rules.benchmark_warmup_aggregate.output[0],
        *BENCHMARK_FIGURES,
    ]
