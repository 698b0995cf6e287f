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


def _phased(sizes=("tiny", "small")):
    """Fixture rows with phases inside each training step: forward 10, backward 20, optimizer
    4 ms of a 35 ms step (means and medians alike), fp32 and bf16, ceilings 0.5 and 2 TFLOP/s
    (bf16 4x: the host-bound rule can fire)."""
    from fixture_rows import benchmark_rows

    df = benchmark_rows(sizes=sizes)
    step = df["mode"] == "train_step"
    for stat in ("mean", "median"):
        df.loc[step, [f"fwd_ms_{stat}", f"bwd_ms_{stat}", f"opt_ms_{stat}"]] = [10.0, 20.0, 4.0]
    df["peak_tflops"] = df["precision"].map({"fp32": 0.5, "bf16": 2.0})
    return df


def test_the_host_bound_rule_fires_on_a_phase_and_leaves_the_point_out_of_every_phase():
    """bf16 shortens every mode of `small` (the mode rule is silent) but not its forward phase
    inside the step: the same rule fires on that phase, names it, and `small` leaves the
    optimizer share, backward/forward and the sum alike, in both precisions."""
    from cs336_systems.reporting.analysis import ok
    from cs336_systems.stages.benchmark import answers
    from cs336_systems.stages.benchmark.analysis import phase_summary
    from cs336_systems.stages.benchmark.rows import (
        host_bound,
        host_bound_points,
        phase_host_bound,
    )

    df = _phased()
    bf = df["precision"] == "bf16"
    for col in ("step_ms_mean", "step_ms_median"):
        df.loc[bf, col] = df.loc[bf, col] / 3
    bstep = bf & (df["mode"] == "train_step")
    df.loc[bstep, ["fwd_ms_median", "bwd_ms_median", "opt_ms_median"]] = [3.0, 6.0, 2.0]
    small = bstep & (df["size"] == "small")
    df.loc[small, "fwd_ms_median"] = 9.5  # 10 / 9.5 = 1.05x for a 4x faster matmul
    assert host_bound(df).empty
    ph = phase_host_bound(df)
    assert list(zip(ph["size"], ph["phase"], strict=True)) == [("small", "fwd")]
    # the optimizer's 4 -> 2 ms would not fire either way: bf16 leaves its work as it is
    assert set(phase_host_bound(df.assign(opt_ms_median=4.0))["phase"]) == {"fwd"}
    note = answers.host_bound_note(ph)
    assert "`small` train step eager, naive attention (forward phase of the train step)" in note
    hb = host_bound_points(df, ph)
    s = phase_summary(df, ok(df), hb)["sentences"]
    for prec in ("fp32", "bf16"):
        line = next(x for x in s if x.startswith(prec))
        assert line.startswith(f"{prec} (`small` left out of each of these")
        assert "(`tiny`)" in line and "at `small`" not in line


def test_phases_that_exceed_their_step_are_flagged_with_the_gap():
    """The parts add up on means (additive); where they exceed the step (the report's 100.3%)
    the size is named with the gap and called suspect; below it the rest is named."""
    from cs336_systems.reporting.analysis import ok
    from cs336_systems.stages.benchmark.analysis import phase_summary

    df = _phased()
    over = (df["mode"] == "train_step") & (df["size"] == "small") & (df["precision"] == "fp32")
    df.loc[over, "opt_ms_mean"] = 5.105  # 10 + 20 + 5.105 = 35.105 of a 35 ms step
    fp32 = next(x for x in phase_summary(df, ok(df))["sentences"] if x.startswith("fp32"))
    assert "add up to 97.1% (`tiny`)" not in fp32  # both sizes are summarized
    assert "(means; the rest is zeroing the gradients" in fp32
    assert "**suspect**: at `small` the parts exceed the step by 0.11 ms (100.3%)" in fp32
    bf16 = next(x for x in phase_summary(df, ok(df))["sentences"] if x.startswith("bf16"))
    assert "suspect" not in bf16 and "97.1%" in bf16


def test_a_backward_shorter_than_its_forward_is_flagged_or_explained():
    """bf16 `small` backward 8 ms against forward 10 ms: suspect where the point is not
    host-bound; explained by the host where it is."""
    from cs336_systems.stages.benchmark import answers

    g = pd.DataFrame(
        {"fwd_ms_median": [10.0, 10.0], "bwd_ms_median": [20.0, 8.0]},
        index=pd.Index(["tiny", "small"], name="size"),
    )
    text = answers.backward_shorter(g, set())
    assert text.startswith("`small`'s backward (8.00 ms) is shorter than its forward (10.0")
    assert "**suspect**" in text and "`tiny`" not in text
    assert "host-bound, so the forward's time is the host" in answers.backward_shorter(g, {"small"})


