"""The presets' time budgets (src/cs336_systems/budget/): every planned job estimated from the
config, summed, and held against the budget (gpu: 27 min on one H100; cpu: 5 min on 2 cores)."""

from __future__ import annotations

import copy

import pytest
from pipeline_utils import ROOT

from cs336_systems import budget
from cs336_systems.budget import measured, tables
from cs336_systems.budget.model import CostModel
from cs336_systems.stages.benchmark import plan as benchmark_plan
from cs336_systems.stages.profile import plan as profile_plan

CONFIG = budget.run_config()
H100 = CostModel(budget.H100)


def benchmark_jobs(block: dict, dev=budget.H100) -> list:
    """The benchmark stage's own estimate of a preset block on `dev`."""
    return benchmark_plan.estimate(benchmark_plan.KNOBS.from_block(block), CostModel(dev))


@pytest.mark.parametrize(
    "preset",
    [pytest.param("gpu"), pytest.param("cpu")],
    ids=["on_h100", "on_2_cores"],
)
def test_the_preset_fits_its_budget(preset):
    dev = budget.DEVICES[preset]
    jobs = budget.plan(CONFIG, preset, dev)
    assert budget.check(jobs, dev) == "", tables.markdown(preset, jobs, dev)


def test_the_gpu_preset_runs_the_handouts_protocol_and_grids():
    """5 warm-up and 10 measured steps, 100 attention passes (both handouts); 2025's profiling
    grid (every size at 128-1024) and memory grid (2.7B at 128-512), within the budget."""
    from cs336_systems.reporting.questions import PROTOCOL

    for stage, keys in PROTOCOL.items():
        for edition in (2025, 2026):
            block = budget.run_config(edition=edition)[stage]["gpu"]
            assert {k: block[k] for k in keys} == keys, (stage, edition)
    cfg = budget.run_config(edition=2025)
    assert cfg["profile"]["gpu"]["sizes"] == ["small", "medium", "large", "xl", "2.7B"]
    assert cfg["profile"]["gpu"]["context_lengths"] == [128, 256, 512, 1024]
    assert cfg["memory"]["gpu"]["context_lengths"] == [128, 256, 512]
    assert cfg["memory"]["gpu"]["sizes"] == ["2.7B"]
    jobs = budget.plan(cfg, "gpu", budget.H100, budget.EDITION_STAGES)
    assert {j.stage for j in jobs} == {*budget.EDITION_STAGES, "(local)"}
    assert budget.check(jobs, budget.H100) == ""
    profiles = [j for j in jobs if j.stage == "profile"]
    assert len(profiles) == 5 and all(j.how == "12 captures" for j in profiles)


def test_a_reference_run_is_estimated_under_the_step_counts_it_recorded(tmp_path):
    """The calibration compares a job log with the estimate of what that run ran: its rows'
    step counts replace the config's (the H100 reference: 2 warm-up, 6 measured steps)."""
    from cs336_systems.budget.measured import as_run

    (tmp_path / "benchmark.csv").write_text("warmup_steps,measure_steps\n2,6\n2,6\n")
    (tmp_path / "attention.csv").write_text("warmup_steps,fwd_steps,bwd_steps\n3,30,30\n")
    ran = as_run(CONFIG, "gpu", tmp_path)
    assert (
        ran["benchmark"]["gpu"]["measure_steps"] == 6 and ran["attention"]["gpu"]["fwd_steps"] == 30
    )
    assert CONFIG["benchmark"]["gpu"]["measure_steps"] == 10  # the config itself is untouched
    now = sum(j.seconds for j in budget.plan(CONFIG, "gpu", budget.H100))
    then = sum(j.seconds for j in budget.plan(ran, "gpu", budget.H100))
    assert then < now
    assert as_run(CONFIG, "gpu", tmp_path / "absent") == CONFIG


def test_the_full_grid_does_not_fit_and_the_verdict_names_the_longest_jobs():
    dev = budget.H100
    jobs = budget.plan(CONFIG, "full", dev)
    why = budget.check(jobs, dev)
    total = budget.wall_seconds(jobs)
    assert why.startswith(f"estimated {total / 60:.1f} min, above the budget of 27 min")
    longest = max(jobs, key=lambda j: j.seconds)
    assert f"{longest.stage} {longest.job} {longest.seconds:.0f} s" in why


