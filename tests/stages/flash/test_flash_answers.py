"""The FlashAttention section's notes (flash/answers.py) and its near-peak check: the latency
table's caption names only the columns it has, host-bound forward+backward points are said to
measure the host, and a pass within 10% of the GEMM peak is flagged for a re-measurement."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.stages.flash import answers


def rows(fwd, bwd, fb, n=(128, 1024, 16384)):
    return pd.DataFrame(
        {"impl": "flash_triton", "dtype": "bf16", "d_head": 16, "seq_len": list(n),
         "fwd_ms_median": fwd, "bwd_ms_median": bwd, "fwd_bwd_ms_median": fb}
    )  # fmt: skip


def test_the_caption_names_only_the_columns_the_table_has():
    assert answers.pair_caption(["naive_eager", "flash_triton"]) == (
        "naive PyTorch attention (`naive`) and our FlashAttention-2 in Triton (`FA2-triton`)"
    )
    assert "PyTorch (`FA2-pt`)" in answers.pair_caption(
        ["naive_eager", "flash_pytorch", "flash_triton"]
    )


def test_host_bound_points_are_named():
    d = rows([0.02, 0.018, 2.0], [0.1, 0.129, 5.0], [0.3, 0.487, 7.05])
    note = answers.host_note(d)
    assert note.startswith("At 2 points of 3 (n up to 1,024)")
    assert "0.018 + 0.129 against 0.487 ms" in note
    assert "from n = 16,384 on the two agree within 25%" in note
    assert "the host's" in answers.host_note(rows([1.0] * 3, [2.0] * 3, [3.0] * 3))


def test_a_rate_near_the_gemm_peak_is_flagged():
    ceilings = pd.DataFrame(
        [{"kind": "matmul", "dtype": "bf16", "path": "matmul", "status": "ok", "tflops": 773.0}]
    )
    df = pd.DataFrame({"dtype": ["bf16", "bf16"], "fwd_tflops": [720.0, 500.0], "status": "ok"})
    flags = sanity.rate_above_ceiling(
        df, ["fwd_tflops"], ceilings=ceilings, fraction=0.9, why="measure it again"
    )
    assert flags[0] == "fwd_tflops 720 93% of the measured bf16 matmul peak 773: measure it again"
    assert flags[1] == ""
    above = sanity.rate_above_ceiling(df.assign(fwd_tflops=[800.0, 1.0]), ["fwd_tflops"],
                                      ceilings=ceilings)  # fmt: skip
    assert above[0].startswith("fwd_tflops 800 above the measured bf16 matmul peak")


def test_the_kernel_tests_figure_counts_tests_and_says_the_time_is_summed(tmp_path, monkeypatch):
    """Parallel workers' test times add up to more than the suite's wall time: the figure
    shows tests per kernel, names the sum as such, and puts the wall time in its title."""
    import matplotlib.pyplot as plt
    from fixture_rows import prov, write_results

    from cs336_systems.stages.kernel_tests import analysis as kt
    from cs336_systems.stages.kernel_tests import figures as kt_figures

    rows = pd.DataFrame(
        [{**prov(), "test": f"t{i}", "kernel": "flash_triton", "outcome": "passed",
          "duration_ms": 10_000.0, "suite_s": 12.0, "pytest_workers": 4, "files": "a.py",
          "cuda_available": False, "message": "", "status": "ok"} for i in range(4)]
    )  # fmt: skip
    results = write_results(tmp_path / "r", kernel_tests=rows)
    seen = {}

    def keep(fig, path, *a, **k):
        seen["title"] = fig._suptitle.get_text()
        seen["xlabels"] = [ax.get_xlabel() for ax in fig.axes]
        plt.close(fig)
        return path

    monkeypatch.setattr(kt_figures, "save", keep)
    kt.plot(results, tmp_path / "fig")
    assert seen["title"] == "Kernel tests: 4 tests, 12 s of wall time"
    assert seen["xlabels"] == ["tests", "test time summed over 4 workers (s)"]
    ctx = kt.context(results)
    assert ctx["workers"] == "4 workers" and ctx["test_s"] == 40.0


def test_a_ratio_that_rounds_onto_the_target_shows_its_third_digit():
    """0.393 against 0.392 ms is 1.003: "not met" beside "1.00" would read as a contradiction."""
    from cs336_systems.stages.flash.rows import ratio

    assert ratio(0.393 / 0.392) == "1.003" and ratio(1.0) == "1.00"
    assert ratio(0.9951) == "0.995" and ratio(1.21) == "1.21"


def test_a_gap_beyond_the_hosts_whole_call_is_not_put_down_to_the_host():
    """The H100 reference's fp32 d = 16, n = 4096: 1.690 ms as one call against 0.202 + 0.502
    timed apart, a 0.99 ms gap where a whole call of ours costs at most 0.6 ms of host time."""
    d = rows(
        [0.038, 0.078, 0.202], [0.125, 0.129, 0.502], [0.519, 0.556, 1.690], n=(128, 1024, 4096)
    )
    assert "Not so" not in answers.host_note(d)  # no device column: not a GPU run's rows
    note = answers.host_note(d.assign(device="cuda"))
    assert "Not so at 1 point (bf16, d = 16, n = 4,096: 1.690 ms against 0.202 + 0.502)" in note
    assert "n = 1,024:" not in note.split("Not so")[1]  # a 0.35 ms gap is the host's
