# Stage `kernel_tests`: the kernels' pytest suites as a pipeline step, first in the chain. Its
# CSV gates the flash benchmarks: a kernel with a failed test is not benchmarked.

from cs336_systems.stages.kernel_tests import plan as kernel_tests_plan

KERNEL_TESTS = stage_config("kernel_tests")
KERNEL_TESTS_CODE = (
    code_stamp(
        "kernel_tests", "cs336_systems.stages.kernel_tests", files=KERNEL_TESTS.files
    )
    if "kernel_tests" in STAGES
    else []
)


rule kernel_tests:
    input:
        # written while the rules are read, where the stage runs (its test files need not
        # exist in a run without it): a stamp written by an input function, after Snakemake
        # listed its folder, reads as missing
        code=KERNEL_TESTS_CODE,
        tests=KERNEL_TESTS.files,
        conftest="tests/conftest.py",
    output:
        csv=report_table("kernel_tests", f"{RESULTS}/kernel_tests.csv"),
        junit=f"{RESULTS}/kernel_tests/junit.xml",
    log:
        f"{RESULTS}/logs/kernel_tests.log",
    benchmark:
        f"{RESULTS}/jobs/kernel_tests.tsv"
    # pytest-xdist workers, each a process on its own core (one thread each, OMP_NUM_THREADS=1)
    threads: kernel_tests_plan.worker_count(KERNEL_TESTS.workers or 1)
    resources:
        gpu=gpus(1),
    params:
        block=block_text(KERNEL_TESTS),
        common=common_args(),
    shell:
        "OMP_NUM_THREADS=1 $PY -m cs336_systems.planning.claim {resources.gpu}"
        " $PY -m cs336_systems.stages.kernel_tests {params.common} --block {params.block:q}"
        " --junit {output.junit} --out {output.csv} 2>&1 | $TEE {log}"


rule kernel_tests_plots:
    input:
        csv=str(rules.kernel_tests.output.csv),
        code=code_stamp(
            "kernel_tests_analysis", "cs336_systems.stages.kernel_tests.analysis"
        ),
    output:
        figures("kernel_tests", ["durations"]),
        vector_figures("kernel_tests", ["durations"]),
    log:
        f"{RESULTS}/logs/kernel_tests_plots.log",
    localrule: True
    params:
        results=lambda wc, input: parent(input.csv),
        figures=lambda wc, output: parent(output[0]),
    shell:
        "$PY -m cs336_systems.stages.kernel_tests.analysis --results {params.results}"
        " --figures {params.figures} 2>&1 | $TEE {log}"


if "kernel_tests" in STAGES:
    REPORT_INPUTS["kernel_tests"] = [
        rules.kernel_tests.output.csv,
        *rules.kernel_tests_plots.output,
    ]
