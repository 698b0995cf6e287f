# Stage `attention`: naive attention (batch 8, one head) eager and torch.compile'd over head
# dim x sequence length: forward/backward time, memory before backward, out-of-memory points.

from cs336_systems.stages.attention import plan as attention_plan

ATTENTION = stage_config("attention")
ATTENTION_PLOTS = ["time", "memory", "compile"]


rule attention:
    input:
        code_stamp("attention", "cs336_systems.stages.attention"),
    output:
        f"{RESULTS}/attention/points/{{impl}}.csv",
    log:
        f"{RESULTS}/logs/attention/{{impl}}.log",
    benchmark:
        f"{RESULTS}/jobs/attention/{{impl}}.tsv"
    wildcard_constraints:
        impl=r"naive_[a-z]+",
    resources:
        gpu=gpus(1),
    params:
        block=block_text(ATTENTION),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.attention {params.common} --out {output}"
        " --impl {wildcards.impl} --block {params.block:q} 2>&1 | $TEE {log}"


rule attention_aggregate:
    input:
        points=attention_plan.point_files(ATTENTION, RESULTS),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        report_table("attention", f"{RESULTS}/attention.csv"),
    log:
        f"{RESULTS}/logs/attention_aggregate.log",
    localrule: True
    shell:
        "$PY -m cs336_systems.reporting.aggregate --out {output} {input.points} 2>&1 | $TEE {log}"


rule attention_plots:
    input:
        csv=str(rules.attention_aggregate.output[0]),
        code=code_stamp("attention_analysis", "cs336_systems.stages.attention.analysis"),
    output:
        figures("attention", ATTENTION_PLOTS),
        vector_figures("attention", ATTENTION_PLOTS),
    log:
        f"{RESULTS}/logs/attention_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.csv),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.attention.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "attention" in STAGES:
    REPORT_INPUTS["attention"] = [
        rules.attention_aggregate.output[0],
        *rules.attention_plots.output,
    ]
