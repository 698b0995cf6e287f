# Stage `memory`: CUDA memory snapshots of one step (timeline PNGs, largest allocations), peak
# memory with a breakdown, the analytic activation model; RSS on a CPU. One job per model size.

from cs336_systems.stages.memory import plan as memory_plan

MEMORY = stage_config("memory")
MEMORY_POINTS = f"{RESULTS}/memory/{{size}}.csv"
MEMORY_ALLOCATIONS = f"{RESULTS}/memory/{{size}}.allocations.csv"
MEMORY_BLOCKS = f"{RESULTS}/memory/{{size}}.blocks.csv"
MEMORY_SOURCES = code_stamp("memory", "cs336_systems.stages.memory")
MEMORY_PLOTS = ["peak", "activations", "timelines"]
# part (f)'s Nsight-style timeline of one block (stages/memory/figures.py, from memory_blocks)
MEMORY_PLOTS += ["block_timeline"]
MEMORY_FIGURES = figures("memory", MEMORY_PLOTS)


rule memory:
    input:
        MEMORY_SOURCES,
    output:
        points=MEMORY_POINTS,
        allocations=MEMORY_ALLOCATIONS,
        blocks=MEMORY_BLOCKS,
    log:
        f"{RESULTS}/logs/memory/{{size}}.log",
    benchmark:
        f"{RESULTS}/jobs/memory/{{size}}.tsv"
    resources:
        gpu=gpus(1),
    params:
        # the job's part of the block: every knob but the sweep's sizes
        block=block_text(memory_plan.JOB_KNOBS.select(MEMORY)),
        keep_raw=config["keep_raw"],
        raw=f"{RESULTS}/memory/raw",
        timelines=f"{RESULTS}/memory/timelines",
        common=common_args(),
    shell:
        "$PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.memory run {params.common} --size {wildcards.size}"
        " --block {params.block:q} --raw-dir {params.raw}"
        " --timeline-dir {params.timelines} --keep-raw {params.keep_raw}"
        " --out {output.points} --allocations-out {output.allocations}"
        " --blocks-out {output.blocks} 2>&1 | $TEE {log}"


rule memory_aggregate:
    input:
        points=expand(MEMORY_POINTS, size=MEMORY.sizes),
        allocations=expand(MEMORY_ALLOCATIONS, size=MEMORY.sizes),
        blocks=expand(MEMORY_BLOCKS, size=MEMORY.sizes),
        code=code_stamp("aggregate", "cs336_systems.reporting.aggregate"),
    output:
        points=report_table("memory", f"{RESULTS}/memory.csv"),
        allocations=report_table("memory", f"{RESULTS}/memory_allocations.csv"),
        blocks=report_table("memory", f"{RESULTS}/memory_blocks.csv"),
    log:
        f"{RESULTS}/logs/memory_aggregate.log",
    localrule: True
    shell:
        "($PY -m cs336_systems.reporting.aggregate --out {output.points} {input.points}"
        " && $PY -m cs336_systems.reporting.aggregate --out {output.allocations} {input.allocations}"
        " && $PY -m cs336_systems.reporting.aggregate --out {output.blocks} {input.blocks})"
        " 2>&1 | $TEE {log}"


rule memory_plots:
    input:
        points=str(rules.memory_aggregate.output.points),
        allocations=str(rules.memory_aggregate.output.allocations),
        # part (f): the block captures' rows (their timeline files sit under memory/timelines)
        blocks=str(rules.memory_aggregate.output.blocks),
        code=code_stamp("memory_analysis", "cs336_systems.stages.memory.analysis"),
    output:
        MEMORY_FIGURES,
        vector_figures("memory", MEMORY_PLOTS),
    log:
        f"{RESULTS}/logs/memory_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input[0]),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.memory.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "memory" in STAGES:
    REPORT_INPUTS["memory"] = [
        rules.memory_aggregate.output.points,
        rules.memory_aggregate.output.allocations,
        rules.memory_aggregate.output.blocks,
        *MEMORY_FIGURES,
    ]
