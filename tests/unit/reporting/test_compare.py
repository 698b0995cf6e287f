"""The comparison report (reporting/compare.py, rule `compare`) from two results folders."""

from __future__ import annotations

import pytest
from fixture_rows import benchmark_rows, ceilings_rows, write_results

from cs336_systems.reporting import compare


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


def test_only_like_is_divided_by_like(tmp_path):
    """Key numbers over the matched points only (not a median over each machine's grid), an
    MFU side by side without a ratio, and no number at all where the grids share no point."""
    cpu = write_results(
        tmp_path / "cpu",
        benchmark=benchmark_rows(sizes=("tiny", "small")),
        ceilings=ceilings_rows(fp32=0.2, bf16=0.0002, autocast=0.4),
    )
    gpu_kw = {"machine": "h100", "device": "NVIDIA H100", "gpus": 1}
    fast = {("small", m, p): t for p in ("fp32", "bf16") for m, t in (
        ("forward", 1.0), ("forward_backward", 3.0), ("train_step", 3.5))}  # fmt: skip
    fast[("xl", "train_step", "fp32")] = 1000.0
    gpu = write_results(
        tmp_path / "h100",
        benchmark=benchmark_rows(ms=fast, sizes=("small", "xl"), machine_kw=gpu_kw),
        ceilings=ceilings_rows(fp32=50.0, bf16=700.0, autocast=600.0, machine_kw=gpu_kw),
    )
    bench = compare.render([cpu, gpu], ["benchmark"]).split("## End-to-end benchmarks")[1]
    tokens = next(line for line in bench.splitlines() if "median training-step tokens/s" in line)
    cells = [c.strip() for c in tokens.strip("|").split("|")]
    # small only (both machines ran it): 4 x 32 tokens in 35 ms against 3.5 ms; xl's 1 s step
    # does not pull the h100's median down
    assert cells[1:] == ["3,657", "36,571", "10.0×"]
    mfu = next(line for line in bench.splitlines() if "best training-step MFU" in line)
    assert "– (each against its own ceiling)" in mfu
    # disjoint grids: nothing divided
    other = write_results(
        tmp_path / "other",
        benchmark=benchmark_rows(sizes=("xl",), machine_kw=gpu_kw),
        ceilings=ceilings_rows(machine_kw=gpu_kw),
    )
    bench = compare.render([cpu, other], ["benchmark"]).split("## End-to-end benchmarks")[1]
    assert "No point in common" in bench and "×" not in bench


def test_excluded_rows_are_not_compared():
    import pandas as pd

    df = pd.DataFrame({"impl": ["flash_triton", "flash_triton", "naive_eager"],
                       "device": ["cpu", "cuda", "cpu"]})  # fmt: skip
    kept = compare._exclude(df, [{"impl": "flash_triton", "device": "cpu"}])
    assert list(zip(kept["impl"], kept["device"], strict=True)) == [
        ("flash_triton", "cuda"), ("naive_eager", "cpu")
    ]  # fmt: skip
    best = pd.DataFrame({"best": [True, False], "x": [1, 2]})
    assert list(compare._only(best, {"best": True})["x"]) == [1]
    assert len(compare._only(best.drop(columns="best"), {"best": True})) == 2


def test_a_ceiling_headline_divides_one_path_by_the_same_path(tmp_path):
    """A CPU whose best bf16 path is autocast F.linear and a GPU whose best is the plain matmul:
    each path is its own row (the comparison once divided 744 by 0.0081, two paths)."""
    cpu = write_results(
        tmp_path / "cpu", ceilings=ceilings_rows(fp32=0.2, bf16=0.0002, autocast=0.4)
    )
    gpu_kw = {"machine": "h100", "device": "NVIDIA H100", "gpus": 1}
    gpu = write_results(
        tmp_path / "h100",
        ceilings=ceilings_rows(fp32=50.0, bf16=700.0, autocast=600.0, machine_kw=gpu_kw),
    )
    text = compare.render([cpu, gpu], ["ceilings"])
    rows = {
        cells[0]: cells[1:]
        for line in text.splitlines()
        if line.startswith("| bf16")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows["bf16 matmul TFLOP/s"][-1] == "3,500,000×"
    assert rows["bf16 autocast F.linear TFLOP/s"][-1] == "1,500×"
