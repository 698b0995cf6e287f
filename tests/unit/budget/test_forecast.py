"""The run's forecast (budget/forecast.py): each job's Snakemake priority by its tiers."""

from __future__ import annotations

from cs336_systems.budget import forecast


class Wildcards(dict):
    pass


def value(width, seconds=100.0, gates=False, cards=4):
    p = forecast.priority("r", lambda wc: width, lambda rule, wc: seconds, gates, cards)
    return p(Wildcards())


def test_priority_tiers_every_card_then_gates_then_wide_then_gpu_seconds():
    order = [
        value(4, seconds=30),  # every card: first, while the start frees them all
        value(1, seconds=20, gates=True),  # the ceilings: others wait for it
        value(2, seconds=10),  # two cards, freed together, go to the next wide job
        value(1, seconds=400),  # the longest single-card job
        value(1, seconds=100),
    ]
    assert order == sorted(order, reverse=True) and len(set(order)) == 5
    assert value(1, seconds=100) == 100 and value(2, seconds=100) == 200 + forecast.WIDE_PRIORITY


def test_on_two_cards_a_two_card_job_takes_every_card():
    assert value(2, cards=2) > value(1, gates=True, cards=2) > value(1, cards=2)
    assert value(0, cards=0) == 100  # a CPU job: its seconds


DRY_RUN = """
[Sat Nov 28 16:17:35 2026]
rule leaderboard:
    input: results/m/code/leaderboard.sha256, results/m/ceilings.csv
    output: results/m/leaderboard/runs.csv
    jobid: 41
    priority: 1500234
    threads: 2
    resources: tmpdir=/tmp, gpu=2, gpu_jobs=1, timing=0
[Sat Nov 28 16:17:35 2026]
rule benchmark:
    input: results/m/code/benchmark.sha256, results/m/ceilings.csv
    output: results/m/benchmark/points/xl_ctx512_naive.csv
    jobid: 7
    wildcards: size=xl, ctx=512, attention=naive
    priority: 354
    resources: tmpdir=/tmp, gpu=1, gpu_jobs=1, timing=0
[Sat Nov 28 16:17:35 2026]
rule report:
    input: results/m/leaderboard.csv
    output: report/m/report.md
    jobid: 0
    resources: tmpdir=/tmp
[Sat Nov 28 16:17:35 2026]
rule all:
    input: report/m/report.md
"""


def test_a_dry_runs_jobs_with_their_cards_inputs_and_priorities():
    jobs = forecast.dry_run_jobs(DRY_RUN)
    assert [j["rule"] for j in jobs] == ["leaderboard", "benchmark", "report"]
    lb, bench, report = jobs
    assert (lb["gpus"], lb["priority"], lb["wildcards"]) == (2, 1500234, {})
    assert lb["inputs"][1] == "results/m/ceilings.csv" and not lb["alone"]
    assert bench["wildcards"] == {"size": "xl", "ctx": "512", "attention": "naive"}
    assert (report["gpus"], report["priority"], report["outputs"]) == (0, 0, ["report/m/report.md"])


def test_the_hosts_card_memory_decides_what_the_estimate_skips():
    """The budget's own card (an 80 GB H100) cannot hold the 10B's points: its benchmark job
    is estimated as its skips, seconds; on a host of 141 GB H200s the forward runs, and the
    estimate says so (the 4x H200 run measured that job at 82 s)."""
    from cs336_systems.budget import run_config

    config = run_config()
    assert forecast.device("gpu", 4, 140.4).memory_gib == 140.4
    assert forecast.device("cpu", 0, 140.4).memory_gib is None  # no card: no memory check
    wildcards = {"size": "10B", "ctx": "512", "attention": "naive"}
    h100 = forecast.job_seconds(config, "gpu", 4)("benchmark", wildcards)
    h200 = forecast.job_seconds(config, "gpu", 4, 140.4)("benchmark", wildcards)
    assert h100 < 15 < 40 < h200


def test_a_dry_runs_plan_prices_the_jobs_in_its_editions_grids(tmp_path, capsys):
    """scripts/plan.sh passes the run's `edition=`: the 2025 edition compiles only `small` at
    512, so its xl benchmark job is eager steps, not the 2026 edition's compiled engines."""
    dry = tmp_path / "dry.txt"
    dry.write_text(DRY_RUN)

    def xl_gpu_seconds(*edition: str) -> float:
        forecast.main(["--dry-run", str(dry), "--preset", "gpu", "--cards", "2", *edition])
        line = next(s for s in capsys.readouterr().out.splitlines() if "benchmark:" in s)
        return float(line.split(":")[1])

    assert xl_gpu_seconds("--edition", "2025") < xl_gpu_seconds() / 2
