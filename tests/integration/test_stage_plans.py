"""The stages' planning helpers (what the rules call to lay out jobs), on hand-made configs."""

from __future__ import annotations

import yaml

from cs336_systems.stages.attention import plan as attention_plan
from cs336_systems.stages.benchmark import plan as benchmark_plan
from cs336_systems.stages.flash import plan as flash_plan
from cs336_systems.stages.kernel_tests import plan as kernel_tests_plan

BENCH_BLOCK = {
    "sizes": ["small", "xl"],
    "context_lengths": [128, 512],
    "attentions": ["naive", "sdpa"],
    "compile": ["eager", "compiled"],
    "modes": ["forward", "train_step"],
    "precisions": ["fp32", "bf16"],
    "attention_only": {"context_lengths": [512]},
    "compile_only": {"sizes": ["small"], "precisions": ["bf16"]},
    "batch_size": 4,
    "warmup_steps": 1,
    "measure_steps": 2,
}
BENCH = benchmark_plan.BenchmarkKnobs.from_block(BENCH_BLOCK)


def bench(**changes):
    return benchmark_plan.BenchmarkKnobs.from_block({**BENCH_BLOCK, **changes})


def test_benchmark_points_run_later_attentions_only_where_admitted():
    points = benchmark_plan.points(BENCH)
    naive = [p for p in points if p["attention"] == "naive"]
    sdpa = [(p["size"], p["context_length"]) for p in points if p["attention"] == "sdpa"]
    assert len(naive) == 4
    assert sdpa == [("small", 512), ("xl", 512)]


def test_benchmark_compile_only_where_admitted():
    assert benchmark_plan.compile_arg(BENCH, "small", 128) == "eager,compiled"
    assert benchmark_plan.compile_arg(BENCH, "xl", 512) == "eager"
    naive_only = bench(compile_only={"attentions": ["naive"], "context_lengths": [512]})
    assert benchmark_plan.compile_arg(naive_only, "xl", 512, "naive") == "eager,compiled"
    assert benchmark_plan.compile_arg(naive_only, "xl", 512, "sdpa") == "eager"
    assert benchmark_plan.compile_arg(naive_only, "xl", 128, "naive") == "eager"
    assert benchmark_plan.compiled(BENCH, "precisions") == ["bf16"]
    assert benchmark_plan.compiled(BENCH, "modes") == ["forward", "train_step"]


def test_default_configs_plan_without_errors():
    for stage in ("benchmark", "flash", "attention", "kernel_tests"):
        block = yaml.safe_load(open(f"config/stages/{stage}.yaml"))[stage]
        for cfg in block.values():
            if stage == "benchmark":
                assert benchmark_plan.points(benchmark_plan.KNOBS.from_block(cfg))
            elif stage == "flash":
                sweep = flash_plan.SWEEP_KNOBS.from_block(flash_plan.SWEEP_KNOBS.select(cfg))
                assert flash_plan.job_settings("sweep", sweep)["steps"] == cfg["timing"]["steps"]
                files = flash_plan.point_files(flash_plan.KNOBS.from_block(cfg), "results/m")
                assert files[0].startswith("results/m/flash/")
                # the fixed-cost target set is a job of its own where the preset has one
                assert ("results/m/flash/target.csv" in files) == bool(cfg.get("target"))
            elif stage == "attention":
                k = attention_plan.KNOBS.from_block(cfg)
                assert len(attention_plan.point_files(k, "r")) == len(cfg["impls"])
            else:
                knobs = kernel_tests_plan.KernelTestsKnobs.from_block(cfg)
                assert knobs.kernels == cfg["kernels"] and knobs.files == cfg["files"]


def test_flash_gate_only_when_kernel_tests_run():
    assert flash_plan.gate(["flash"], "r") == []
    assert flash_plan.gate(["kernel_tests", "flash"], "r") == ["r/kernel_tests.csv"]
    assert flash_plan.gate_arg("") == ""
    assert flash_plan.gate_arg("r/kernel_tests.csv") == "--kernel-tests r/kernel_tests.csv"
