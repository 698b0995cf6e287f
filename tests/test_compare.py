"""The comparison report (compare.py, rule `compare`) from two results folders."""

from __future__ import annotations

import pytest
from fixture_rows import benchmark_rows, ceilings_rows, write_results

from cs336_systems import compare


def test_comparison_of_two_results_folders(tmp_path):
    cpu = write_results(
        tmp_path / "cpu",
        benchmark=benchmark_rows(sizes=("tiny", "small")),
        ceilings=ceilings_rows(fp32=0.2, bf16=0.0002, autocast=0.4),
    )
    gpu_kw = {"machine": "h100", "device": "NVIDIA H100", "gpus": 1}
    fast = {("small", m, p): t for p in ("fp32", "bf16") for m, t in (
        ("forward", 1.0), ("forward_backward", 3.0), ("train_step", 3.5))}  # fmt: skip
    gpu = write_results(
        tmp_path / "h100",
        benchmark=benchmark_rows(ms=fast, sizes=("small", "xl"), machine_kw=gpu_kw),
        ceilings=ceilings_rows(fp32=50.0, bf16=700.0, autocast=600.0, machine_kw=gpu_kw),
    )
    text = compare.render([cpu, gpu], ["ceilings", "benchmark"])
    assert "# Machines side by side: fixture-cpu vs h100" in text
    assert "NVIDIA H100 (1 GPU)" in text and "Fixture CPU (CPU only)" in text
    ceilings = text.split("## Machine ceilings")[1].split("## End-to-end")[0]
    row = next(line for line in ceilings.splitlines() if line.startswith("| fp32 matmul"))
    assert [c.strip() for c in row.strip("|").split("|")][1:] == ["0.200", "50.0", "250×"]
    bench = text.split("## End-to-end benchmarks")[1]
    # the points both measured (small), with the ratio of times; tiny and xl are one-sided
    assert "small" in bench and "0.100×" in bench
    assert "fixture-cpu 6, h100 6" in bench


def test_compare_cli_needs_two_folders(tmp_path):
    with pytest.raises(SystemExit):
        compare.main(["--out", str(tmp_path / "c.md"), str(tmp_path)])