def test_one_job_per_planned_job_and_the_sum():
    """As many benchmark estimates as the rules plan jobs (points and warm-up sizes), and a
    longer grid costs more."""
    cfg = CONFIG["benchmark"]["gpu"]
    jobs = [j for j in budget.plan(CONFIG, "gpu", budget.H100) if j.stage == "benchmark"]
    k = benchmark_plan.KNOBS.from_block(cfg)
    assert len(jobs) == len(benchmark_plan.points(k)) + len(cfg["warmup_sweep"]["sizes"])
    longer = copy.deepcopy(CONFIG)
    longer["benchmark"]["gpu"]["context_lengths"] = [512, 1024]
    more = [j for j in budget.plan(longer, "gpu", budget.H100) if j.stage == "benchmark"]
    assert len(more) == len(jobs) + len(cfg["sizes"])
    assert sum(j.seconds for j in more) > sum(j.seconds for j in jobs)


def test_the_step_estimate_follows_the_flops_precision_and_edition():
    # xl (2026: 2560/10240/32) at 512 tokens x 4, a training step: 3 x (2 N tokens + attention)
    fp32 = H100.step_s("xl", 512, 4, "train_step", "fp32")
    bf16 = H100.step_s("xl", 512, 4, "train_step", "bf16")
    assert fp32 / bf16 == pytest.approx(budget.H100.tflops["bf16"] / budget.H100.tflops["fp32"])
    assert 0.8 < fp32 < 1.3  # ~4.3e13 FLOP at 42 TFLOP/s; measured on an H100: 1030 ms
    assert 0.17 < bf16 < 0.26  # measured 217 ms
    # small is launch-bound: its bf16 forward costs what its fp32 one does (measured 25, 29 ms)
    small = [H100.step_s("small", 512, 4, "forward", p) for p in ("fp32", "bf16")]
    assert small[0] == small[1] == pytest.approx(12 * budget.H100.launch_s_per_layer)
    # 2025's 2.7B is 2026's xl; 2025's xl (1600/6400/48) costs about 60% of it
    y2025 = CostModel(budget.H100, 2025)
    assert y2025.step_s("2.7B", 512, 4, "train_step", "fp32") == fp32
    assert y2025.step_s("xl", 512, 4, "train_step", "fp32") < 0.7 * fp32


def test_the_probe_is_the_largest_context_the_memory_model_fits():
    """The profile probe's assumed result: the last doubling whose step fits 79 GiB (the next
    one does not), and the grid of `count` contexts ending there."""
    cfg = CONFIG["profile"]["gpu"]
    k = profile_plan.KNOBS.from_block(cfg)
    mode, prec, batch = cfg["probe"]["mode"], cfg["precision"], cfg["batch_size"]
    jobs = {j.job: j for j in budget.plan(CONFIG, "gpu", budget.H100) if j.stage == "profile"}
    for size in cfg["sizes"]:
        largest, tried = profile_plan.probe_largest(k, H100, size)
        assert H100.step_gib(size, largest, batch, mode, prec) <= 79
        assert H100.step_gib(size, 2 * largest, batch, mode, prec) > 79
        # the tries: every fitting context and the first that does not (an `oom` row)
        assert largest == cfg["probe"]["start"] << (tried - 2)
        grid = [largest >> 2, largest >> 1, largest]
        assert f"contexts {grid}; {3 * len(cfg['modes'])} captures" in jobs[size].how


def test_engines_and_skipped_sizes():
    """A compiled job's engines (fast, hf_gpt2) each cost a compile; a size whose every point
    the memory model refuses (10B on 80 GB) costs about a process start."""
    cfg = copy.deepcopy(CONFIG["benchmark"]["full"])  # xl compiles there (gpu: small only)
    jobs = {j.job: j for j in benchmark_jobs(cfg)}
    assert "3 compiled graphs, 3 engine rows" in jobs["xl ctx512 naive"].how
    assert jobs["10B ctx512 naive"].seconds == budget.H100.job_start_s
    cfg["engines"] = ["plain"]
    plain = {j.job: j for j in benchmark_jobs(cfg)}
    extra = jobs["xl ctx512 naive"].seconds - plain["xl ctx512 naive"].seconds
    assert extra > H100.compile_s("xl") + 2 * budget.H100.engine_s


