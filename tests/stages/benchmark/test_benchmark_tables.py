"""The benchmark's engines table (stages/benchmark/tables.py): which plain row each engine is set
against, and how a point that did not run reads there."""

from __future__ import annotations

import pandas as pd

from cs336_systems.stages.benchmark.tables import engines_table


def _row(engine: str, attention: str, ms: float, status: str = "ok") -> dict:
    return {"size": "small", "context_length": 512, "precision": "bf16", "compile": "eager",
            "mode": "train_step", "engine": engine, "attention": attention,
            "step_ms_mean": ms, "status": status}  # fmt: skip


def test_the_engine_is_set_against_the_naive_plain_model_whatever_the_row_order():
    rows = [_row("plain", "naive", 60.0), _row("fast", "naive", 30.0),
            _row("plain", "sdpa", 40.0), _row("plain", "flash_triton", 50.0)]  # fmt: skip
    for order in (rows, rows[::-1]):
        t = engines_table(pd.DataFrame(order)).iloc[0]
        assert t["plain (ms)"] == "60.00" and t["fast speedup"] == "2.00×", dict(t)


def test_a_point_that_did_not_run_shows_its_kind_not_a_cut_reason():
    df = pd.DataFrame(
        [
            _row(
                "plain", "naive", float("nan"), "skipped: 10B train step in fp32 needs 240,413 MiB"
            ),
            _row("fast", "naive", 30.0),
        ]  # fmt: skip
    )
    t = engines_table(df).iloc[0]
    assert t["plain (ms)"] == "skipped" and "fast speedup" not in t.dropna()


def test_a_host_bound_bf16_step_that_got_slower_is_called_slower():
    """The H100 reference once read "bf16 0.73× faster" for a host-bound small step."""
    from cs336_systems.stages.benchmark.answers import host_bound_note

    hb = pd.DataFrame(
        {
            "size": ["small", "small"],
            "mode": ["forward", "forward_backward"],
            "compile": ["eager", "eager"],
            "attention": ["naive", "naive"],
            "speedup": [1.15, 0.73],
            "peak_ratio": [12.8, 12.8],
        }
    )
    text = host_bound_note(hb)
    assert "bf16 1.15× faster for a 12.8× faster matmul" in text
    assert "bf16 1.37× slower for a 12.8× faster matmul" in text and "0.73×" not in text


def test_phases_that_disagree_with_q1s_passes_are_left_out_and_named():
    """The H100 reference's bf16 large: 0.96× inside the step against 2.03× from Q1's passes
    timed in runs of their own. Such a size is named with both ratios and kept out of the
    phases' backward/forward; a size where the two agree stays in."""
    from fixture_rows import benchmark_rows

    from cs336_systems.reporting.analysis import ok
    from cs336_systems.stages.benchmark.analysis import phase_summary

    df = benchmark_rows(sizes=("tiny", "small"))  # Q1: forward 10, forward+backward 30 ms
    step = df["mode"] == "train_step"
    df.loc[step, "fwd_ms_median"] = 10.0
    df.loc[step, "bwd_ms_median"] = df.loc[step, "size"].map({"tiny": 20.0, "small": 10.0})
    df.loc[step, "opt_ms_median"] = 4.0
    fp32 = next(x for x in phase_summary(df, ok(df))["sentences"] if x.startswith("fp32"))
    assert "backward 2.00× (`tiny`) the forward time" in fp32  # small left out
    assert "disagree by more than 20%: `small` 1.00× in the step, 2.00× in Q1" in fp32


def test_where_the_phases_and_q1_disagree_each_pass_is_set_beside_q1s():
    """The clause says which pass parts: the step's forward and backward against Q1's own
    runs, and the other precision's forward at the same size for contrast."""
    from fixture_rows import benchmark_rows

    from cs336_systems.reporting.analysis import ok
    from cs336_systems.stages.benchmark.analysis import phase_summary

    df = benchmark_rows(sizes=("tiny", "small"))  # fp32 and bf16; Q1: forward 10, f+b 30 ms
    step = df["mode"] == "train_step"
    df.loc[step, "fwd_ms_median"] = 10.0
    df.loc[step, "bwd_ms_median"] = 20.0
    df.loc[step, "opt_ms_median"] = 4.0
    small_bf16 = step & (df["size"] == "small") & (df["precision"] == "bf16")
    df.loc[small_bf16, ["fwd_ms_median", "bwd_ms_median"]] = [15.0, 15.0]
    s = phase_summary(df, ok(df))["sentences"]
    bf = next(x for x in s if x.startswith("bf16"))
    assert "`small` 1.00× in the step, 2.00× in Q1" in bf
    assert "forward 15.00 ms in the step against 10.00 in Q1's forward run (1.50×)" in bf
    assert "backward 15.00 against 20.00 (0.75×); fp32's forward 1.00× its Q1 run's" in bf
    assert "per pass" not in next(x for x in s if x.startswith("fp32"))
