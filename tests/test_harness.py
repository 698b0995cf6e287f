"""The benchmark harness: statistics, warm-up/measure split, failure handling."""

import statistics

import pytest
import torch

from cs336_systems.core import harness


def test_summarize_statistics():
    s = harness.summarize([1.0, 2.0, 4.0], "step")
    assert s["step_ms_mean"] == pytest.approx(7 / 3)
    assert s["step_ms_std"] == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))
    assert s["step_ms_median"] == 2.0
    assert (s["step_ms_min"], s["step_ms_max"]) == (1.0, 4.0)
    assert harness.summarize([3.0], "x")["x_ms_std"] == 0.0


def test_time_steps_counts_warmup_and_measured_separately():
    calls = []
    phases = []
    warm, times = harness.time_steps(
        lambda: calls.append(1),
        warmup=2,
        steps=3,
        on_step=lambda phase, i: phases.append((phase, i)),
    )
    assert len(calls) == 5 and len(warm) == 2 and len(times) == 3
    assert phases == [("warmup", 0), ("warmup", 1), ("measure", 0), ("measure", 1), ("measure", 2)]
    assert all(t >= 0 for t in warm + times)


def test_time_steps_measures_real_time():
    import time

    _, times = harness.time_steps(lambda: time.sleep(0.02), warmup=0, steps=2)
    assert all(15 <= t <= 200 for t in times)


@pytest.mark.parametrize("warmup,steps", [(-1, 3), (0, 0)])
def test_time_steps_rejects_bad_counts(warmup, steps):
    with pytest.raises(ValueError):
        harness.time_steps(lambda: None, warmup, steps)


def test_run_point_turns_oom_into_status():
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    res = harness.run_point(oom)
    assert res.status == "oom" and res.value is None


def test_run_point_turns_cpu_alloc_failure_into_oom():
    def cpu_oom():
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
        )

    assert harness.run_point(cpu_oom).status == "oom"


def test_run_point_turns_other_errors_into_error_status():
    def bad():
        raise ValueError("shapes (3, 4) and (5, 6) do not match, really")

    res = harness.run_point(bad)
    assert res.status.startswith("error: ValueError: shapes (3; 4)")
    assert "," not in res.status  # safe in a CSV cell
    assert harness.run_point(lambda: 42).value == 42
