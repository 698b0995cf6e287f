# Stage `memory`: CUDA memory snapshots of one step (timeline PNGs, largest allocations), peak
# memory with a breakdown, the analytic activation model; RSS on a CPU. One job per model size.

MEMORY = stage_config("memory")
MEMORY_POINTS = f"{RESULTS}/memory/{{size}}.csv"
MEMORY_ALLOCATIONS = f"{RESULTS}/memory/{{size}}.allocations.csv"
MEMORY_BLOCKS = f"{RESULTS}/memory/{{size}}.blocks.csv"
MEMORY_CHECKPOINT = MEMORY.get(
    "checkpoint", {"contexts": [], "modes": [], "strategy": "best"}
)
MEMORY_SOURCES = code_stamp("memory", "cs336_systems.stages.memory")
MEMORY_PLOTS = ["peak", "activations", "timelines"]
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
        contexts=cli_list(MEMORY["context_lengths"]),
        modes=cli_list(MEMORY["modes"]),
        precisions=cli_list(MEMORY["precisions"]),
        batch=MEMORY["batch_size"],
        warmup=MEMORY["warmup_steps"],
        max_entries=MEMORY.get("max_entries", 200000),
        keep_raw=config["keep_raw"],
        ck_contexts=cli_list(MEMORY_CHECKPOINT["contexts"]),
        ck_modes=cli_list(MEMORY_CHECKPOINT["modes"]),
        ck_strategy=MEMORY_CHECKPOINT["strategy"],
        skip_factor=MEMORY.get("skip_factor", 1.5),
        nsys_contexts=cli_list(MEMORY.get("nsys_contexts", [])),
        nsys=MEMORY.get("nsys", ""),
        raw=f"{RESULTS}/memory/raw",
        timelines=f"{RESULTS}/memory/timelines",
        common=common_args(),
    shell:
        "python3 -m cs336_systems.core.gpus {resources.gpu}"
        " python3 -m cs336_systems.stages.memory run {params.common} --size {wildcards.size}"
        " --contexts {params.contexts} --modes {params.modes} --precisions {params.precisions}"
        " --batch-size {params.batch} --warmup {params.warmup}"
        " --max-entries {params.max_entries} --raw-dir {params.raw}"
        " --timeline-dir {params.timelines} --keep-raw {params.keep_raw}"
        " --checkpoint-contexts={params.ck_contexts} --checkpoint-modes={params.ck_modes}"
        " --checkpoint {params.ck_strategy} --skip-factor {params.skip_factor}"
        " --nsys-contexts={params.nsys_contexts} --nsys={params.nsys:q}"
        " --out {output.points} --allocations-out {output.allocations}"
        " --blocks-out {output.blocks} 2>&1 | tee {log}"


rule memory_aggregate:
    input:
        points=expand(MEMORY_POINTS, size=MEMORY["sizes"]),
        allocations=expand(MEMORY_ALLOCATIONS, size=MEMORY["sizes"]),
        blocks=expand(MEMORY_BLOCKS, size=MEMORY["sizes"]),
        code=code_stamp("results", "cs336_systems.core.results"),
    output:
        points=report_table("memory", f"{RESULTS}/memory.csv"),
        allocations=report_table("memory", f"{RESULTS}/memory_allocations.csv"),
        blocks=report_table("memory", f"{RESULTS}/memory_blocks.csv"),
    log:
        f"{RESULTS}/logs/memory_aggregate.log",
    localrule: True
    shell:
        "(python3 -m cs336_systems.core.results --out {output.points} {input.points}"
        " && python3 -m cs336_systems.core.results --out {output.allocations} {input.allocations}"
        " && python3 -m cs336_systems.core.results --out {output.blocks} {input.blocks})"
        " 2>&1 | tee {log}"


rule memory_plots:
    input:
        points=str(rules.memory_aggregate.output.points),
        allocations=str(rules.memory_aggregate.output.allocations),
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
        "python3 -m cs336_systems.stages.memory.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | tee {log}"


if "memory" in STAGES:
    REPORT_INPUTS["memory"] = [
        rules.memory_aggregate.output.points,
        rules.memory_aggregate.output.allocations,
        rules.memory_aggregate.output.blocks,
        *MEMORY_FIGURES,
    ]
