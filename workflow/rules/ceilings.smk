# Stage `ceilings`: the machine's measured matmul peaks and copy bandwidth (MFU's denominator).

CEILINGS = stage_config("ceilings")


rule ceilings:
    input:
        code_stamp("ceilings", "cs336_systems.stages.ceilings"),
    output:
        report_table("ceilings", f"{RESULTS}/ceilings.csv"),
    log:
        f"{RESULTS}/logs/ceilings.log",
    benchmark:
        f"{RESULTS}/jobs/ceilings.tsv"
    resources:
        gpu=gpus(1),
    params:
        block=block_text(CEILINGS),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.ceilings {params.common} --out {output}"
        " --block {params.block:q} 2>&1 | $TEE {log}"


if "ceilings" in STAGES:
    REPORT_INPUTS["ceilings"] = [rules.ceilings.output[0]]
