"""The benchmark section's answers as the handout asks them (benchmark/answers.py), and its
figures: each sentence computed from the rows it names, no line bridging a missing point, a
placeholder figure named in words instead of embedded."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from fixture_rows import benchmark_rows, ceilings_rows, write_results

from cs336_systems.reporting import report
from cs336_systems.reporting.analysis import empty_figure, on_axis, placeholder_reason
from cs336_systems.stages.benchmark import analysis, answers, figures


def run_of(tmp_path, ms=None, sizes=("tiny", "small", "medium"), **kw):
    return write_results(
        tmp_path / "results" / "fixture-cpu",
        benchmark=benchmark_rows(ms=ms, sizes=sizes, **kw),
        ceilings=ceilings_rows(fp32=0.5, autocast=2.0),
    )


def test_on_axis_leaves_a_gap_where_a_key_is_missing():
    y = on_axis(["tiny", "medium"], [1.0, 3.0], ["tiny", "small", "medium"])
    assert y[0] == 1.0 and np.isnan(y[1]) and y[2] == 3.0


def test_no_line_bridges_a_missing_or_suspect_point(tmp_path, monkeypatch):
    """small's forward+backward is slower than its training step (both flagged): the latency
    and backward/forward lines break at small instead of joining tiny to medium."""
    results = run_of(tmp_path, ms={("small", "forward_backward", "fp32"): 50.0})
    drawn = {}

    def keep(fig, path, *a, **k):
        drawn[path.name] = [line.get_ydata() for ax in fig.axes for line in ax.lines]
        plt.close(fig)
        return path

    monkeypatch.setattr(figures, "save", keep)
    figures.plot(results, tmp_path / "fig")
    fp32_fb = [y for y in drawn["benchmark_latency.png"] if len(y) == 3 and np.isnan(y[1])]
    assert fp32_fb, "the forward+backward line must break at the flagged size"
    ratio_lines = [y for y in drawn["benchmark_bwd_fwd.png"] if len(y) == 3]
    assert any(np.isnan(y[1]) and not np.isnan(y[0]) for y in ratio_lines)


def test_the_pass_times_and_their_variability(tmp_path):
    results = run_of(tmp_path, std=2.0)
    s = analysis.context(results)
    assert s["pass_times"][0].startswith("bf16, context 32: a forward pass takes 10.00 ms")
    assert (
        "a backward pass (forward+backward minus forward) 20.00 ms (`tiny`)" in s["pass_times"][0]
    )
    # std 2 of 10-35 ms: 20% at the 10 ms forwards, above the 5% the sentence calls small
    assert "the std is" in s["variability"] and "above 5.0% at" in s["variability"]
    # the fixture's device; its jobs ran alone: no other job is blamed
    assert "On a CPU the step shares its cores with the operating system" in s["variability"]
    assert "other job" not in s["variability"]
    quiet = analysis.context(run_of(tmp_path / "q", std=0.01))
    assert "small everywhere" in quiet["variability"]


def test_a_negative_backward_is_flagged_and_left_out(tmp_path):
    """A forward slower than its forward+backward (the CPU reference's -0.02x) is a suspect
    pair: no backward/forward ratio quotes it."""
    results = run_of(tmp_path, ms={("tiny", "forward", "fp32"): 31.0})
    s = analysis.context(results)
    assert "fp32" not in s["bwd"] or "left out" in s["bwd"]["fp32"]
    df = analysis.load_benchmark(results)
    bad = df[(df["size"] == "tiny") & (df["precision"] == "fp32")]
    assert (
        bad[bad["mode"].isin(["forward", "forward_backward"])]["sanity"]
        .str.contains("negative backward")
        .all()
    )


def test_host_bound_points_are_named_and_left_out_of_the_ratios(tmp_path):
    """A point whose bf16 step takes its fp32 time (1.0x) where the bf16 ceiling is 4x the fp32
    one is host-bound: named, and out of every backward/forward ratio."""
    results = run_of(tmp_path, sizes=("tiny", "small"),
                     ms={("small", m, "bf16"): t for m, t in
                         (("forward", 10.0), ("forward_backward", 30.0), ("train_step", 35.0))}
                     | {("tiny", m, "bf16"): t for m, t in
                        (("forward", 2.0), ("forward_backward", 6.0), ("train_step", 7.0))})  # fmt: skip
    s = analysis.context(results)
    assert "`small` forward eager, naive attention (bf16" in s["host_bound"]
    assert s["host_bound"].startswith("Host-bound (one rule for every mode and every phase")
    assert "`tiny`" not in s["host_bound"]
    assert "1 point left out" in s["bwd"]["bf16"]
    # Q3's bf16 speedup names the same pairs and gives its median without them
    assert s["bf16"]["host"].startswith("3 pairs of these are host-bound")
    assert "without them 5.00×" in s["bf16"]["host"]


def test_warmup_and_speedup_sentences():
    g = pd.DataFrame(
        {"mean_ms": [90.0, 62.0, 58.0, 57.0], "std_ms": [80.0, 3.0, 2.5, 2.4],
         "median_ms": [60.0, 61.0, 58.0, 55.5], "first_measured_ms": [316.0, 65.4, 60.9, 55.5],
         "n_measured": [10, 10, 10, 10]},
        index=pd.Index([0, 1, 2, 5], name="warmup_steps"),
    )  # fmt: skip
    text = answers.warmup_after(g)
    # 62 vs 57 ms, combined standard error sqrt(3^2 + 2.4^2)/sqrt(10) = 1.22: beyond twice it
    assert text.startswith(
        "After 1 warm-up step the mean is 62.00 ms against 57.00 after 5 (+5.00 ms"
    )
    assert "slower" in text and "clocks" in text
    assert "still took" not in text  # the 5-warm-up run's first step is its median
    # the numbers: 1-2 warm-ups at 56.6 ms, 5 at 63.5: the longer warm-up is slower,
    # which the sentence must not explain as unpaid one-time costs
    h = g.copy()
    h.loc[1, ["mean_ms", "std_ms"]] = [56.6, 0.5]
    h.loc[2, ["mean_ms", "std_ms"]] = [56.6, 0.5]
    h.loc[5, ["mean_ms", "std_ms", "median_ms"]] = [63.5, 8.0, 56.4]
    text = answers.warmup_after(h)
    assert ": faster)" in text and "more warm-up cannot cause" in text
    assert "clocks" not in text
    # within the noise: enough warm-up here, and why it may fall short elsewhere
    h.loc[5, ["mean_ms", "std_ms"]] = [56.7, 0.5]
    text = answers.warmup_after(h)
    assert text.count(": the same)") == 2
    assert "leave no one-time cost that shows beyond the steps' spread" in text
    # the H100 reference: after 5 warm-up steps the first measured step took 135 ms (median 60.9)
    g.loc[5, ["first_measured_ms", "median_ms", "std_ms"]] = [135.0, 60.87, 23.57]
    text = answers.warmup_after(g)
    assert (
        "After 5 warm-up steps the first measured step still took 135 ms, 2.2× that run's "
        "median, and its std is 23.57 ms" in text
    )
    # against Q1's same point: the issue's 63.5 vs 56.3 ms, medians equal: slow steps
    q1 = pd.Series({"warmup_steps": 5, "step_ms_mean": 56.3, "step_ms_std": 0.4,
                    "step_ms_median": 56.3, "measure_steps": 10})  # fmt: skip
    g.loc[5, ["mean_ms", "std_ms", "median_ms"]] = [63.5, 8.0, 56.4]
    text = answers.warmup_vs_q1(g, q1)
    assert "run 63.50 ms, +7.20 ms (+12.8%)" in text and "beyond twice" in text
    assert "a few slow steps" in text
    g.loc[5, ["mean_ms", "std_ms", "median_ms"]] = [56.5, 0.5, 56.4]
    assert "they agree" in answers.warmup_vs_q1(g, q1)
    assert answers.warmup_vs_q1(g, None) == ""
    sp = pd.DataFrame(
        {"size": ["small", "medium", "xl"], "mode": "forward", "speedup": [1.1, 1.5, 4.8]}
    )
    assert (
        answers.speedup_trend(sp)
        == "forward: grows with every size, 1.10× at `small` to 4.80× at `xl`"
    )


def test_the_protocol_sentence(tmp_path):
    s = analysis.context(run_of(tmp_path))
    assert s["protocol"].startswith("the handout asks 5 and 10")
    df = pd.DataFrame({"preset": ["gpu"]})
    assert answers.protocol_sentence(5, 10, df) == "the handout's protocol"


def test_a_placeholder_figure_is_named_not_embedded(tmp_path):
    fig = tmp_path / "figures"
    empty_figure(fig / "x_a.png", "no successful points")
    plt.figure()
    plt.plot([1, 2])
    plt.savefig(fig / "x_b.png")
    plt.close()
    assert placeholder_reason(fig / "x_a.png") == "no successful points"
    assert placeholder_reason(fig / "x_b.png") is None
    body = "![a](figures/x_a.png)\n\n![b](figures/x_b.png)\n"
    out = report.without_placeholders(body, "figures", fig)
    assert "_No figure (a): no successful points._" in out
    assert "![b](figures/x_b.png)" in out and "x_a.png" not in out


@pytest.mark.parametrize("missing", ["medium"])
def test_the_speedup_figure_has_a_bar_per_size_and_mode(tmp_path, monkeypatch, missing):
    results = run_of(tmp_path)
    drawn = {}

    def keep(fig, path, *a, **k):
        drawn[path.name] = [len(ax.patches) for ax in fig.axes]
        plt.close(fig)
        return path

    monkeypatch.setattr(figures, "save", keep)
    figures.plot(results, tmp_path / "fig")
    # three sizes x three modes of bf16-over-fp32 pairs (no compiled points in the fixture)
    assert drawn["benchmark_speedups.png"] == [9]


def test_a_slower_longest_warmup_says_whether_its_median_is_shared():
    """The four-H200 run: 5 warm-up steps the slower mean (57.16 ms) with its median 57.52 above
    the shorter counts' 53.12 and 53.28: its whole window ran slower, no median is shared; with
    the median at theirs, a few slow steps."""
    g = pd.DataFrame(
        {"mean_ms": [80.03, 53.52, 53.35, 57.16], "std_ms": [81.11, 1.19, 0.58, 2.16],
         "median_ms": [52.52, 53.12, 53.28, 57.52],
         "first_measured_ms": [311.0, 53.76, 53.33, 52.81], "n_measured": [10, 10, 10, 10]},
        index=pd.Index([0, 1, 2, 5], name="warmup_steps"),
    )  # fmt: skip
    text = answers.warmup_after(g)
    assert "more warm-up cannot cause" in text and "what the counts share" not in text
    assert (
        "its whole measured window ran slower (its median 57.52 ms against 53.12 and 53.28" in text
    )
    g.loc[5, "median_ms"] = 53.5
    assert "(its median, 53.50 ms, is what the counts share)" in answers.warmup_after(g)


def test_a_pass_range_runs_from_the_shortest_to_the_longest():
    """The four-H200 run's bf16 backward: large's 99.13 ms is longer than xl's 98.11."""
    g = pd.DataFrame({"size": ["small", "large", "xl"], "backward_ms": [18.58, 99.13, 98.11]})
    assert answers._span(g, "backward_ms") == "18.58 ms (`small`) to 99.13 ms (`large`)"


def test_varying_points_are_named_with_their_context_and_their_neighbours(tmp_path):
    """Two contexts of one size are two points, named apart; a point measured beside other jobs
    is counted as such."""
    d = pd.DataFrame(
        {"size": ["tiny", "tiny"], "context_length": [32, 64], "mode": ["forward"] * 2,
         "precision": ["fp32"] * 2, "compile": ["eager"] * 2, "attention": ["naive"] * 2,
         "step_ms_mean": [10.0, 20.0], "step_ms_std": [2.0, 4.0],
         "measured_beside": ["", "benchmark small"]}
    )  # fmt: skip
    text = answers.variability(d, 3, "cpu")
    assert "`tiny` at 32 forward fp32 eager, naive attention (20.0%)" in text
    assert "`tiny` at 64 forward" in text
    assert text.endswith("1 of them ran beside other jobs (see Suspect numbers).")


def test_other_attentions_give_their_speedup_without_host_bound_pairs():
    """The four-H200 run: sdpa's bf16 speedup 1.07× over 3 points, two of them host-bound: the
    sentence says so and gives the one pair left, as naive's headline does."""
    keys = {"context_length": 512, "compile": "eager", "attention": "sdpa"}
    sp = pd.DataFrame([{**keys, "size": s, "mode": m, "speedup": v} for s, m, v in
                       (("small", "forward", 0.95), ("small", "train_step", 1.07),
                        ("xl", "forward", 1.40))])  # fmt: skip
    hb = sp[sp["size"] == "small"].drop(columns="speedup")
    text = answers.other_attentions(sp, hb)
    assert text.startswith("sdpa attention: 1.07× (0.95–1.40× across 3 points)")
    assert text.endswith("(2 pairs host-bound; without them 1.40× (one point))")
    assert "host-bound" not in answers.other_attentions(sp)


def test_q1_ratios_leave_out_a_backward_shorter_than_its_forward():
    """The 0.80× point (backward 17.97 ms against forward 22.44) is marked suspect: neither the
    median, the range nor the extremes rest on it, and the sentences say one point left out."""
    r = pd.DataFrame({"size": ["tiny", "tiny", "small", "small"],
                      "context_length": [32, 64, 32, 64], "precision": "fp32",
                      "forward_ms": [12.94, 22.44, 358.0, 699.0],
                      "backward_ms": [13.91, 17.97, 717.0, 1269.0]})  # fmt: skip
    r["ratio"] = r["backward_ms"] / r["forward_ms"]
    text = answers.backward_sentences(r, r)["fp32"]
    assert text.startswith("1.82× (1.07–2.00× across 3 size/context points")
    assert "1 point left out: suspect, see its note" in text
    ends = answers.backward_extremes(r)
    assert "smallest 1.07× (tiny, context 32, fp32)" in ends and "0.80" not in ends
    assert answers.backward_extremes(r[r["size"] == "tiny"]) == ""


def test_the_phase_ratio_leaves_out_a_backward_shorter_than_its_forward():
    """The four-H200 bf16 phases: `large`'s backward (76.96 ms) is shorter than its forward
    (78.68 ms), flagged suspect, so the ratio's median and range rest on `medium` and `xl` only,
    and the sentence says one point left out; the host-bound note sits above (`see above`)."""
    g = pd.DataFrame({"size": ["small", "medium", "large", "xl"],
                      "fwd_ms_median": [21.17, 29.80, 78.68, 59.61],
                      "bwd_ms_median": [21.35, 47.14, 76.96, 99.58],
                      "opt_ms_median": [1.83, 4.47, 10.80, 27.45],
                      "step_ms_median": [44.25, 82.71, 169.0, 188.0]}).set_index("size")  # fmt: skip
    d = pd.DataFrame(columns=["size", "context_length", "precision", "compile", "attention",
                              "mode", "step_ms_mean"])  # fmt: skip
    hb = pd.DataFrame({"size": ["small"], "context_length": [512], "precision": ["bf16"],
                       "compile": ["eager"], "attention": ["naive"]})  # fmt: skip
    text = answers.phase_sentence(d, g, "bf16", 512, hb)
    assert "backward 1.63× (median; 1.58× at `medium` to 1.67× at `xl`) the forward time " in text
    assert "(1 point left out: suspect, see its note)" in text and "0.98×" not in text
    assert "host-bound, see above)" in text and "see below" not in text
    assert "`large`'s backward (76.96 ms) is shorter than its forward (78.68 ms)" in text
    g["sanity"] = ["", "", "", "suspect: noisy"]
    g["sanity_scope"] = ["", "", "", "time"]
    text = answers.phase_sentence(d, g, "bf16", 512, hb)
    assert "backward 1.58× (`medium`) the forward time (1 point left out: suspect, see its " in text
    assert "note; 1 point left out: suspect, see Suspect numbers)" in text
