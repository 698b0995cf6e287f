# Stage `ddp`: training steps with each DDP variant against a compute-only step, and
# optimizer-state sharding. Two jobs (variants, sharding), each one torchrun launch.


DDP = stage_config("ddp")
DDP_POINTS = f"{RESULTS}/ddp/{{kind}}.csv"
DDP_PLOTS = ["variants", "buckets", "memory"]
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
    threads: DDP["world_size"]
    resources:
        **launcher_resources("ddp"),
        gpu=gpus(DDP["world_size"], only=lambda wc: DDP["backend"] == "nccl"),
    params:
        cfg=DDP,
        variants=cli_list(DDP["variants"]),
        buckets=cli_list(DDP["bucket_sizes_mb"]),
        env=cli_list(f"{k}={v}" for k, v in sorted(DDP["env"].items())),
        # one profiled step of some variants; its Chrome traces kept under raw/ (keep_raw)
        profile=lambda wc: (
            "--profile" if wc.kind == "variants" and DDP["profile"] else ""
        ),
        traces=lambda wc, output: (
            f"--trace-dir {parent(output[0])}/raw"
            if wc.kind == "variants" and DDP["profile"] and config["keep_raw"]
            else ""
        ),
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 python3 -m cs336_systems.core.gpus {resources.gpu}"
        " python3 -m cs336_systems.stages.ddp {wildcards.kind} {params.common}"
        " --out {output} --backend {params.cfg[backend]} --world-size {params.cfg[world_size]}"
        " --size {params.cfg[size]} --context-length {params.cfg[context_length]}"
        " --batch-per-rank {params.cfg[batch_per_rank]} --variants={params.variants}"
        " --bucket-sizes-mb {params.buckets} --warmup {params.cfg[warmup_steps]}"
        " --steps {params.cfg[measure_steps]}"
        " --matmul-precision {params.cfg[matmul_precision]}"
        " --topology {params.cfg[launcher][topology]} --nnodes {params.cfg[launcher][nnodes]}"
        " --timeout-s {params.cfg[timeout_s]} --env={params.env:q}"
        " {params.profile} {params.traces} 2>&1 | tee {log}"


rule ddp_aggregate:
    input:
        points=expand(
            DDP_POINTS,
            kind=["variants", "sharding"] if DDP["sharding"] else ["variants"],
        ),
        code=code_stamp("results", "cs336_systems.core.results"),
    output:
        report_table("ddp", f"{RESULTS}/ddp.csv"),
    log:
        f"{RESULTS}/logs/ddp_aggregate.log",
    localrule: True
    shell:
        "python3 -m cs336_systems.core.results --out {output} {input.points} 2>&1 | tee {log}"


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
    log:
        f"{RESULTS}/logs/ddp_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.data),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "python3 -m cs336_systems.stages.ddp.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | tee {log}"


if "ddp" in STAGES:
    REPORT_INPUTS["ddp"] = [rules.ddp_aggregate.output[0], *DDP_FIGURES]
