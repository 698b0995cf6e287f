"""The run's plan (planning/schedule.py): jobs placed on the host's cards by priority, a wide
job waiting for its cards, a job timed on the CPU alone, and the wall time the longest card's."""

from __future__ import annotations

from cs336_systems.planning import schedule


def job(name, seconds, gpus=1, priority=0, alone=False, light=False):
    return {
        "name": name,
        "seconds": seconds,
        "gpus": gpus,
        "priority": priority,
        "alone": alone,
        "light": light,
    }


def test_four_cards_run_four_jobs_at_once_and_a_wide_job_waits_for_all():
    jobs = [job(f"j{i}", 10, priority=10) for i in range(4)] + [job("wide", 5, gpus=4)]
    placed = {p.name: p for p in schedule.place(jobs, cards=4, slots=4)}
    assert all(placed[f"j{i}"].start == 0 for i in range(4))
    assert placed["wide"].start == 10 and len(placed["wide"].cards) == 4
    assert schedule.wall_seconds(jobs, 4, 4) == 15
    # first by priority, the wide job's cards are free at once and the rest follow
    jobs[-1]["priority"] = 100
    assert schedule.wall_seconds(jobs, 4, 4) == 15
    assert {p.name: p for p in schedule.place(jobs, 4, 4)}["wide"].start == 0


def test_jobs_timed_on_the_cpu_run_alone_and_local_jobs_beside_gpu_jobs():
    jobs = [job("cpu1", 4, gpus=0, alone=True), job("cpu2", 4, gpus=0, alone=True),
            job("plot", 1, gpus=0), job("g", 3)]  # fmt: skip
    placed = {p.name: p for p in schedule.place(jobs, cards=1, slots=4)}
    assert placed["cpu1"].start == 0 and placed["cpu2"].start == 4  # never together
    assert placed["g"].start == 8 and placed["plot"].start == 8  # nothing beside a timed job
    assert schedule.wall_seconds(jobs, 1, 4) == 11


def test_light_jobs_take_no_slot_and_run_beside_each_other_not_beside_a_timed_job():
    """On a GPU host the aggregates and plots take no job slot: two run together beside the
    GPU jobs that fill the slots, and neither beside a job timed on the CPU."""
    jobs = [job("g1", 10, priority=9), job("g2", 10, priority=9),
            job("agg", 2, gpus=0, light=True, priority=5),
            job("plot", 2, gpus=0, light=True, priority=5),
            job("gloo", 3, gpus=0, alone=True, priority=1)]  # fmt: skip
    placed = {p.name: p for p in schedule.place(jobs, cards=2, slots=2)}
    assert placed["g1"].start == placed["g2"].start == 0
    assert placed["agg"].start == placed["plot"].start == 0  # beside both, and each other
    assert placed["gloo"].start == 10  # after the GPU jobs and the light ones
    jobs = [job("gloo", 3, gpus=0, alone=True, priority=9), job("agg", 1, gpus=0, light=True)]
    placed = {p.name: p for p in schedule.place(jobs, cards=2, slots=2)}
    assert placed["agg"].start == 3  # not beside the timed job


def test_the_plan_lists_each_cards_jobs_and_the_wall_time():
    jobs = [job("a", 60), job("b", 120, gpus=2), job("cpu", 30, gpus=0, alone=True)]
    text = schedule.plan_text(schedule.place(jobs, 2, 2), 2)
    assert "GPU 0: 2 jobs" in text and "GPU 1: 1 jobs" in text
    assert "cpu (alone)" in text and "estimated wall time: 3.5 min" in text


def test_a_job_waits_for_the_jobs_writing_its_inputs():
    # the wide job outranks everything but needs the ceilings' CSV: the narrow jobs start first
    jobs = [
        dict(job("ceilings", 5, priority=50), outputs=["c.csv"]),
        dict(job("wide", 10, gpus=2, priority=100), inputs=["c.csv"]),
        job("n1", 20, priority=1),
    ]
    placed = {p.name: p for p in schedule.place(jobs, cards=2, slots=2)}
    assert placed["ceilings"].start == 0 and placed["n1"].start == 0
    assert placed["wide"].start == 20  # both cards free only when n1 ends
    without = [{k: v for k, v in j.items() if k not in ("inputs", "outputs")} for j in jobs]
    assert {p.name: p for p in schedule.place(without, 2, 2)}["wide"].start == 0
