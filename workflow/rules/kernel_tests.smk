# Stage `kernel_tests`: the kernels' pytest suites as a pipeline step, first in the chain. Its
# CSV gates the flash benchmarks: a kernel with a failed test is not benchmarked.

from cs336_systems.stages.kernel_tests import plan as kernel_tests_plan


rule kernel_tests:
    input:
        code=lambda wc: code(
            "cs336_systems.stages.kernel_tests",
            files=stage_config("kernel_tests")["files"],
        ),
        tests=lambda wc: stage_config("kernel_tests")["files"] + ["tests/conftest.py"],
    output:
        csv=f"{RESULTS}/kernel_tests.csv",
        junit=f"{RESULTS}/kernel_tests/junit.xml",
    log:
        f"{RESULTS}/logs/kernel_tests.log",
    benchmark:
        f"{RESULTS}/jobs/kernel_tests.tsv"
    params:
        files=lambda wc: cli_list(stage_config("kernel_tests")["files"]),
        kernels=lambda wc: kernel_tests_plan.kernel_args(stage_config("kernel_tests")),
        select=lambda wc: kernel_tests_plan.option(
            stage_config("kernel_tests"), "select"
        ),
        marker=lambda wc: kernel_tests_plan.option(
            stage_config("kernel_tests"), "marker"
        ),
        timeout=lambda wc: stage_config("kernel_tests")["timeout_s"],
        common=common_args(),
    shell:
        "python3 -m cs336_systems.stages.kernel_tests {params.common} --files {params.files}"
        " {params.kernels} --select {params.select} --marker {params.marker}"
        " --timeout {params.timeout} --junit {output.junit} --out {output.csv} 2>&1 | tee {log}"


rule kernel_tests_plots:
    input:
        csv=rules.kernel_tests.output.csv,
        code=code("cs336_systems.stages.kernel_tests.analysis"),
    output:
        f"{REPORT_DIR}/figures/kernel_tests_durations.png",
    log:
        f"{RESULTS}/logs/kernel_tests_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.csv),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "python3 -m cs336_systems.stages.kernel_tests.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | tee {log}"


if "kernel_tests" in STAGES:
    REPORT_INPUTS["kernel_tests"] = [
        rules.kernel_tests.output.csv,
        *rules.kernel_tests_plots.output,
    ]
