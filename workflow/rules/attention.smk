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
        cfg=ATTENTION,
        head_dims=cli_list(ATTENTION["head_dims"]),
        seq_lens=cli_list(ATTENTION["seq_lens"]),
        causal="--causal" if ATTENTION["causal"] else "",
        common=common_args(),
    shell:
        "python3 -m cs336_systems.core.gpus {resources.gpu}"
        " python3 -m cs336_systems.stages.attention {params.common} --out {output}"
        " --impl {wildcards.impl} --batch-size {params.cfg[batch_size]}"
        " --head-dims {params.head_dims} --seq-lens {params.seq_lens} {params.causal}"
        " --warmup {params.cfg[warmup_steps]} --fwd-steps {params.cfg[fwd_steps]}"
        " --bwd-steps {params.cfg[bwd_steps]} 2>&1 | tee {log}"


rule attention_aggregate:
    input:
        points=attention_plan.point_files(ATTENTION, RESULTS),
        code=code_stamp("results", "cs336_systems.core.results"),
    output:
        report_table("attention", f"{RESULTS}/attention.csv"),
    log:
        f"{RESULTS}/logs/attention_aggregate.log",
    localrule: True
    shell:
        "python3 -m cs336_systems.core.results --out {output} {input.points} 2>&1 | tee {log}"


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
        "python3 -m cs336_systems.stages.attention.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | tee {log}"


if "attention" in STAGES:
    REPORT_INPUTS["attention"] = [
        rules.attention_aggregate.output[0],
        *rules.attention_plots.output,
    ]
