"""The memory section's accounting (stages/memory/rows.py, answers.py): a peak's parts add up
to it, counts add up to the grid, mixed precision is compared without autocast's weight copies,
the largest allocations come from the forward snapshot, part (f)'s gradients from the
allocator's changes, and a timeline's phase names cannot overprint."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from pipeline_utils import ROOT

from cs336_systems.profiling import memory_snapshot as mem
from cs336_systems.stages.memory import answers, rows

REF = ROOT / "report" / "reference" / "h100-80gb-hbm3" / "csv"


@pytest.fixture
def points() -> pd.DataFrame:
    return pd.read_csv(REF / "memory.csv")


def test_the_parts_of_every_peak_add_up_to_it(points):
    parts = rows.peak_parts(points[points["status"] == "ok"])
    assert len(parts) == 8
    total = parts[list(rows.PARTS)].sum(axis=1)
    assert total.to_numpy() == pytest.approx(parts["peak_allocated_mb"].to_numpy())
    # bf16 without checkpointing: its saved activations are mostly autocast's weight copies
    bf = parts[(parts["precision"] == "bf16") & (parts["checkpoint"] == "none")]
    assert (bf["weight_casts_mb"] > bf["activations_mb"]).all()
    # a checkpointed block's copies are not saved: no weight-copy part there
    assert (parts[parts["checkpoint"] != "none"]["weight_casts_mb"] == 0).all()
    text = answers.parts_sentence(parts)
    assert text.startswith("xl, context 128, train step, fp32: parameters 12,996 + optimizer")
    assert "= 52,568 MiB, the peak" in text and "gradients" in text


def test_the_counts_add_up_to_the_grid(points):
    text = answers.grid_counts(points)
    assert text == (
        "12 points: 4 ran without checkpointing, 4 skipped, 4 ran with one level of checkpointing"
    )


def test_mixed_precision_without_the_weight_copies(points):
    text = answers.precision_without_casts(points[points["checkpoint"] == "none"])
    assert "saves 2.14× the fp32 activation bytes" in text
    assert "without them it saves 0.69× the fp32 bytes" in text


def test_the_largest_allocations_are_the_forward_snapshots():
    allocs = pd.read_csv(REF / "memory_allocations.csv")
    text, table = answers.forward_allocations(allocs)
    assert "at context 128 the largest are 20 MiB" in text and "SwiGLU hidden" in text
    assert "at context 2048 (run with checkpointing every_1" in text
    assert "attention scores/probabilities" in text and "naive_attention" in text
    assert "Under bf16 autocast the largest at context 128 are 50 MiB" in text
    assert table.count("\n") >= 5  # header, rule, one row per context and precision


def test_part_f_gradients_from_the_allocator():
    row = pd.Series(
        {"grad_bytes": 400 * 2**20, "block_params": 104_857_600, "device": "cuda",
         "forward_alloc_bytes": 218 * 2**20, "output_bytes": 80 * 2**20,
         "backward_alloc_change_bytes": 342 * 2**20, "input_grad_bytes": 80 * 2**20,
         "grads_from_memory_bytes": (342 + 138 - 80) * 2**20}
    )  # fmt: skip
    text = answers.grads_sentence(row, 400 * 2**20, "exactly")
    assert "+342.0 + 138.0 − 80.0 = 400.0 MiB, as expected" in text
    cpu_row = row.drop("grads_from_memory_bytes")
    cpu_row["device"] = "cpu"
    cpu = answers.grads_sentence(cpu_row, 400 * 2**20, "exactly")
    assert "needs a CUDA device (this run has none)" in cpu and "snakemake" in cpu


def test_the_timeline_names_its_phases_in_a_legend(tmp_path, monkeypatch):
    events = pd.DataFrame(
        {"event": range(6), "active_bytes": [1, 2, 3, 2, 2, 2],
         "phase": ["forward", "forward", "backward", "backward", "optimizer", "optimizer_end"]}
    )  # fmt: skip
    drawn = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        drawn["texts"] = [t for ax in fig.axes for t in ax.texts]
        drawn["legend"] = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
        return real(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    mem.render_timeline(events, tmp_path / "t.png", "t")
    assert drawn["texts"] == []
    assert drawn["legend"][:4] == ["forward", "backward", "optimizer", "optimizer_end"]
