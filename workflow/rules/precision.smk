# Stage `precision`: floating-point accumulation, autocast dtypes of a toy model, LayerNorm's
# sensitivity to low precision. One job; the report also reads the benchmark and memory CSVs.

PRECISION = stage_config("precision")
PRECISION_OUTPUTS = {
    "accumulation": f"{RESULTS}/precision.csv",
    "dtypes": f"{RESULTS}/precision_dtypes.csv",
    "layernorm": f"{RESULTS}/precision_layernorm.csv",
}
PRECISION_PLOTS = ["accumulation", "layernorm"]
PRECISION_FIGURES = figures("precision", PRECISION_PLOTS)


rule precision:
    input:
        code_stamp("precision", "cs336_systems.stages.precision"),
    output:
        **{k: report_table("precision", v) for k, v in PRECISION_OUTPUTS.items()},
    log:
        f"{RESULTS}/logs/precision.log",
    benchmark:
        f"{RESULTS}/jobs/precision.tsv"
    resources:
        gpu=gpus(1),
    params:
        block=block_text(PRECISION),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.precision run {params.common} --block {params.block:q}"
        " --out {output.accumulation} --dtypes-out {output.dtypes}"
        " --layernorm-out {output.layernorm} 2>&1 | $TEE {log}"


rule precision_plots:
    input:
        **PRECISION_OUTPUTS,
        code=code_stamp("precision_analysis", "cs336_systems.stages.precision.analysis"),
    output:
        PRECISION_FIGURES,
        vector_figures("precision", PRECISION_PLOTS),
    log:
        f"{RESULTS}/logs/precision_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input[0]),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.precision.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "precision" in STAGES:
    REPORT_INPUTS["precision"] = [*PRECISION_OUTPUTS.values(), *PRECISION_FIGURES]
