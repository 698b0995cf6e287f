# Stage `ceilings`: the machine's measured matmul peaks and copy bandwidth (MFU's denominator).

from cs336_systems.stages.ceilings import plan as ceilings_plan

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
        cfg=CEILINGS,
        dtypes=cli_list(CEILINGS["dtypes"]),
        size_of=ceilings_plan.cli_sizes(CEILINGS),
        extra=ceilings_plan.cli_extra(CEILINGS),
        repeats=CEILINGS.get("repeats", 1),
        warm_s=CEILINGS.get("warm_s", 0),
        common=common_args(),
    shell:
        "python3 -m cs336_systems.core.gpus {resources.gpu}"
        " python3 -m cs336_systems.stages.ceilings {params.common} --out {output}"
        " --matmul-size {params.cfg[matmul_size]} --matmul-size-of '{params.size_of}'"
        " --extra-sizes '{params.extra}' --repeats {params.repeats} --warm-s {params.warm_s}"
        " --dtypes {params.dtypes}"
        " --copy-mb {params.cfg[copy_mb]} --reps {params.cfg[reps]} 2>&1 | tee {log}"


if "ceilings" in STAGES:
    REPORT_INPUTS["ceilings"] = [rules.ceilings.output[0]]
