# Stage `allreduce`: all-reduce time, algorithmic and bus bandwidth per backend, world size and
# message size. One job per backend; it launches the ranks once per world size the machine can
# run and records the others as skipped.


ALLREDUCE = stage_config("allreduce")
ALLREDUCE_POINTS = f"{RESULTS}/allreduce/{{backend}}.csv"
ALLREDUCE_PLOTS = ["bandwidth", "time"]
ALLREDUCE_FIGURES = figures("allreduce", ALLREDUCE_PLOTS)


rule allreduce:
    input:
        code_stamp("allreduce", "cs336_systems.stages.allreduce"),
    output:
        ALLREDUCE_POINTS,
    log:
        f"{RESULTS}/logs/allreduce/{{backend}}.log",
    benchmark:
        f"{RESULTS}/jobs/allreduce/{{backend}}.tsv"
    wildcard_constraints:
        backend="gloo|nccl",
    # one process per rank of the largest world (for the scheduler: each computes on one
    # thread, OMP_NUM_THREADS=1 below, as Snakemake's default of 1 thread had it)
    threads: max(ALLREDUCE.world_sizes)
    resources:
        **launcher_resources("allreduce"),
        gpu=gpus(max(ALLREDUCE.world_sizes), only=lambda wc: wc.backend == "nccl"),
    params:
        block=block_text(ALLREDUCE),
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 $PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.allreduce {params.common} --out {output}"
        " --backend {wildcards.backend} --block {params.block:q} 2>&1 | $TEE {log}"


rule allreduce_aggregate:
    input:
        points=expand(ALLREDUCE_POINTS, backend=ALLREDUCE.backends),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("allreduce", f"{RESULTS}/allreduce.csv"),
    log:
        f"{RESULTS}/logs/allreduce_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} 2>&1 | $TEE {log}"


rule allreduce_plots:
    input:
        data=str(rules.allreduce_aggregate.output[0]),
        code=code_stamp("allreduce_analysis", "cs336_systems.stages.allreduce.analysis"),
    output:
        ALLREDUCE_FIGURES,
        vector_figures("allreduce", ALLREDUCE_PLOTS),
    log:
        f"{RESULTS}/logs/allreduce_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.data),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.allreduce.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "allreduce" in STAGES:
    REPORT_INPUTS["allreduce"] = [
        rules.allreduce_aggregate.output[0],
        *ALLREDUCE_FIGURES,
    ]
