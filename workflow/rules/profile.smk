# Stage `profile`: which kernels forward, forward+backward and a training step run, per phase,
# under Nsight Systems (where nsys works) or torch.profiler. One job per model size.

from cs336_systems.stages.profile import plan as profile_plan

PROFILE = stage_config("profile")
PROFILE_POINTS = f"{RESULTS}/profile/{{size}}.csv"
PROFILE_KERNELS = f"{RESULTS}/profile/{{size}}.kernels.csv"
PROFILE_PROBE = f"{RESULTS}/profile/{{size}}.probe.csv"
PROFILE_SOURCES = code_stamp("profile", "cs336_systems.stages.profile")
PROFILE_PLOTS = ["kernel_share", "gemm_share", "attention"]
PROFILE_FIGURES = figures("profile", PROFILE_PLOTS)


rule profile:
    input:
        PROFILE_SOURCES,
    output:
        points=PROFILE_POINTS,
        kernels=PROFILE_KERNELS,
        probe=PROFILE_PROBE,
    log:
        f"{RESULTS}/logs/profile/{{size}}.log",
    benchmark:
        f"{RESULTS}/jobs/profile/{{size}}.tsv"
    resources:
        gpu=gpus(1),
    params:
        # `context_lengths: probe`: the job finds the largest context that fits first
        # (stages/profile/probe.py) and writes the probe's rows
        # the job's part of the block: every knob but the sweep's sizes
        block=block_text(profile_plan.JOB_KNOBS.select(PROFILE)),
        keep_raw=config["keep_raw"],
        raw=f"{RESULTS}/profile/raw",
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.profile run {params.common} --size {wildcards.size}"
        " --block {params.block:q} --raw-dir {params.raw} --keep-raw {params.keep_raw}"
        " --probe-out {output.probe} --out {output.points} --kernels-out {output.kernels}"
        " 2>&1 | $TEE {log}"


rule profile_aggregate:
    input:
        points=expand(PROFILE_POINTS, size=PROFILE.sizes),
        kernels=expand(PROFILE_KERNELS, size=PROFILE.sizes),
        probe=expand(PROFILE_PROBE, size=PROFILE.sizes),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        points=report_table("profile", f"{RESULTS}/profile.csv"),
        kernels=report_table("profile", f"{RESULTS}/profile_kernels.csv"),
        probe=report_table("profile", f"{RESULTS}/profile_probe.csv"),
    log:
        f"{RESULTS}/logs/profile_aggregate.log",
    localrule: True
    shell:
        "($PY -m cs336_systems.reporting.aggregate --out {output.points} {input.points}"
        " && $PY -m cs336_systems.reporting.aggregate --out {output.kernels} {input.kernels}"
        " && $PY -m cs336_systems.reporting.aggregate --out {output.probe} {input.probe})"
        " 2>&1 | $TEE {log}"


rule profile_plots:
    input:
        points=str(rules.profile_aggregate.output.points),
        kernels=str(rules.profile_aggregate.output.kernels),
        code=code_stamp("profile_analysis", "cs336_systems.stages.profile.analysis"),
    output:
        PROFILE_FIGURES,
        vector_figures("profile", PROFILE_PLOTS),
    log:
        f"{RESULTS}/logs/profile_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input[0]),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.profile.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "profile" in STAGES:
    REPORT_INPUTS["profile"] = [
        rules.profile_aggregate.output.points,
        rules.profile_aggregate.output.kernels,
        rules.profile_aggregate.output.probe,
        *PROFILE_FIGURES,
    ]
