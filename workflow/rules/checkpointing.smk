# Stage `checkpointing`: the tensors autograd saves (one RMSNorm, one TransformerBlock; eager and
# compiled) and the peak memory and step time of a training step under each checkpointing
# strategy, beside the analytic model. One accounting job, one strategies job per precision.

from cs336_systems.stages.checkpointing import plan as checkpointing_plan

CHECKPOINTING = stage_config("checkpointing")
CHECKPOINTING_SOURCES = code_stamp(
    "checkpointing", "cs336_systems.stages.checkpointing"
)
CHECKPOINTING_POINTS = f"{RESULTS}/checkpointing/strategies_{{precision}}.csv"
CHECKPOINTING_FIGURES = figures("checkpointing", ["strategies"])


rule checkpointing_accounting:
    input:
        CHECKPOINTING_SOURCES,
    output:
        f"{RESULTS}/checkpointing/saved_tensors.csv",
    log:
        f"{RESULTS}/logs/checkpointing/accounting.log",
    benchmark:
        f"{RESULTS}/jobs/checkpointing/accounting.tsv"
    resources:
        gpu=gpus(1),
    params:
        # its part of the block: the strategies' knobs leave this job as it was
        block=block_text(checkpointing_plan.ACCOUNTING_KNOBS.select(CHECKPOINTING)),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.checkpointing accounting {params.common}"
        " --block {params.block:q} --out {output} 2>&1 | $TEE {log}"


rule checkpointing:
    input:
        CHECKPOINTING_SOURCES,
    output:
        CHECKPOINTING_POINTS,
    log:
        f"{RESULTS}/logs/checkpointing/strategies_{{precision}}.log",
    benchmark:
        f"{RESULTS}/jobs/checkpointing/strategies_{{precision}}.tsv"
    wildcard_constraints:
        precision="fp32|bf16",
    resources:
        gpu=gpus(1),
    params:
        block=block_text(CHECKPOINTING),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.checkpointing strategies {params.common}"
        " --precision {wildcards.precision} --block {params.block:q} --out {output}"
        " 2>&1 | $TEE {log}"


rule checkpointing_aggregate:
    input:
        points=lambda wc: expand(
            CHECKPOINTING_POINTS,
            precision=CHECKPOINTING.precisions,
        ),
        saved=str(rules.checkpointing_accounting.output[0]),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        points=report_table("checkpointing", f"{RESULTS}/checkpointing.csv"),
        saved=report_table("checkpointing", f"{RESULTS}/checkpointing_saved.csv"),
    log:
        f"{RESULTS}/logs/checkpointing_aggregate.log",
    localrule: True
    shell:
        "($PY -m cs336_systems.reporting.aggregate --out {output.points} {input.points}"
        " && $PY -m cs336_systems.reporting.aggregate --out {output.saved} {input.saved})"
        " 2>&1 | $TEE {log}"


rule checkpointing_plots:
    input:
        points=str(rules.checkpointing_aggregate.output.points),
        saved=str(rules.checkpointing_aggregate.output.saved),
        code=code_stamp(
            "checkpointing_analysis", "cs336_systems.stages.checkpointing.analysis"
        ),
    output:
        CHECKPOINTING_FIGURES,
        vector_figures("checkpointing", ["strategies"]),
    log:
        f"{RESULTS}/logs/checkpointing_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.points),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.checkpointing.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "checkpointing" in STAGES:
    REPORT_INPUTS["checkpointing"] = [
        rules.checkpointing_aggregate.output.points,
        rules.checkpointing_aggregate.output.saved,
        *CHECKPOINTING_FIGURES,
    ]
