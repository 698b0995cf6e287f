# Stage `fsdp`: DDP, DDP + sharded optimizer and FSDP (fp32, bf16 compute) on one model: memory
# per rank, time per step, communication and the all-gather time compute hides. One job, one
# launch (a machine with too few GPUs writes `skipped` rows with the command to run).


FSDP = stage_config("fsdp")
FSDP_PLOTS = ["memory", "time"]
# fsdp_accounting (b): the all-gathers beside the forward on a timeline (stages/fsdp/figures.py)
FSDP_PLOTS += ["timeline"]
FSDP_FIGURES = figures("fsdp", FSDP_PLOTS)


rule fsdp:
    input:
        code_stamp("fsdp", "cs336_systems.stages.fsdp"),
    output:
        f"{RESULTS}/fsdp/runs.csv",
    log:
        f"{RESULTS}/logs/fsdp/runs.log",
    benchmark:
        f"{RESULTS}/jobs/fsdp/runs.tsv"
    # one process per rank
    threads: FSDP.world_size
    resources:
        gpu=gpus(
            FSDP.world_size,
            only=lambda wc: FSDP.backend == "nccl",
        ),
    params:
        block=block_text(FSDP),
        # the profiled steps' Chrome traces (when profile is on) kept under raw/ (keep_raw)
        traces=lambda wc, output: (
            f"--trace-dir {parent(output[0])}/raw" if config["keep_raw"] else ""
        ),
        # the profiled steps' windows for the timeline figure, kept whatever keep_raw says
        timelines=lambda wc, output: f"--timeline-dir {parent(output[0])}/timelines",
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 $PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.fsdp {params.common} --out {output}"
        " --block {params.block:q} {params.traces} {params.timelines} 2>&1 | $TEE {log}"


rule fsdp_aggregate:
    input:
        points=str(rules.fsdp.output[0]),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("fsdp", f"{RESULTS}/fsdp.csv"),
    log:
        f"{RESULTS}/logs/fsdp_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} 2>&1 | $TEE {log}"


rule fsdp_plots:
    input:
        data=str(rules.fsdp_aggregate.output[0]),
        code=code_stamp("fsdp_analysis", "cs336_systems.stages.fsdp.analysis"),
    output:
        FSDP_FIGURES,
        vector_figures("fsdp", FSDP_PLOTS),
        # HolisticTraceAnalysis's reading of the traces, for the report (reporting/hta_check.py)
        f"{RESULTS}/fsdp/hta.json",
    log:
        f"{RESULTS}/logs/fsdp_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.data),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.fsdp.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "fsdp" in STAGES:
    REPORT_INPUTS["fsdp"] = [
        rules.fsdp_aggregate.output[0],
        *FSDP_FIGURES,
        f"{RESULTS}/fsdp/hta.json",
    ]
