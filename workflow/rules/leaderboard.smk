# Stage `leaderboard`: the 2026 full-step leaderboard (8B model, context 32,768, batch 2, bf16)
# through the engine and the plain model. One job: it launches on the configured world
# size (skipped rows with the command where the machine lacks it) and, on one GPU, a reduced
# configuration; a second job runs the ablation (the engine with one optimization off per row).
# MFU is against the ceilings stage's measured bf16 peak (its CSV, an input).

LEADERBOARD = stage_config("leaderboard")


LEADERBOARD_FIGURES = figures("leaderboard", ["breakdown"])


rule leaderboard:
    input:
        code_stamp("leaderboard", "cs336_systems.stages.leaderboard"),
        ceilings=f"{RESULTS}/ceilings.csv",
    output:
        f"{RESULTS}/leaderboard/runs.csv",
    log:
        f"{RESULTS}/logs/leaderboard/runs.log",
    benchmark:
        f"{RESULTS}/jobs/leaderboard/runs.tsv"
    # one process per rank
    threads: LEADERBOARD.world_size
    resources:
        gpu=gpus(
            LEADERBOARD.world_size,
            only=lambda wc: LEADERBOARD.backend == "nccl",
        ),
    params:
        block=block_text(LEADERBOARD),
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 $PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.leaderboard {params.common} --out {output}"
        " --plans full,reduced --block {params.block:q} --peak-csv {input.ceilings}"
        " 2>&1 | $TEE {log}"


rule leaderboard_ablation:
    input:
        code_stamp("leaderboard", "cs336_systems.stages.leaderboard"),
        ceilings=f"{RESULTS}/ceilings.csv",
        # each row runs the engine row's checkpointing: one change per row
        runs=f"{RESULTS}/leaderboard/runs.csv",
    output:
        f"{RESULTS}/leaderboard/ablation.csv",
    log:
        f"{RESULTS}/logs/leaderboard/ablation.log",
    benchmark:
        f"{RESULTS}/jobs/leaderboard/ablation.tsv"
    # one process per rank
    threads: LEADERBOARD.world_size
    resources:
        gpu=gpus(
            LEADERBOARD.world_size,
            only=lambda wc: LEADERBOARD.backend == "nccl",
        ),
    params:
        block=block_text(LEADERBOARD),
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 $PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.leaderboard {params.common} --out {output}"
        " --plans ablation --checkpoint-from {input.runs} --block {params.block:q}"
        " --peak-csv {input.ceilings} 2>&1 | $TEE {log}"


rule leaderboard_aggregate:
    input:
        points=str(rules.leaderboard.output[0]),
        ablation=[rules.leaderboard_ablation.output[0]] if LEADERBOARD.ablations else [],
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("leaderboard", f"{RESULTS}/leaderboard.csv"),
    log:
        f"{RESULTS}/logs/leaderboard_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} {input.ablation}"
        " 2>&1 | $TEE {log}"


rule leaderboard_plots:
    input:
        data=str(rules.leaderboard_aggregate.output[0]),
        code=code_stamp(
            "leaderboard_analysis", "cs336_systems.stages.leaderboard.analysis"
        ),
    output:
        LEADERBOARD_FIGURES,
        vector_figures("leaderboard", ["breakdown"]),
    log:
        f"{RESULTS}/logs/leaderboard_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.data),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.leaderboard.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "leaderboard" in STAGES:
    REPORT_INPUTS["leaderboard"] = [
        rules.leaderboard_aggregate.output[0],
        *LEADERBOARD_FIGURES,
    ]
