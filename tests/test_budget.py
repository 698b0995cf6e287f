"""The presets' time budgets (src/cs336_systems/budget.py): every planned job estimated from the
config, summed, and held against the budget (gpu: 25 min on one H100; cpu: 5 min on 2 cores)."""

from __future__ import annotations

import copy

import pytest
from pipeline_utils import ROOT

from cs336_systems import budget
from cs336_systems.stages.benchmark import plan as benchmark_plan

CONFIG = budget.run_config()


@pytest.mark.parametrize("preset", ["gpu", "cpu"], ids=["on_h100", "on_2_cores"])
def test_the_preset_fits_its_budget(preset):
    dev = budget.DEVICES[preset]
    jobs = budget.plan(CONFIG, preset, dev)
    assert budget.check(jobs, dev) == "", budget.markdown(preset, jobs, dev)


def test_the_full_grid_does_not_fit_and_the_verdict_names_the_longest_jobs():
    dev = budget.H100
    jobs = budget.plan(CONFIG, "full", dev)
    why = budget.check(jobs, dev)
    total = sum(j.seconds for j in jobs)
    assert why.startswith(f"estimated {total / 60:.1f} min, above the budget of 25 min")
    longest = max(jobs, key=lambda j: j.seconds)
    assert f"{longest.stage} {longest.job} {longest.seconds:.0f} s" in why


def test_one_job_per_planned_job_and_the_sum():
    """As many benchmark estimates as the rules plan jobs (points and warm-up sizes), and a
    longer grid costs more."""
    cfg = CONFIG["benchmark"]["gpu"]
    jobs = [j for j in budget.plan(CONFIG, "gpu", budget.H100) if j.stage == "benchmark"]
    assert len(jobs) == len(benchmark_plan.points(cfg)) + len(cfg["warmup_sweep"]["sizes"])
    longer = copy.deepcopy(CONFIG)
    longer["benchmark"]["gpu"]["context_lengths"] = [512, 1024]
    more = [j for j in budget.plan(longer, "gpu", budget.H100) if j.stage == "benchmark"]
    assert len(more) == len(jobs) + len(cfg["sizes"])
    assert sum(j.seconds for j in more) > sum(j.seconds for j in jobs)


def test_the_step_estimate_follows_the_flops_and_the_precision():
    # 2.7B at 512 tokens x 4, a training step: 3 x (2 N tokens + attention) FLOPs
    fp32 = budget.step_s(budget.H100, "2.7B", 512, 4, "train_step", "fp32")
    bf16 = budget.step_s(budget.H100, "2.7B", 512, 4, "train_step", "bf16")
    assert fp32 / bf16 == pytest.approx(700 / 50)
    assert 1.0 < fp32 < 2.5  # ~3.3e13 FLOP at 20 TFLOP/s


def test_a_point_above_max_point_s_costs_nothing():
    """The cpu preset's cost guard: the estimate skips what the stage will skip."""
    cfg = copy.deepcopy(CONFIG)
    block = cfg["benchmark"]["cpu"]
    with_guard = budget._benchmark(block, budget.CPU2)
    block.pop("max_point_s")
    without = budget._benchmark(block, budget.CPU2)
    assert sum(j.seconds for j in without) > sum(j.seconds for j in with_guard)


def test_the_budget_document_is_current():
    """docs/budgets.md is what `python -m cs336_systems.budget --out docs/budgets.md` writes."""
    text, failed = budget.document(["cpu", "gpu", "full"])
    assert not failed
    assert (ROOT / "docs" / "budgets.md").read_text() == text, (
        "docs/budgets.md is stale: run python -m cs336_systems.budget --out docs/budgets.md"
    )
