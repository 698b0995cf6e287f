"""The kernel_tests, attention and flash stages: their CLIs on tiny grids, the gating of our
kernels by the kernel tests, OOM rows, the analyses and the report sections they feed."""

from __future__ import annotations

import json
import math
import os
import textwrap

import pandas as pd
import pytest
import torch
from pipeline_utils import ROOT, block, kernel_tests_block

from cs336_systems.core import results as kernel_results
from cs336_systems.reporting import report
from cs336_systems.stages.attention import analysis as attention_analysis
from cs336_systems.stages.attention import measure as attention_benchmark
from cs336_systems.stages.flash import analysis as flash_analysis
from cs336_systems.stages.flash import jobs as flash_jobs
from cs336_systems.stages.flash import measure as flash_benchmark
from cs336_systems.stages.flash import plan as flash_plan
from cs336_systems.stages.flash import rows as flash_rows
from cs336_systems.stages.kernel_tests import analysis as kernel_tests_analysis
from cs336_systems.stages.kernel_tests import measure as kernel_tests_stage

COMMON = ["--machine", "test-machine", "--preset", "cpu"]


def flash_sweep(out, impls, seq_lens, *extra, steps=1, **changes) -> list[str]:
    """The flash stage's fp32 sweep job: the cpu preset's part of the block at head dim 16, no
    warm-up and `steps` timed steps, with `changes`."""
    timing = {**json.loads(block("flash")[1])["timing"], "warmup_steps": 0, "steps": steps}
    knobs = block("flash", part=flash_plan.SWEEP_KNOBS, impls=impls, head_dims=[16],
                  seq_lens=seq_lens, timing=timing, **changes)  # fmt: skip
    return ["sweep", *COMMON, "--dtype", "fp32", *knobs, "--out", str(out), *extra]