def test_the_estimates_are_within_a_quarter_of_the_measured_h100_jobs():
    """The reference run's job log (report/reference/h100-80gb-hbm3/jobs/) against the
    estimates of this config: every planned job logged there (only local rules write no job
    file), each within 25%, their sum within 10%."""
    rows, missing, extra = measured.calibration(copy.deepcopy(CONFIG))
    # arithmetic is a local rule (the leaderboard's ablation job, on one GPU, writes skipped
    # rows at once: a job start)
    assert set(missing) <= {"arithmetic"} and extra == []
    assert {s for s, *_ in rows} >= {"kernel_tests", "benchmark", "memory", "attention", "flash"}
    off = [(s, j, m, round(e)) for s, j, m, e in rows if not 0.75 <= e / m <= 1.25]
    assert not off, off
    m, e = sum(r[2] for r in rows), sum(r[3] for r in rows)
    assert 0.9 <= e / m <= 1.1, (m, e)


def test_the_cpu_estimates_follow_the_cpu_reference_run():
    """The calibration run's job log (docs/measurements/budget-cpu-34787cd/jobs/): two jobs at
    once on two cores, so each job within a factor of 2 (its neighbour shares the cores), the
    sum within 15%."""
    rows, missing, extra = measured.calibration(
        copy.deepcopy(CONFIG), "cpu", measured.CPU2_FITTED, jobs_dir=measured.CPU_JOBS
    )
    assert set(missing) <= {"arithmetic", "leaderboard/ablation"} and extra == []
    assert len(rows) > 15
    off = [(s, j, m, round(e)) for s, j, m, e in rows if not 0.5 <= e / m <= 2]
    assert not off, off
    m, e = sum(r[2] for r in rows), sum(r[3] for r in rows)
    assert 0.85 <= e / m <= 1.15, (m, e)


def test_the_cpu_estimates_of_jobs_alone_follow_the_committed_cpu_reference():
    """The committed cpu reference ran each measuring job alone on the two cores: the estimates
    a run plans with (CPU2, `alone` applied) within 25% of its jobs in sum, each job within a
    factor of 3 (the gloo DDP variants job, one world in the model, took 19 s and 24 s in two
    runs an hour apart against 12 estimated); the fitted constants would be further off."""
    rows, _, extra = measured.calibration(
        copy.deepcopy(CONFIG), "cpu", budget.CPU2, jobs_dir=measured.CPU_REFERENCE_JOBS
    )
    assert extra == [] and len(rows) > 15
    off = [(s, j, m, round(e)) for s, j, m, e in rows if not 1 / 3 <= e / m <= 3]
    assert not off, off
    m, e = sum(r[2] for r in rows), sum(r[3] for r in rows)
    assert 0.75 <= e / m <= 1.25, (m, e)
    fitted = measured.calibration(
        copy.deepcopy(CONFIG), "cpu", measured.CPU2_FITTED, jobs_dir=measured.CPU_REFERENCE_JOBS
    )[0]
    assert abs(sum(r[3] for r in fitted) / m - 1) > abs(e / m - 1)


def test_the_calibration_reads_a_job_log(tmp_path):
    """A job log with one job slower, one unknown and one planned job absent: the rows, the
    missing and the extra names say so."""
    times = measured.measured_jobs()
    jobs = tmp_path / "jobs"
    for name, s in times.items():
        if name == "ceilings":
            continue
        f = jobs / f"{name}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"s\th:m:s\n{2 * s if name == 'kernel_tests' else s}\t0:00:01\n")
    (jobs / "ddp" / "extra.tsv").write_text("s\n1.0\n")
    # the run's rows beside its job log: the estimate is of what that run ran
    (tmp_path / "csv").symlink_to(measured.REFERENCE_JOBS.parent / "csv")
    rows, missing, extra = measured.calibration(copy.deepcopy(CONFIG), jobs_dir=jobs)
    assert set(missing) - {"leaderboard/ablation"} == {"ceilings", "arithmetic"}
    assert extra == ["ddp/extra"]
    kt = next(r for r in rows if r[0] == "kernel_tests")
    assert kt[2] == 2 * times["kernel_tests"]
    assert "| **all logged jobs** |" in measured.calibration_markdown(CONFIG, jobs_dir=jobs)


