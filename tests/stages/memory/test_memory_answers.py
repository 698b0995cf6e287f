"""The memory section's accounting (stages/memory/rows.py, answers.py): a peak's parts add up
to it, counts add up to the grid, mixed precision is compared without autocast's weight copies,
the largest allocations come from the forward snapshot, part (f)'s gradients from the
allocator's changes, and the edition's own residual stream."""

from __future__ import annotations

import pandas as pd
import pytest
from pipeline_utils import ROOT

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
    # one context compared (128: 2048 ran checkpointed), its forward and its train step
    assert "(medians over 2 points)" in text and "every context" not in text
    assert "(6,449 MiB)" in text


def test_the_weight_copies_share_is_a_labelled_median_of_exact_sizes():
    """The cpu run: the copies are 3.44 MiB (not "3"), 32% of bf16's saved bytes at context 32
    and 19% at 64 (saved bytes are counted, not timed: the same on every run of the preset)."""
    d = pd.read_csv(ROOT / "report" / "reference" / "cpu" / "csv" / "memory.csv")
    text = answers.precision_without_casts(d[(d["status"] == "ok") & (d["checkpoint"] == "none")])
    assert "26% (median; 19%–32%) of what it saves" in text
    assert "(3.44 MiB, the same at every context)" in text


def test_an_inference_forward_keeps_no_weight_copy():
    """Under torch.inference_mode autocast casts each weight again where it is used (bf16's
    inference peak on four H200s: +44 MiB at context 128, against 6,449 MiB of copies): no
    sentence says the copies are held there."""
    four = pd.read_csv(ROOT / "report" / "reference" / "h200-x4" / "csv" / "memory.csv")
    ran = four[four["status"] == "ok"]
    text = answers.inference_precision(ran)
    assert "keeps no bf16 copy of the weights" in text
    assert "not within 25% of them at any context, as no copy is kept" in text
    row = ran[(ran["mode"] == "inference") & (ran["precision"] == "bf16")].iloc[0]
    timeline = answers.timeline_sentence(row)
    assert "cached" not in timeline and "a weight's bf16 copy while its matmul runs" in timeline


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


@pytest.mark.parametrize(
    ("run", "gpus", "status"), [("cpu", 0, "partly"), ("h200-x4", 4, "answered")]
)
def test_part_f_needs_its_nsight_capture_and_the_allocators_gradients(run, gpus, status):
    """memory_profiling (f) asks for Nsight screenshots and the gradients' size from backward's
    memory changes: the CPU run measured only what one block saves (no nsys, no CUDA
    allocator), so it answers the part partly; four H200s measured both."""
    from cs336_systems.reporting import coverage
    from cs336_systems.stages import memory
    from cs336_systems.stages.memory import analysis

    ctx = analysis.context(ROOT / "report" / "reference" / run / "csv")
    machine = coverage.Machine(gpus=gpus, name=run)
    t = coverage.coverage_table("2026", {"memory": memory.QUESTIONS}, {"memory": ctx}, machine)
    (row,) = [r for _, r in t.iterrows() if r["part"].startswith("[memory_profiling (f)]")]
    assert row["status"] == status
    if status == "partly":
        assert "its Nsight capture did not run (skipped: nsys absent)" in row["why"]
        assert "needs a CUDA device (this run has none)" in row["why"]
        assert "on a CUDA GPU with Nsight Systems (`nsys`) installed" in row["what answers it"]


def test_part_f_on_a_gpu_without_nsys_misses_only_the_capture():
    blocks = pd.read_csv(ROOT / "report" / "reference" / "h200-x4" / "csv" / "memory_blocks.csv")
    cap = blocks[blocks["part"] == "nsys_capture"]
    tot = blocks[blocks["part"] == "block_total"]
    assert answers.block_coverage(cap, tot) == {}
    cov = answers.block_coverage(cap.assign(status="skipped: nsys absent"), tot)
    why = cov["memory_profiling.f"]["why"]
    assert why.endswith("its Nsight capture did not run (skipped: nsys absent)")


def _inference_point(mode: str, status: str = "ok", peak: float = 0.0, saved: float = 0.0):
    return pd.Series(
        {"size": "xl", "context_length": 2048, "precision": "fp32", "mode": mode,
         "status": status, "peak_allocated_mb": peak, "saved_activations_mb": saved,
         "rss_growth_mb": peak}
    )  # fmt: skip