def test_the_forward_range_covers_every_forward_that_ran():
    """small's forward+backward is suspect, so it has no backward: its forward still bounds
    the forward range (the report's bf16 range left such rows out)."""
    from cs336_systems.reporting.analysis import ok
    from cs336_systems.stages.benchmark import answers

    df = _phased(("tiny", "small", "medium"))
    df.loc[(df["size"] == "medium") & (df["mode"] == "forward"), "step_ms_mean"] = 12.0
    bad = (df["size"] == "small") & (df["mode"] == "forward_backward")
    df.loc[bad, "sanity"] = "suspect: fixture"
    d = ok(df.assign(sanity=df.get("sanity", "").fillna("")))
    line = next(x for x in answers.pass_times(d, df) if x.startswith("fp32"))
    assert "forward pass takes 10.00 ms (`tiny`) to 12.00 ms (`medium`) (3 sizes)" in line
    assert "(2 sizes with both passes)" in line


def test_q1_names_a_backward_shorter_than_its_forward():
    from cs336_systems.stages.benchmark import answers

    r = pd.DataFrame({"size": ["tiny", "small"], "context_length": 32, "precision": "bf16",
                      "forward_ms": [10.0, 10.0], "backward_ms": [20.0, 7.0],
                      "ratio": [2.0, 0.7]})  # fmt: skip
    text = answers.q1_backward_shorter(r)
    assert text.startswith("**Suspect**: backward shorter than forward at `small` context 32")
    assert "`tiny`" not in text
    assert answers.q1_backward_shorter(r[r["size"] == "tiny"]) == ""


def test_mfu_is_given_against_the_measured_ceiling_and_the_datasheet():
    """Each MFU has its datasheet twin (the vendor's dense peak of the row's device and
    precision): the table shows both, the best point's sentence both, and a device the table
    does not list says so instead of a number."""
    from fixture_rows import ceilings_rows

    from cs336_systems.core.costs import datasheet_peak
    from cs336_systems.stages.benchmark import answers, tables
    from cs336_systems.stages.benchmark.mfu import add_mfu

    assert datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == 989.5
    assert datasheet_peak("NVIDIA H100 NVL", "fp32") == 60.0  # not the SXM's 67
    assert pd.isna(datasheet_peak("AMD EPYC 7R13", "fp32"))
    df = _phased().assign(device_name="NVIDIA H100 80GB HBM3")
    df["tflops"] = df["precision"].map({"fp32": 33.5, "bf16": 494.75})
    d = add_mfu(df, ceilings_rows(fp32=50.0, bf16=700.0, autocast=600.0))
    t = d[d["mode"] == "train_step"]
    assert set(t["mfu_datasheet"].round(3)) == {0.5}
    table = tables.mfu_table(t)
    assert "67.0 / 50.0" in table and "82.5 / 50.0" in table
    best = answers.mfu_best(d)
    assert "50.0% of the datasheet's 990 TFLOP/s (dense bf16, NVIDIA H100 80GB HBM3)" in best
    assert answers.datasheet_peaks(d).startswith("bf16 990, fp32 67.0 TFLOP/s")
    cpu = add_mfu(df.assign(device_name="AMD EPYC"), ceilings_rows())
    assert "not in core/costs.py DATASHEET_TFLOPS" in answers.mfu_best(cpu)


def test_torch_compile_b_is_a_table_of_every_compiled_mode():
    """The 2025 reference compiled `small` bf16 in three modes, two of whose eager twins were
    suspect: the speedup table kept one cell. The compile table shows all three modes with
    both times and the speedup, the suspect ones marked."""
    from cs336_systems.stages.benchmark import tables

    df = _phased(("small",))
    comp = df[df["precision"] == "bf16"].assign(compile="compiled")
    comp["step_ms_mean"] = comp["step_ms_mean"] / 2
    df = pd.concat([df, comp], ignore_index=True)
    bad = (df["compile"] == "eager") & (df["precision"] == "bf16") & (df["mode"] != "forward")
    df["sanity"] = ""
    df.loc[bad, "sanity"] = "suspect: forward+backward slower than the full training step"
    t = tables.compile_table(df)
    lines = [x for x in t.splitlines() if x.startswith("| small")]
    assert [x.split("|")[4].strip() for x in lines] == [
        "forward", "forward+backward", "train step"]  # fmt: skip
    assert "2.00×" in lines[0] and "⚠" not in lines[0]
    assert "⚠" in lines[1] and "⚠" in lines[2]
    assert tables.compile_table(df[df["compile"] == "eager"]) == ""