SYNTHETIC_TESTS = textwrap.dedent(
    """
    import pytest

    def test_pytorch_ok():
        assert True

    def test_triton_ok():
        assert True

    def test_triton_broken():
        assert 1 == 2, "wrong answer"

    @pytest.mark.skip(reason="not here")
    def test_triton_skipped():
        pass

    def test_unrelated():
        pass
    """
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results folder as the three stages write it, from their CLIs on tiny grids."""
    out = tmp_path_factory.mktemp("results")
    tests_dir = tmp_path_factory.mktemp("synthetic")
    test_file = tests_dir / "test_synthetic.py"
    test_file.write_text(SYNTHETIC_TESTS)
    kernel_tests_stage.main(
        [
            *COMMON,
            "--files",
            str(test_file),
            *kernel_tests_block(),
            "--junit",
            str(out / "kernel_tests" / "junit.xml"),
            "--out",
            str(out / "kernel_tests.csv"),
        ]
    )
    for impl in ("naive_eager",):
        attention_benchmark.main(
            [
                *COMMON,
                "--impl",
                impl,
                *block(
                    "attention",
                    batch_size=2,
                    head_dims=[16],
                    seq_lens=[16, 32],
                    warmup_steps=1,
                    fwd_steps=2,
                    bwd_steps=2,
                ),  # fmt: skip
                "--out",
                str(out / "attention" / f"{impl}.csv"),
            ]
        )
    att = pd.read_csv(out / "attention" / "naive_eager.csv")
    # the aggregate's timings pinned: two steps of a tiny point on a loaded 2-core machine can
    # differ enough for std_above_mean to flag both points, and this fixture is about the
    # analysis, not the CPU's noise (CI once had no trusted pair left for the compile summary)
    for phase, ms in (("fwd", 1.0), ("bwd", 2.0)):
        for stat in ("mean", "median", "min", "max"):
            att[f"{phase}_ms_{stat}"] = ms
        att[f"{phase}_ms_std"] = 0.0
    # a compiled twin (timings halved) and an OOM point, as a GPU run would have them
    twin = att.assign(impl="naive_compiled", compile="compiled")
    twin[["fwd_ms_mean", "bwd_ms_mean"]] /= 2
    oom = att.iloc[[-1]].assign(
        seq_len=64, status="oom", oom_phase="backward", bwd_ms_mean=math.nan
    )
    pd.concat([att, twin, oom]).to_csv(out / "attention.csv", index=False)

    flash_benchmark.main(
        flash_sweep(out / "flash" / "fp32.csv", ["naive_eager", "flash_pytorch", "flash_triton"],
                    [16, 32], "--kernel-tests", str(out / "kernel_tests.csv"),
                    max_seq_len={"flash_triton": 16})
    )  # fmt: skip
    return out


def test_kernel_tests_rows_and_verdicts(results):
    df = pd.read_csv(results / "kernel_tests.csv")
    by_name = df.set_index("name")
    assert by_name.loc["test_pytorch_ok", "outcome"] == "passed"
    assert by_name.loc["test_triton_broken", "outcome"] == "failed"
    assert "wrong answer" in by_name.loc["test_triton_broken", "message"]
    assert by_name.loc["test_triton_skipped", "status"].startswith("skipped: not here")
    assert by_name.loc["test_unrelated", "kernel"] == "other"
    assert by_name.loc["test_pytorch_ok", "status"] == "ok"
    for col in [
        "machine",
        "device_name",
        "torch",
        "triton",
        "git_commit",
        "timestamp",
        "duration_ms",
    ]:
        assert col in df
    assert (results / "kernel_tests" / "junit.xml").exists()
    assert kernel_results.verdicts(results / "kernel_tests.csv") == {
        "flash_pytorch": "passed",
        "flash_triton": "failed",
    }


def test_kernel_tests_in_xdist_workers_give_the_same_rows(results, tmp_path):
    """Two pytest-xdist workers: the same tests, outcomes and verdicts as one process."""
    test_file = tmp_path / "test_synthetic.py"
    test_file.write_text(SYNTHETIC_TESTS)
    out = tmp_path / "kt.csv"
    kernel_tests_stage.main(
        [*COMMON, "--files", str(test_file), *kernel_tests_block(workers=2),
         "--junit", str(tmp_path / "j.xml"), "--out", str(out)]
    )  # fmt: skip
    df, one = pd.read_csv(out), pd.read_csv(results / "kernel_tests.csv")
    assert set(df["pytest_workers"]) == {2} and set(one["pytest_workers"]) == {1}
    cols = ["name", "outcome", "kernel", "status"]
    assert (
        df[cols].sort_values("name").values.tolist()
        == one[cols].sort_values("name").values.tolist()
    )
    assert kernel_results.verdicts(out) == kernel_results.verdicts(results / "kernel_tests.csv")


def test_kernel_tests_worker_count():
    cores = len(os.sched_getaffinity(0))
    assert kernel_tests_stage.worker_count("auto") == min(
        kernel_tests_stage.MAX_AUTO_WORKERS, cores
    )
    assert kernel_tests_stage.worker_count("3") == 3
    assert kernel_tests_stage.xdist_args(1) == []
    assert kernel_tests_stage.xdist_args(4) == ["-n", "4"]


def test_kernel_tests_when_pytest_cannot_collect(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text("import does_not_exist\n")
    out = tmp_path / "kt.csv"
    kernel_tests_stage.main(
        [*COMMON, "--files", str(bad), *kernel_tests_block(kernels={"flash_triton": "^test_"}),
         "--junit", str(tmp_path / "j.xml"), "--out", str(out)]
    )  # fmt: skip
    assert kernel_results.verdicts(out) == {"flash_triton": "failed"}


# installed in every Python process of the stage (sitecustomize): the Gluon dK/dV kernels' module
# raises on import, as it would under a Triton whose Gluon API moved
BROKEN_KERNEL = textwrap.dedent(
    """
    import importlib.abc
    import importlib.util
    import sys

    BROKEN = "cs336_systems.kernels.hopper.backward_dkdv"

    class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            return importlib.util.spec_from_loader(name, self) if name == BROKEN else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise AttributeError("gluon has no attribute 'warpgroup_mma' (a broken kernel)")

    sys.meta_path.insert(0, Broken())
    """
)


def test_kernel_tests_fail_when_a_kernel_module_cannot_import(tmp_path, monkeypatch):
    """A kernel module that fails to import makes the kernel tests error (pytest cannot collect
    them) and the kernel's verdict `failed`: never skips, never a silent fallback."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BROKEN_KERNEL)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "kt.csv"
    kernel_tests_stage.main(
        [*COMMON, "--files", str(ROOT / "tests" / "test_flash_attention.py"),
         *kernel_tests_block(kernels={"flash_triton": "^test_(triton_|hopper_|plan_)"},
                             select="adapters"),
         "--junit", str(tmp_path / "j.xml"), "--out", str(out)]
    )  # fmt: skip
    assert kernel_results.verdicts(out)["flash_triton"] == "failed"
    df = pd.read_csv(out)
    assert set(df["outcome"]) == {"error"}, df[["test", "outcome", "message"]]
    assert df["message"].str.contains("AttributeError").all(), df["message"].tolist()


def test_verdicts_of_missing_csv(tmp_path):
    assert kernel_results.verdicts(tmp_path / "absent.csv") == {}


def test_attention_rows(results):
    df = pd.read_csv(results / "attention" / "naive_eager.csv")
    assert list(df["seq_len"]) == [16, 32] and set(df["status"]) == {"ok"}
    for col in ["fwd_ms_mean", "fwd_ms_std", "fwd_ms_median", "bwd_ms_mean", "bwd_ms_median"]:
        assert (df[col] > 0).all(), col
    row = df.iloc[1]
    assert row["scores_mb"] == pytest.approx(2 * 32 * 32 * 4 / 2**20)
    assert row["expected_before_backward_mb"] == pytest.approx(
        (5 * 2 * 32 * 16 + 2 * 32 * 32) * 4 / 2**20
    )


def test_attention_oom_is_a_row(monkeypatch):
    def out_of_memory(q, k, v, is_causal=False):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")

    row = attention_benchmark.measure_point(
        out_of_memory, 2, 16, 16, False, 1, 2, 2, torch.device("cpu")
    )
    assert row["status"] == "oom" and row["oom_phase"] == "warmup"


def test_flash_gating_caps_and_checks(results):
    df = pd.read_csv(results / "flash" / "fp32.csv").set_index(["impl", "seq_len"])
    # flash_pytorch passed its tests, flash_triton failed them in the synthetic suite
    assert df.loc[("flash_triton", 16), "status"] == "skipped: kernel tests failed"
    assert df.loc[("flash_triton", 32), "status"] == "skipped: kernel tests failed"
    ok = df.loc[["naive_eager", "flash_pytorch"]]
    assert set(ok["status"]) == {"ok"}
    assert (ok["max_abs_err"] < 1e-4).all()
    for prefix in ("fwd", "bwd", "fwd_bwd"):
        assert (ok[f"{prefix}_ms_median"] > 0).all() and (ok[f"{prefix}_tflops"] > 0).all()
    assert set(df["kernel_tests"].dropna()) <= {"passed", "failed"}


def test_a_kernel_no_selected_test_checked_is_not_timed(results, tmp_path):
    """A kernel_tests selection that runs none of a kernel's tests (here `-k pytorch`) leaves
    that kernel unverified: the flash stage writes a `skipped` row for it, saying so, instead
    of timing it; the kernel whose tests passed is timed."""
    test_file = tmp_path / "test_synthetic.py"
    test_file.write_text(SYNTHETIC_TESTS)
    gate = tmp_path / "kernel_tests.csv"
    kernel_tests_stage.main(
        [*COMMON, "--files", str(test_file), *kernel_tests_block(select="pytorch"),
         "--junit", str(tmp_path / "j.xml"), "--out", str(gate)]
    )  # fmt: skip
    assert kernel_results.verdicts(gate) == {"flash_pytorch": "passed"}
    out = tmp_path / "flash.csv"
    flash_benchmark.main(
        flash_sweep(out, ["flash_pytorch", "flash_triton"], [16], "--kernel-tests", str(gate))
    )
    df = pd.read_csv(out).set_index("impl")
    assert df.loc["flash_pytorch", "status"] == "ok"
    assert df.loc["flash_triton", "status"] == (
        "skipped: kernel tests did not check flash_triton (no test of it selected)"
    )
    assert df.loc["flash_triton", "kernel_tests"] == "not selected"
    # every selected test of a kernel skipped: not checked either
    cpu = torch.device("cpu")
    why = flash_jobs.skip_reason("flash_triton", 16, "fp32", cpu, {}, {"flash_triton": "not run"})
    assert why == "skipped: kernel tests did not check flash_triton (every selected test skipped)"
    # without the kernel_tests stage in the run nothing gates; an ungated implementation is timed
    assert flash_jobs.skip_reason("flash_triton", 16, "fp32", cpu, {}, None) == ""
    assert flash_jobs.skip_reason("naive_eager", 16, "fp32", cpu, {}, {}) == ""
    # and the report says why it was not benchmarked
    res = tmp_path / "res"
    res.mkdir()
    pd.read_csv(out).to_csv(res / "flash.csv", index=False)
    ctx = flash_analysis.context(res)
    assert ctx["gated"] == ["our FA2 (Triton)"]
    assert "did not check flash_triton" in ctx["gated_why"]


def test_flash_caps_per_implementation_or_per_dtype():
    """max_seq_len caps an implementation at every dtype ({impl: n}) or at some ({impl: {dtype:
    n}}); the job's block carries both forms, and the skip row names which."""
    caps = {"flash_pytorch": 16384, "flash_triton": {"fp32": 4096}}
    knobs = block("flash", part=flash_plan.SWEEP_KNOBS, max_seq_len=caps)
    args = flash_benchmark.parse_args(["sweep", *COMMON, "--dtype", "fp32", *knobs, "--out", "x"])
    assert flash_jobs.job_of(args).max_seq_len == caps
    assert flash_plan.seq_cap(caps, "flash_triton", "fp32") == 4096
    assert flash_plan.seq_cap(caps, "flash_triton", "bf16") == math.inf
    assert flash_plan.seq_cap(caps, "flash_pytorch", "bf16") == 16384
    cpu = torch.device("cpu")
    why = flash_jobs.skip_reason("flash_triton", 8192, "fp32", cpu, caps, None)
    assert why == "skipped: n above this preset's max_seq_len 4096 for flash_triton in fp32"
    assert flash_jobs.skip_reason("flash_triton", 4096, "fp32", cpu, caps, None) == ""
    assert flash_jobs.skip_reason("flash_triton", 8192, "fp16", cpu, caps, None) == ""
    why = flash_jobs.skip_reason("flash_pytorch", 32768, "fp16", cpu, caps, None)
    assert why == "skipped: n above this preset's max_seq_len 16384 for flash_pytorch"


def test_flash_triton_point_on_cpu(tmp_path):
    """Our Triton kernel through the benchmark (interpreter): checked, timed, tiles recorded."""
    out = tmp_path / "f.csv"
    flash_benchmark.main(flash_sweep(out, ["flash_triton"], [16]))
    row = pd.read_csv(out).iloc[0]
    assert row["status"] == "ok" and row["fwd_bwd_ms_median"] > 0
    assert row["triton_fwd_config"] == "16x16" and row["grid"] == "sweep"


def test_flash_sweep_writes_rows_as_it_goes_and_resumes(tmp_path, monkeypatch):
    """Interrupted after two points, the partial CSV holds their rows; the rerun measures only
    the rest (an error row is measured again), then writes the output and drops the partial."""
    out, partial = tmp_path / "f.csv", tmp_path / "partial.csv"
    argv = flash_sweep(out, ["naive_eager", "flash_pytorch"], [16, 32], "--partial", str(partial))
    real = flash_benchmark.measure
    measured, first_run = [], [True]

    def interrupted(impl, *args, **kwargs):
        if first_run[0] and len(measured) == 3:
            raise KeyboardInterrupt  # the job is stopped in its fourth point
        measured.append((impl, args[3]))
        if first_run[0] and len(measured) == 2:
            return {"status": "error: injected"}
        return real(impl, *args, **kwargs)

    monkeypatch.setattr(flash_benchmark, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        flash_benchmark.main(argv)
    assert not out.exists()
    first = pd.read_csv(partial)
    assert list(first["status"]) == ["ok", "error: injected", "ok"]
    assert list(zip(first["impl"], first["seq_len"])) == measured

    measured.clear()
    first_run[0] = False
    flash_benchmark.main(argv)
    # the two ok rows were kept, the error row and the fourth point measured
    assert measured == [("flash_pytorch", 16), ("flash_pytorch", 32)]
    df = pd.read_csv(out)
    assert list(zip(df["impl"], df["seq_len"])) == [
        ("naive_eager", 16), ("flash_pytorch", 16), ("naive_eager", 32), ("flash_pytorch", 32)
    ]  # fmt: skip
    assert set(df["status"]) == {"ok"}
    kept = df[df["impl"] == "naive_eager"].reset_index(drop=True)
    assert (
        kept["fwd_bwd_ms_median"].tolist()
        == first.loc[first["impl"] == "naive_eager", "fwd_bwd_ms_median"].tolist()
    )
    assert not partial.exists()


def test_flash_resume_ignores_rows_timed_differently(tmp_path, monkeypatch):
    """A partial row of another timing (or commit, kernel verdict, ...) is not reused."""
    out, partial = tmp_path / "f.csv", tmp_path / "partial.csv"
    argv = ["--partial", str(partial)]
    flash_benchmark.main(flash_sweep(out, ["naive_eager"], [16], *argv, steps=1))
    pd.read_csv(out).to_csv(partial, index=False)  # as if interrupted before the final write
    assert len(flash_jobs.finished_rows(partial)) == 1
    real, calls = flash_benchmark.measure, []
    monkeypatch.setattr(
        flash_benchmark, "measure", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )
    flash_benchmark.main(flash_sweep(out, ["naive_eager"], [16], *argv, steps=2))
    assert calls == ["naive_eager"]
    assert pd.read_csv(out)["timing"].str.endswith(" steps=2").all()


def test_flash_reference_is_top_left_causal():
    q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
    ref = flash_benchmark.reference_output(q, k, v, chunk=16)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5)


def test_flash_rejects_unknown_impl(tmp_path):
    with pytest.raises(SystemExit):
        flash_benchmark.main(flash_sweep(tmp_path / "x.csv", ["naive_eager", "mystery"], [16]))


@pytest.fixture(scope="module")
def stage_results(results):
    """The stage CSVs as the aggregate rules write them, plus a leaderboard row."""
    flash = pd.read_csv(results / "flash" / "fp32.csv")
    board = flash[flash["impl"] == "naive_eager"].head(1).assign(grid="leaderboard", heads=16)
    pd.concat([flash, board]).to_csv(results / "flash.csv", index=False)
    return results


def test_attention_context_answers_q18_q19(stage_results):
    ctx = attention_analysis.context(stage_results)
    assert ctx["available"] and ctx["statuses"] == {"ok": 4, "oom": 1}
    assert ctx["oom"]["any"] and ctx["oom"]["config"] == "batch 2, d = 16, n = 64"
    assert any("2 x 64² x 4 B" in line for line in ctx["oom"]["lines"])
    assert ctx["compile"]["available"] and "2.00×" in ctx["compile"]["table"]
    assert "grows as n^" in ctx["growth"]


def test_flash_context(stage_results):
    ctx = flash_analysis.context(stage_results)
    assert ctx["available"] and ctx["gated"] == ["our FA2 (Triton)"]
    assert ctx["verdicts"]["our FA2 (Triton)"] == "failed"
    assert "FA2-pt f+b" in ctx["pairs"]["fp32"]
    assert ctx["leaderboard"]["available"] and "16 heads" in ctx["leaderboard"]["config"]
    assert "ours.flash_leaderboard" not in ctx["coverage"]


def test_a_run_without_the_leaderboard_block_says_so_in_the_coverage(results, tmp_path):
    from cs336_systems.reporting import coverage

    flash = pd.read_csv(results / "flash" / "fp32.csv")
    flash.to_csv(tmp_path / "flash.csv", index=False)
    ctx = flash_analysis.context(tmp_path)
    why = ctx["coverage"]["ours.flash_leaderboard"]["why"]
    assert why.endswith("has no `flash.leaderboard` block (config/stages/flash.yaml)")
    for edition, part in (("2026", "ours.flash_leaderboard"), ("2025", "flash_leaderboard")):
        table = coverage.coverage_table(
            edition, report.declared_questions(), {"flash": ctx}, coverage.Machine(0, "cpu")
        )
        table.index = coverage.edition_questions(edition)
        assert table.loc[part, "status"] == "not" and "flash.leaderboard" in table.loc[part, "why"]


def test_kernel_tests_context(stage_results, tmp_path):
    ctx = kernel_tests_analysis.context(stage_results)
    assert ctx["failed_kernels"] == ["flash_triton"] and ctx["counts"]["failed"] == 1
    assert "wrong answer" in ctx["failures"]
    # the CSV keeps the CLI's comma-joined files; the sentence lists them with spaces
    rows = pd.read_csv(stage_results / "kernel_tests.csv").assign(files="a.py,b.py")
    rows.to_csv(tmp_path / "kernel_tests.csv", index=False)
    assert kernel_tests_analysis.context(tmp_path)["files"] == "a.py, b.py"


def test_plots_and_report_sections(stage_results, tmp_path):
    for module in (attention_analysis, flash_analysis, kernel_tests_analysis):
        for path in module.plot(stage_results, tmp_path):
            assert path.exists() and path.stat().st_size > 1000 and path.name.endswith(".png")
            assert path.with_suffix(".pdf").exists(), path  # its vector twin, for a write-up
    text = report.render(stage_results, ["kernel_tests", "attention", "flash"])
    assert "Not benchmarked" in text and "flash_triton" in text
    assert "not benchmarked** (kernel tests failed; see Kernel tests)" in text
    assert "The smallest configuration that ran out of memory is batch 2, d = 16, n = 64" in text
    assert "### Q21. The leaderboard configuration" in text


def test_reports_missing_data(tmp_path):
    text = report.render(tmp_path, ["kernel_tests", "attention", "flash"])
    assert "_The attention stage produced no data._" in text
    assert "_The flash stage produced no data._" in text
    assert "_The kernel_tests stage produced no data._" in text


def _target_rows(ours: dict, cudnn: dict, status: str = "ok") -> pd.DataFrame:
    rows = []
    for impl, times in (("flash_triton", ours), ("sdpa_cudnn", cudnn)):
        for (d, n), ms in times.items():
            rows.append({"grid": "target", "impl": impl, "dtype": "bf16", "batch_size": 1,
                         "heads": 16, "d_head": d, "seq_len": n, "status": status,
                         "fwd_bwd_ms_median": ms})  # fmt: skip
    return pd.DataFrame(rows)


def test_fixed_cost_target_verdicts_follow_each_length_bound():
    """At most cuDNN from n = 4096 on, at most 1.5x at n = 1024; the table and the sentence
    count exactly the points that miss (ratios on both sides of each bound)."""
    ours = {(64, 1024): 0.30, (64, 4096): 0.40, (64, 16384): 4.0, (128, 1024): 0.36,
            (128, 4096): 0.59, (128, 2048): 9.0}  # fmt: skip
    cudnn = {(64, 1024): 0.20, (64, 4096): 0.39, (64, 16384): 4.2, (128, 1024): 0.25,
             (128, 4096): 0.60, (128, 2048): 1.0}  # fmt: skip
    got = flash_analysis.fixed_cost(_target_rows(ours, cudnn))
    assert got["available"] and "16 heads" in got["config"]
    # 1.50 at 1024 is within its bound; 1.44 too; 4096: 1.03 misses, 0.98 holds; 2048 has none
    assert got["sentences"] == ["The target holds at 4 of 5 points; not at d=64 n=4096 (1.03×)."]
    assert got["table"].count("not met") == 1 and got["table"].count("| met") == 4
    assert flash_rows.target_bound(2048) is None


def test_fixed_cost_without_cudnn_rows_says_why():
    rows = _target_rows({(64, 1024): 0.3}, {(64, 1024): float("nan")}, status="ok")
    rows.loc[rows["impl"] == "sdpa_cudnn", "status"] = "error: no cuDNN attention"
    got = flash_analysis.fixed_cost(rows)
    assert got["table"] == ""
    assert got["sentences"] == [
        "No comparison: no successful points of SDPA cuDNN (error: no cuDNN attention)."
    ]
    assert flash_analysis.fixed_cost(rows.assign(grid="sweep")) == {"available": False}


def test_fixed_cost_judges_on_the_paired_rounds_median_ratio():
    """With paired rounds the verdict is the median of the rounds' ratios, not the single
    windows' ratio: a host drift that made one window slow does not fail a point; the table
    shows both, and a point whose rounds do not pair is judged on its single windows."""
    ours = {(32, 1024): 0.36, (32, 4096): 0.40, (64, 4096): 0.40}
    cudnn = {(32, 1024): 0.22, (32, 4096): 0.41, (64, 4096): 0.38}
    rows = _target_rows(ours, cudnn)
    rounds = {
        ("flash_triton", 32, 1024): "0.3 0.2 0.36",  # ratios 1.2, 1.0, 1.8: median 1.2
        ("sdpa_cudnn", 32, 1024): "0.25 0.2 0.2",
        ("flash_triton", 32, 4096): "0.5 0.42 0.44",  # ratios 1.25, 1.05, 1.1: median 1.1
        ("sdpa_cudnn", 32, 4096): "0.4 0.4 0.4",
        ("flash_triton", 64, 4096): "0.4 0.4",  # two rounds against three: not paired
        ("sdpa_cudnn", 64, 4096): "0.4 0.4 0.4",
    }
    rows["fwd_bwd_rounds_ms"] = [
        rounds[k] for k in zip(rows["impl"], rows["d_head"], rows["seq_len"])
    ]
    got = flash_analysis.fixed_cost(rows)
    assert got["sentences"][0] == (
        "The target holds at 1 of 3 points; not at d=32 n=4096 (1.10×), d=64 n=4096 (1.05×)."
    )
    assert "median of 3 rounds" in got["sentences"][1]
    cells = {
        tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
        for line in got["table"].splitlines()[2:]
    }
    # the rounds' medians as times, the median ratio, the rounds' span, the single windows' 1.64
    assert cells[("32", "1024")] == ["0.300", "0.200", "1.20", "1.00-1.80", "1.64", "<= 1.5", "met"]
    assert cells[("64", "4096")] == ["0.400", "0.380", "1.05", "", "1.05", "<= 1", "not met"]
    assert "(1 of 3 points without paired rounds, judged on those)." in got["sentences"][1]
    # without rounds the table has no rounds columns
    assert (
        "rounds" not in flash_analysis.fixed_cost(rows.drop(columns=["fwd_bwd_rounds_ms"]))["table"]
    )


def test_paired_rounds_alternate_the_order_and_record_each_round():
    from cs336_systems.stages.flash import rounds

    calls = []

    def fake_timer(fn, prefix, grads):
        fn()  # the call runs: forward, then backward into the leaves
        assert all(g.grad is not None for g in grads)
        calls.append(current[0])
        return {f"{prefix}_ms_median": {"a": 1.0, "b": 2.0}[current[0]] + len(calls) / 100}

    current = ["?"]

    def impl(name):
        def fn(q, k, v):
            current[0] = name
            return (q * k + v).sum(-1, keepdim=True) * q

        return fn

    fns = {"a": impl("a"), "b": impl("b")}
    shape = (1, 2, 8, 4)
    got = rounds.time_rounds(fns, shape, torch.float32, torch.device("cpu"), fake_timer, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert got == {"a": [1.01, 1.04, 1.05], "b": [2.02, 2.03, 2.06]}
    rows = [{"impl": "a", "status": "ok"}, {"impl": "b", "status": "ok"}]
    assert rounds.needs_rounds(rows)
    calls.clear()
    rounds.add_rounds(rows, fns, shape, torch.float32, torch.device("cpu"), fake_timer, 3)
    assert rows[0]["fwd_bwd_rounds_ms"] == "1.01 1.04 1.05" and rows[0]["rounds_status"] == "ok"
    assert rows[1]["fwd_bwd_rounds_ms_median"] == 2.03
    assert rounds.parse_rounds(rows[1]["fwd_bwd_rounds_ms"]) == [2.02, 2.03, 2.06]
    assert rounds.parse_rounds(2.5) == [2.5] and rounds.parse_rounds(float("nan")) == []
    # kept rows that have their rounds, or a point with a failed implementation: no rounds
    assert not rounds.needs_rounds(rows)
    assert not rounds.needs_rounds([{"impl": "a", "status": "ok"}, {"impl": "b", "status": "oom"}])

    def broken(q, k, v):
        raise RuntimeError("no kernel for this shape")

    rows = [{"impl": "a", "status": "ok"}, {"impl": "b", "status": "ok"}]
    rounds.add_rounds(rows, {"a": fns["a"], "b": broken}, shape, torch.float32,
                      torch.device("cpu"), fake_timer, 3)  # fmt: skip
    assert {r["rounds_status"] for r in rows} == {"error: RuntimeError: no kernel for this shape"}
    assert not any("fwd_bwd_rounds_ms" in r for r in rows)


def test_flash_target_grid_rows(tmp_path):
    """The `target` job writes rows named for the target set, with its head count and its own
    do_bench windows; the leaderboard job reads its point (the gpu preset's parts)."""
    out = tmp_path / "t.csv"
    target = {
        "impls": ["naive_eager"],
        "dtype": "fp32",
        "batch_size": 1,
        "heads": 2,
        "head_dims": [16],
        "seq_lens": [16],
        "warmup_ms": 25,
        "rep_ms": 100,
        "rounds": 2,
    }
    timing = {**json.loads(block("flash")[1])["timing"], "warmup_steps": 0, "steps": 1}
    knobs = block("flash", part=flash_plan.TARGET_KNOBS, target=target, timing=timing)
    args = flash_benchmark.parse_args(["target", *COMMON, *knobs, "--out", str(out)])
    job, timer = flash_jobs.job_of(args), flash_jobs.timer_of(args, torch.device("cpu"))
    assert (job.grid, job.dtype, job.heads, timer.warmup_ms, timer.rep_ms) == (
        "target",
        "fp32",
        2,
        25.0,
        100.0,
    )
    flash_benchmark.main(["target", *COMMON, *knobs, "--out", str(out)])
    row = pd.read_csv(out).iloc[0]
    assert row["grid"] == "target" and row["heads"] == 2 and row["status"] == "ok"
    # its paired rounds: two timed forward+backward calls, their median beside them
    assert row["rounds_status"] == "ok" and job.rounds == 2
    each = [float(x) for x in row["fwd_bwd_rounds_ms"].split()]
    assert len(each) == 2 and all(x > 0 for x in each)
    assert row["fwd_bwd_rounds_ms_median"] == pytest.approx(sum(each) / 2, rel=1e-4)
    gpu_target = block("flash", "gpu", part=flash_plan.TARGET_KNOBS)
    gpu_args = flash_benchmark.parse_args(["target", *COMMON, *gpu_target, "--out", "x"])
    assert flash_jobs.job_of(gpu_args).rounds == 5
    board = block("flash", "gpu", part=flash_plan.LEADERBOARD_KNOBS)
    args = flash_benchmark.parse_args(["leaderboard", *COMMON, *board, "--out", "x"])
    job, timer = flash_jobs.job_of(args), flash_jobs.timer_of(args, torch.device("cpu"))
    assert (job.impls, job.dtype, job.heads) == (
        ["flash_triton", "sdpa_flash", "sdpa_cudnn"],
        "bf16",
        16,
    )
    assert (job.head_dims, job.seq_lens, job.grid) == ([64], [16384], "leaderboard")
    assert (timer.warmup_ms, timer.rep_ms, timer.steps, job.flash_tiles) == (
        250.0,
        1000.0,
        3,
        (64, 64),
    )
    # a sweep's job reads the sweep's part: its dtypes and the other jobs' blocks are not in it
    sweep = flash_jobs.job_of(flash_benchmark.parse_args(flash_sweep("x", ["naive_eager"], [16])))
    assert (sweep.heads, sweep.batch_size, sweep.grid, sweep.flash_tiles) == (
        1,
        1,
        "sweep",
        (32, 32),
    )
    with pytest.raises(SystemExit):
        flash_benchmark.parse_args(
            ["sweep", *COMMON, "--dtype", "fp32", *block("flash"), "--out", "x"]
        )


def test_interpreter_times_give_no_speed_up(results, tmp_path):
    """Our Triton kernel's times on a CPU are Triton's interpreter's: Q20 gives no speed-up of
    it, no host-overhead reading and no speed-up column; the same rows from a GPU give them."""
    flash = pd.read_csv(results / "flash" / "fp32.csv")
    # steady, consistent times (forward 1 ms, backward 2, both 3, no spread): measured ones on a
    # loaded host can fail a sanity check, and a flagged point is left out of the speed-ups
    for prefix, ms in (("fwd", 1.0), ("bwd", 2.0), ("fwd_bwd", 3.0)):
        for stat in [c for c in flash.columns if c.startswith(f"{prefix}_ms_")]:
            flash[stat] = 0.0 if stat.endswith("_std") else ms
    ours = flash[flash["impl"] == "flash_pytorch"].assign(impl="flash_triton")
    timed = [c for c in flash.columns if "_ms_" in c]
    ours[timed] *= 300
    ours[[c for c in flash.columns if c.endswith("_tflops")]] /= 300
    flash = pd.concat([flash[flash["impl"] != "flash_triton"], ours])
    assert (flash["device"] == "cpu").all()
    flash.to_csv(tmp_path / "flash.csv", index=False)
    ctx = flash_analysis.context(tmp_path)
    assert ctx["interpreter"] and ctx["speedups"] == [] and ctx["host_note"] == ""
    assert "speedup f+b" not in ctx["pairs"]["fp32"]
    flash.assign(device="cuda").to_csv(tmp_path / "flash.csv", index=False)
    ctx = flash_analysis.context(tmp_path)
    assert not ctx["interpreter"] and "300.00× slower" in " ".join(ctx["speedups"])
    assert "speedup f+b" in ctx["pairs"]["fp32"]
