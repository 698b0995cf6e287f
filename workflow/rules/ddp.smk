# Stage `ddp`: training steps with each DDP variant against a compute-only step, and
# optimizer-state sharding. Two jobs (variants, sharding), each one launch.


DDP = stage_config("ddp")
DDP_POINTS = f"{RESULTS}/ddp/{{kind}}.csv"
DDP_PLOTS = ["variants", "buckets", "memory"]
# ddp_overlap (b): naive beside overlapped on a timeline (stages/ddp/figures.py)
DDP_PLOTS += ["timeline"]
DDP_FIGURES = figures("ddp", DDP_PLOTS)


rule ddp:
    input:
        code_stamp("ddp", "cs336_systems.stages.ddp"),
    output:
        DDP_POINTS,
    log:
        f"{RESULTS}/logs/ddp/{{kind}}.log",
    benchmark:
        f"{RESULTS}/jobs/ddp/{{kind}}.tsv"
    wildcard_constraints:
        kind="variants|sharding",
    # one process per rank (for the scheduler: each computes on one thread, OMP_NUM_THREADS=1
    # below, as Snakemake's default of 1 thread had it)
    threads: DDP.world_size
    resources:
        **launcher_resources("ddp"),
        gpu=gpus(DDP.world_size, only=lambda wc: DDP.backend == "nccl"),
    params:
        block=block_text(DDP),
        # the profiled steps' Chrome traces (the variants job's, when profile is on) kept
        traces=lambda wc, output: (
            f"--trace-dir {parent(output[0])}/raw"
            if wc.kind == "variants" and config["keep_raw"]
            else ""
        ),
        # the profiled steps' windows for the timeline figure, kept whatever keep_raw says
        timelines=lambda wc, output: f"--timeline-dir {parent(output[0])}/timelines",
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 $PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.ddp {wildcards.kind} {params.common}"
        " --out {output} --block {params.block:q} {params.traces} {params.timelines}"
        " 2>&1 | $TEE {log}"


rule ddp_aggregate:
    input:
        points=expand(
            DDP_POINTS,
            kind=["variants", "sharding"] if DDP.sharding else ["variants"],
        ),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("ddp", f"{RESULTS}/ddp.csv"),
    log:
        f"{RESULTS}/logs/ddp_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} 2>&1 | $TEE {log}"


rule ddp_plots:
    input:
        data=str(rules.ddp_aggregate.output[0]),
        # the bucket-size model is fitted to the measured all-reduce latency and bandwidth
        allreduce=lambda wc: (
            [str(rules.allreduce_aggregate.output[0])] if "allreduce" in STAGES else []
        ),
        code=code_stamp("ddp_analysis", "cs336_systems.stages.ddp.analysis"),
    output:
        DDP_FIGURES,
        vector_figures("ddp", DDP_PLOTS),
        # HolisticTraceAnalysis's reading of the traces, for the report (reporting/hta_check.py)
        f"{RESULTS}/ddp/hta.json",
    log:
        f"{RESULTS}/logs/ddp_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.data),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.ddp.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "ddp" in STAGES:
    REPORT_INPUTS["ddp"] = [
        rules.ddp_aggregate.output[0],
        *DDP_FIGURES,
        f"{RESULTS}/ddp/hta.json",
    ]
