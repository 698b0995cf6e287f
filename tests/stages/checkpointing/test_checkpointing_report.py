"""The checkpointing section from rows: Q31's answer below a block follows from the measured
peaks of the sub-block strategies beside every block size, and the figure draws (with a note)
when no strategy ran."""

from __future__ import annotations

import pandas as pd
import pytest
from fixture_rows import prov, write_results
from PIL import Image

from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.checkpointing import analysis, answers


def strategy_rows(peaks: dict, status: dict | None = None) -> pd.DataFrame:
    """xl fp32 rows: `peaks` (MiB above the step's start) by strategy; `status` overrides."""
    rows = []
    for name, peak in peaks.items():
        st = (status or {}).get(name, "ok")
        k = int(name[6:]) if name.startswith("every_") else None
        rows.append(
            {**prov(gpus=1), "strategy": name, "status": st, "size": "xl", "d_model": 2560,
             "d_ff": 10240, "num_layers": 32, "num_heads": 32, "vocab_size": 10000,
             "batch_size": 4, "context_length": 2048, "precision": "fp32", "device": "cuda",
             "warmup_steps": 1, "measure_steps": 2, "block_size": k,
             "peak_activation_mb": peak if st == "ok" else None,
             "peak_allocated_mb": peak + 52000 if st == "ok" else None,
             "step_ms_mean": 5700.0 if st == "ok" else None, "model_peak_mb": peak * 0.8,
             "model_boundary_mb": 80.0, "model_block_mb": 4132.0, "recomputed_blocks": 32,
             "compute_factor": 1.33}
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_best_unit_follows_from_the_sub_block_peaks():
    df = strategy_rows({"every_1": 11000.0, "every_2": 14000.0, "attn": 40000.0,
                        "ffn": 0.0, "halves": 9000.0}, {"ffn": "oom"})  # fmt: skip
    best = answers.best_block_size(df, "fp32")
    assert best["k"] == 1 and best["none_smaller"]
    text = best["smaller"]
    assert "the FFN half alone: oom" in text
    assert "both halves, each on its own: peak 8.79 GiB, 0.82× k = 1's" in text
    assert text.endswith("every block size: both halves, each on its own (8.79 GiB), a unit "
                         "smaller than a block.")  # fmt: skip
    # whole blocks lower: the answer says so
    df = strategy_rows({"every_1": 11000.0, "every_2": 14000.0, "halves": 12000.0})
    assert answers.best_block_size(df, "fp32")["smaller"].endswith(
        "every block size: one level, every 1 block (10.74 GiB), whole blocks."
    )
    none = answers.best_block_size(strategy_rows({"every_1": 1.0, "every_2": 2.0}), "fp32")
    assert "No unit smaller than a block was measured" in none["smaller"]


@pytest.mark.parametrize("status", ["oom", "error: RuntimeError: boom", "skipped: needs 180 GiB"])
def test_the_figure_draws_when_no_strategy_ran(tmp_path, status):
    names = ["none", "every_1", "every_2", "sqrt", "attn", "ffn", "halves"]
    df = strategy_rows(dict.fromkeys(names, 0.0), dict.fromkeys(names, status))
    df = df.drop(columns=["peak_activation_mb", "peak_allocated_mb", "step_ms_mean"])
    results = write_results(tmp_path / "r", checkpointing=df)
    (path,) = analysis.plot(results, tmp_path / "f")
    assert placeholder_reason(path) is None
    with Image.open(path) as im:
        assert im.size[0] > 100
    ctx = analysis.context(results)
    assert ctx["best"] == [] and status in ctx["table"]


def test_no_label_collides_in_the_figure(tmp_path, monkeypatch):
    """The gpu preset's strategies, some out of memory or skipped, in fp32 and bf16."""
    from figure_checks import capture, overlaps

    from cs336_systems.stages.checkpointing import figures

    names = ["none", "every_1", "every_2", "every_4", "every_32", "sqrt", "attn", "ffn", "halves"]
    peaks = dict(zip(names, [130e3, 11e3, 14e3, 21e3, 130e3, 25e3, 60e3, 90e3, 10e3], strict=True))
    failed = {"none": "skipped: needs 180 GiB; have 79 GiB", "every_32": "skipped: x", "sqrt":
              "oom", "attn": "oom", "ffn": "skipped: needs 140 GiB; have 79 GiB"}  # fmt: skip
    df = pd.concat([strategy_rows(peaks, failed), strategy_rows(peaks).assign(precision="bf16")])
    figs = capture(monkeypatch, figures)
    analysis.plot(write_results(tmp_path / "r", checkpointing=df), tmp_path / "f")
    (fig,) = figs
    assert overlaps(fig) == []