def test_a_point_above_max_point_s_costs_nothing():
    """The cpu preset's cost guard: the estimate skips what the stage will skip. On a CPU
    without bf16 units (the rates the earlier 2-core machine measured: bf16 autocast F.linear
    0.0096 TFLOP/s, its steps 0.0025) small's bf16 points are over max_point_s; with bf16 units
    (CPU2 now) nothing is."""
    import dataclasses

    no_bf16 = dataclasses.replace(
        budget.CPU2,
        tflops={"bf16": 0.0025, "fp32": 0.05},
        peak_tflops={"bf16": 0.0096, "fp32": 0.093},
    )
    cfg = copy.deepcopy(CONFIG)
    block = cfg["benchmark"]["cpu"]
    with_guard = benchmark_jobs(block, no_bf16)
    on_cpu2 = benchmark_jobs(block, budget.CPU2)
    block.pop("max_point_s")
    without = benchmark_jobs(block, no_bf16)
    assert sum(j.seconds for j in without) > sum(j.seconds for j in with_guard)
    assert sum(j.seconds for j in on_cpu2) == sum(
        j.seconds for j in benchmark_jobs(block, budget.CPU2)
    )


def test_the_cost_guard_skips_what_the_cpu_reference_run_skipped():
    """The budget's guard (stages/benchmark/mfu.py too_costly's rule) on the cpu preset's
    plain points, at the rates a cpu run's ceilings measured: skipped exactly where that run
    wrote a `skipped: at least ...` row, in three runs: the committed reference, the cpu run of
    `7c06124` on a host without bf16 units (tests/fixtures/cpu-no-bf16/: its benchmark and
    ceilings CSVs), where small's bf16 points are skipped, and CPU2's calibration run, whose
    rates CPU2's own agree with."""
    import dataclasses

    import pandas as pd

    from cs336_systems.core.costs import matmul_peaks

    cfg = CONFIG["benchmark"]["cpu"]
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    reference = ROOT / "report" / "reference" / "cpu" / "csv"
    skipped = 0
    no_bf16 = ROOT / "tests" / "fixtures" / "cpu-no-bf16"
    runs = ((reference, False), (no_bf16, False), (measured.CPU_JOBS.parent / "csv", True))
    for ref, own_rates in runs:
        rows = pd.read_csv(ref / "benchmark.csv")
        rows = rows[rows["compile"] == "eager"]
        assert len(rows) > 10
        skipped += rows["status"].astype(str).str.startswith("skipped: at least").sum()
        ceil = pd.read_csv(ref / "ceilings.csv")
        rates = {
            "fp32": matmul_peaks(ceil, "matmul")["fp32"],
            "bf16": matmul_peaks(ceil, "autocast_linear")["bf16"],
        }
        dev = dataclasses.replace(budget.CPU2, peak_tflops=rates)
        for device in (dev, budget.CPU2) if own_rates else (dev,):
            for _, r in rows.iterrows():
                predicted = CostModel(device).too_costly(
                    r["size"], int(r["context_length"]), int(r["batch_size"]),
                    r["mode"], r["precision"], steps, cfg["max_point_s"],
                )  # fmt: skip
                assert predicted == str(r["status"]).startswith("skipped: at least"), dict(r)
    assert skipped > 0  # the guard had something to predict


def test_the_budget_document_is_current():
    """docs/budgets.md is what `python -m cs336_systems.budget --out docs/budgets.md` writes."""
    text, _ = tables.document(["cpu", "gpu", "full"])
    assert (ROOT / "docs" / "budgets.md").read_text() == text, (
        "docs/budgets.md is stale: run python -m cs336_systems.budget --out docs/budgets.md"
    )
