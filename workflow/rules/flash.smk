# Stage `flash`: causal attention implementations (naive eager/compiled, our FlashAttention-2 in
# PyTorch and Triton, SDPA's flash/cuDNN/efficient backends) over length x head dim x dtype,
# plus the leaderboard point. Our kernels run only if the kernel_tests stage passed them.


FLASH_SOURCES = code("cs336_systems.stages.flash")


rule flash:
    input:
        code=FLASH_SOURCES,
        gate=flash_gate,
    output:
        f"{RESULTS}/flash/points/{{dtype}}.csv",
    log:
        f"{RESULTS}/logs/flash/{{dtype}}.log",
    benchmark:
        f"{RESULTS}/jobs/flash/{{dtype}}.tsv"
    wildcard_constraints:
        dtype=r"fp32|bf16|fp16",
    params:
        impls=lambda wc: cli_list(stage_config("flash")["impls"]),
        head_dims=lambda wc: cli_list(stage_config("flash")["head_dims"]),
        seq_lens=lambda wc: cli_list(stage_config("flash")["seq_lens"]),
        batch=lambda wc: stage_config("flash")["batch_size"],
        options=flash_options,
        gate=flash_gate_arg,
        common=common_args(),
    shell:
        "python3 -m cs336_systems.stages.flash sweep {params.common} --out {output}"
        " --dtype {wildcards.dtype} --impls {params.impls} --batch-size {params.batch}"
        " --head-dims {params.head_dims} --seq-lens {params.seq_lens} {params.options}"
        " {params.gate} 2>&1 | tee {log}"


rule flash_leaderboard:
    input:
        code=FLASH_SOURCES,
        gate=flash_gate,
    output:
        f"{RESULTS}/flash/leaderboard.csv",
    log:
        f"{RESULTS}/logs/flash/leaderboard.log",
    benchmark:
        f"{RESULTS}/jobs/flash/leaderboard.tsv"
    params:
        board=lambda wc: stage_config("flash")["leaderboard"],
        impls=lambda wc: cli_list(stage_config("flash")["leaderboard"]["impls"]),
        options=flash_options,
        timing=flash_leaderboard_timing,
        gate=flash_gate_arg,
        common=common_args(),
    shell:
        "python3 -m cs336_systems.stages.flash leaderboard {params.common} --out {output}"
        " --impls {params.impls} --dtype {params.board[dtype]}"
        " --batch-size {params.board[batch_size]} --heads {params.board[heads]}"
        " --seq-len {params.board[seq_len]} --head-dim {params.board[head_dim]}"
        " {params.options} {params.timing} {params.gate} 2>&1 | tee {log}"


rule flash_aggregate:
    localrule: True
    input:
        points=flash_point_files,
        code=code("cs336_systems.core.results"),
    output:
        f"{RESULTS}/flash.csv",
    log:
        f"{RESULTS}/logs/flash_aggregate.log",
    shell:
        "python3 -m cs336_systems.core.results --out {output} {input.points} 2>&1 | tee {log}"


rule flash_plots:
    localrule: True
    input:
        csv=rules.flash_aggregate.output[0],
        code=code("cs336_systems.stages.flash.analysis"),
    output:
        [
            f"{REPORT_DIR}/figures/flash_{n}.png"
            for n in ("latency", "tflops", "speedup")
        ],
    log:
        f"{RESULTS}/logs/flash_plots.log",
    params:
        results=lambda wc, input: parent(input.csv),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "python3 -m cs336_systems.stages.flash.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | tee {log}"


if "flash" in STAGES:
    REPORT_INPUTS["flash"] = [
        rules.flash_aggregate.output[0],
        *rules.flash_plots.output,
    ]
