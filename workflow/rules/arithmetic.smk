# Stage `arithmetic`: the 2026 communication arithmetic for one SwiGLU FFN, evaluated for the
# handout's B200 and for this machine: the matmul peak from the ceilings stage's CSV and the bus
# bandwidth from the allreduce stage's, where those stages are in the run (a missing one makes
# the measured case's rows `skipped`). One job, pure arithmetic, seconds.

from cs336_systems.stages.arithmetic import plan as arithmetic_plan

ARITHMETIC = stage_config("arithmetic")
ARITHMETIC_INPUTS = arithmetic_plan.inputs(STAGES, RESULTS)


rule arithmetic:
    input:
        **ARITHMETIC_INPUTS,
        code=code_stamp("arithmetic", "cs336_systems.stages.arithmetic"),
    output:
        report_table("arithmetic", f"{RESULTS}/arithmetic.csv"),
    log:
        f"{RESULTS}/logs/arithmetic.log",
    localrule: True
    params:
        block=block_text(ARITHMETIC),
        inputs=arithmetic_plan.input_args(ARITHMETIC_INPUTS),
        common=common_args(),
    shell:
        "$PY -m cs336_systems.stages.arithmetic {params.common} --out {output}"
        " --block {params.block:q} {params.inputs} 2>&1 | $TEE {log}"


if "arithmetic" in STAGES:
    REPORT_INPUTS["arithmetic"] = [rules.arithmetic.output[0]]
