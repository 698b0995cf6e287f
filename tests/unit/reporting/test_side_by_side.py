"""The side-by-side comparison on two small synthetic results folders."""

import json

import pandas as pd

from cs336_systems.reporting import side_by_side as sbs


def _bench(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    cols = ["size", "precision", "status", "job_id", "step_ms_mean", "step_ms_std", "tflops"]
    pd.DataFrame(rows, columns=cols).to_csv(folder / "benchmark.csv", index=False)


def _folders(tmp_path):
    beside, alone = tmp_path / "h200-x4", tmp_path / "h200-x4-alone"
    _bench(beside, [
        ["small", "bf16", "ok", "j1", 101.0, 1.0, 5.0],   # within 2 combined std
        ["xl", "bf16", "ok", "j1", 130.0, 1.0, 5.0],      # 30% slower, tight spreads
        ["xl", "fp32", "ok", "j1", 90.0, 0.5, 5.0],       # 10% faster
        ["large", "bf16", "error: oom", "j1", 1.0, 0.1, 5.0],  # not ok: left out
    ])  # fmt: skip
    _bench(alone, [
        ["small", "bf16", "ok", "a1", 100.0, 0.5, 5.0],
        ["xl", "bf16", "ok", "a2", 100.0, 1.0, 5.0],
        ["xl", "fp32", "ok", "a3", 100.0, 0.5, 5.0],
        ["large", "bf16", "ok", "a4", 1.0, 0.1, 5.0],
        ["medium", "bf16", "ok", "a5", 50.0, 0.1, 5.0],   # no partner: left out
    ])  # fmt: skip
    records = beside / "jobs" / "records"
    records.mkdir(parents=True)
    for job, what, start, end in [("j1", "benchmark a", 0, 10), ("j2", "flash fp32", 5, 20),
                                  ("j3", "ddp variants", 30, 40)]:  # fmt: skip
        (records / f"{job}.json").write_text(
            json.dumps({"job": job, "what": what, "start": start, "end": end})
        )
    return beside, alone


def test_verdicts_spread_and_fraction():
    assert sbs.verdict((100.0, 1.0), (102.0, 1.0)) == "agree"  # 2 <= 2 * 1.41
    assert sbs.verdict((100.0, 0.1), (102.9, 0.1)) == "agree"  # within 3%
    assert sbs.verdict((100.0, 0.1), (104.0, 0.1)) == "slower beside others"
    assert sbs.verdict((100.0, 0.1), (96.0, float("nan"))) == "faster beside others"


def test_compare_matches_rows_by_their_points(tmp_path):
    beside, alone = _folders(tmp_path)
    table = sbs.compare(beside, alone)
    got = {r: v for r, v in zip(table["row"], table["verdict"], strict=True)}
    assert got == {
        "size=small, precision=bf16": "agree",
        "size=xl, precision=bf16": "slower beside others",
        "size=xl, precision=fp32": "faster beside others",
    }
    assert set(table["beside"]) == {"flash fp32"}  # from the job records: j2 overlapped j1
    assert list(table.loc[table["row"] == "size=xl, precision=bf16", "ratio"]) == ["1.300"]


def test_written_between_markers_twice(tmp_path):
    beside, alone = _folders(tmp_path)
    out = tmp_path / "measured-runs.md"
    out.write_text("# Runs\n\nkept above\n")
    sbs.main([str(beside), str(alone), "--out", str(out)])
    first = out.read_text()
    assert first.startswith("# Runs\n\nkept above\n") and first.count(sbs.START) == 1
    assert "3 timings compared:" in first
    summary = "| stage | timings | agree | faster beside others | slower beside others |"
    assert summary in first and "| benchmark | 3 | 1 | 1 | 1 |" in first
    # the two that disagree listed before the block of every timing
    assert "The 2 that do not agree:" in first
    assert first.index("The 2 that do not agree:") < first.index("<details>")
    out.write_text(first + "\nkept below\n")
    sbs.main([str(beside), str(alone), "--out", str(out)])
    second = out.read_text()
    assert second.count(sbs.START) == 1 and second.endswith("kept below\n")
    assert "130 ± 1 | flash fp32 | 1.300 | slower beside others |" in second


def test_a_point_measured_twice_matches_row_by_row(tmp_path):
    folder = tmp_path / "run"
    _bench(folder, [["xl", "bf16", "ok", "j1", 100.0, 0.1, 5.0],
                    ["xl", "bf16", "ok", "j1", 200.0, 0.1, 5.0]])  # fmt: skip
    table = sbs.compare(folder, folder)
    assert list(table["verdict"]) == ["agree", "agree"]
    assert list(table["ratio"]) == ["1.000", "1.000"]


def test_neighbours_are_named_by_stage_and_point():
    named = (
        "benchmark results/h200-x4/benchmark/points/10B_ctx512_naive.csv; flash results/x/flash.csv"
    )
    assert sbs._short(named) == "benchmark 10B_ctx512_naive, flash flash"