def test_the_inference_forward_beside_an_autograd_forward_that_did_not_fit():
    inf = _inference_point("inference", peak=20_000)
    fwd = _inference_point("forward", status="skipped: needs 150 GiB, have 140 GiB")
    text = answers.inference_sentence(inf, fwd, cuda=True)
    assert text == (
        "xl, context 2048, fp32: the inference forward (torch.inference_mode) peaks at 20,000 "
        "MiB; the forward with autograd on: skipped: needs 150 GiB, have 140 GiB. What does "
        "not fit is what autograd keeps for backward, not the forward's computation."
    )


def test_an_autograd_forward_below_the_inference_forward_is_flagged_not_explained():
    inf = _inference_point("inference", peak=20_000)
    fwd = _inference_point("forward", peak=19_000, saved=5_000)
    text = answers.inference_sentence(inf, fwd, cuda=True)
    assert "(0.95×) ⚠" in text and "no conclusion is drawn" in text
    assert "between them is what autograd keeps" not in text


def test_on_a_cpu_the_inference_forward_is_told_by_what_it_saves():
    inf = _inference_point("inference", peak=30, saved=0)
    fwd = _inference_point("forward", peak=35, saved=12)
    text = answers.inference_sentence(inf, fwd, cuda=False)
    assert "grows RSS by 30 MiB, the forward with autograd on grows RSS by 35 MiB" in text
    assert (
        "the inference forward saves 0 MiB for backward, the forward with autograd on 12 MiB"
        in text
    )


@pytest.mark.parametrize(
    ("edition", "expect"),
    [
        (2025, "for 2.7B (d_model 2,560) at batch 4, context 128: 4·128·2560·4 = 5,242,880 bytes"),
        (2026, "context 2048: 4·2048·2560·4 = 83,886,080 bytes = 80.0 MiB"),
    ],
)
def test_part_d_for_the_editions_own_model_without_a_run(edition, expect):
    hr = rows.handout_residual_rows(edition)
    assert list(hr["context_length"]) == list(rows.HANDOUT_MODEL[edition][1])
    text = answers.handout_residual_sentence(hr, {"tiny"})
    assert text.startswith("A residual-stream activation holds one fp32 number (4 bytes)")
    assert expect in text
    assert "no run needed: this run measured tiny" in text
    assert "no run needed" not in answers.handout_residual_sentence(hr, {hr["size"].iloc[0]})


def test_tables_name_the_unit_they_are_computed_in():
    t = rows.unit_headers(pd.DataFrame({"peak_allocated_mb": [1.0], "analytic_need_gib": [2.0]}))
    assert list(t.columns) == ["peak allocated (MiB)", "analytic need (GiB)"]
    assert " MB" not in rows.md_table(pd.DataFrame({"size_mb": [1.0]}))


def test_one_context_draws_the_peaks_as_labelled_bars(tmp_path, monkeypatch):
    """A grid of one context (the CPU preset's, a trimmed one): bars with their values, the
    legend outside, no two texts over each other."""
    import itertools

    import matplotlib.pyplot as plt

    from cs336_systems.stages.memory import figures

    df = pd.DataFrame(
        [
            {"size": "xl", "context_length": 128, "mode": m, "precision": p, "status": "ok",
             "peak_allocated_mb": peak, "saved_activations_mb": 1.0,
             "analytic_activations_mb": 1.0, "checkpoint": "none"}
            for (m, p), peak in zip(
                itertools.product(["inference", "forward", "train_step"], ["fp32", "bf16"]),
                [13_000, 19_000, 17_000, 22_000, 52_000, 52_300], strict=True)
        ]
    )  # fmt: skip
    drawn: dict = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        out = real(fig, *a, **k)
        if "ax" not in drawn:
            r = fig.canvas.get_renderer()
            ax = fig.axes[0]
            texts = [*ax.texts, *ax.get_xticklabels(), ax.title, ax.yaxis.label]
            texts += list(fig.legends[0].get_texts()) if fig.legends else []
            texts += list(ax.get_legend().get_texts()) if ax.get_legend() else []
            drawn["ax"] = ax
            drawn["boxes"] = [(t.get_text(), t.get_window_extent(r)) for t in texts if t.get_text()]
        return out

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    figures._peak_figure(df, df, tmp_path / "memory_peak.png")
    ax = drawn["ax"]
    assert len(ax.patches) == 6 and "one context in this grid: 128" in ax.get_title()
    values = sorted(t.get_text() for t in ax.texts)
    assert values == sorted(f"{v / 1024:.2f}" for v in df["peak_allocated_mb"])
    boxes = drawn["boxes"]
    clash = [(a, b) for (a, x), (b, y) in itertools.combinations(boxes, 2) if x.overlaps(y)]
    assert clash == []
