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


# --- the timing API: device timer, stopwatch, in-step marks ------------------------------------


def test_device_time_falls_back_to_the_host_timer_on_cpu():
    calls = []
    x = torch.ones(3, requires_grad=True)
    x.grad = torch.zeros(3)

    def fn():
        assert x.grad is None  # gradients are reset before each run, as do_bench does
        calls.append(1)

    stats = harness.device_time(fn, "cpu", "fwd", grad_to_none=[x], warmup_steps=2, steps=4)
    assert len(calls) == 6
    assert set(stats) == {f"fwd_ms_{s}" for s in ("mean", "std", "median", "min", "max")}
    assert all(v >= 0 for v in stats.values())
    assert harness.timer_name("cpu") == "time_steps"
    assert harness.timer_name(torch.device("cuda", 0)) == "do_bench"


def test_device_time_measures_real_time_on_cpu():
    import time

    stats = harness.device_time(lambda: time.sleep(0.01), "cpu", "t", warmup_steps=0, steps=2)
    assert 8 <= stats["t_ms_median"] <= 200


def test_device_time_names_do_bench_quantiles(monkeypatch):
    """On CUDA the statistics are do_bench's, named: median (0.5) and p<100 q>."""
    import triton.testing

    seen = {}

    def fake_do_bench(fn, warmup, rep, grad_to_none=None, quantiles=None, return_mode="mean"):
        seen.update(warmup=warmup, rep=rep, grads=grad_to_none, q=quantiles, mode=return_mode)
        return [1.0, 0.8, 1.3] if quantiles else 1.1

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    cuda = torch.device("cuda", 0)
    stats = harness.device_time(
        lambda: None, cuda, "fwd", warmup_ms=25, rep_ms=100, quantiles=(0.5, 0.2, 0.8)
    )
    assert list(stats) == ["fwd_ms_median", "fwd_ms_p20", "fwd_ms_p80"]
    assert stats["fwd_ms_p80"] == 1.3 and seen["q"] == [0.5, 0.2, 0.8]
    assert harness.device_time(lambda: None, cuda, "t", warmup_ms=100, rep_ms=100) == {
        "t_ms_median": 1.1
    }
    assert (seen["warmup"], seen["rep"], seen["q"], seen["mode"]) == (100, 100, None, "median")


def test_stopwatch_measures_a_sleep():
    import time

    with harness.Stopwatch() as sw:
        time.sleep(0.05)
    assert 0.045 <= sw.s <= 0.5 and sw.ms == pytest.approx(sw.s * 1e3)
    frozen = sw.s
    time.sleep(0.01)
    assert sw.s == frozen  # stopped at the end of the block
    running = harness.Stopwatch()
    time.sleep(0.02)
    assert running.s >= 0.015 and running.stop() >= 0.015


def test_time_marked_steps_times_each_part_of_a_step():
    import time

    def step(clock):
        clock.mark("start")
        time.sleep(0.01)
        clock.mark("middle")
        time.sleep(0.02)
        clock.mark("end")

    out = harness.time_marked_steps(
        step, 1, 3, "cpu", {"first": ("start", "middle"), "second": ("middle", "end")}
    )
    assert list(out) == ["step", "first", "second"]
    assert all(len(v) == 3 for v in out.values())
    for total, a, b in zip(out["step"], out["first"], out["second"], strict=True):
        assert 8 <= a <= 200 and 18 <= b <= 300 and total >= a + b


def test_pipelined_ms_is_the_mean_of_back_to_back_steps():
    import time

    calls = []

    def step():
        calls.append(1)
        time.sleep(0.01)

    ms = harness.pipelined_ms(step, 5, "cpu")
    assert len(calls) == 5 and 9.5 <= ms <= 30
    with pytest.raises(ValueError, match="steps >= 1"):
        harness.pipelined_ms(step, 0, "cpu")


def test_issue_ms_is_the_median_host_time_of_a_call():
    """The median, not the mean or the first: one slow call of five does not move it."""
    import time

    from cs336_systems.core.harness import issue_ms

    delays = iter([0.05, 0.002, 0.002, 0.002, 0.002])
    ms = issue_ms(lambda: time.sleep(next(delays)), 5, "cpu")
    assert 2.0 <= ms < 20.0
