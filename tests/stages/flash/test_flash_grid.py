"""The flash sweep's grid as the handout asks it: a capped point's computed reason, the
headline speed-ups over the points that are not host-bound, the deviation of a smaller grid,
and figures that draw (or say why not) when every row is skipped or failed."""

from __future__ import annotations

import pandas as pd
import pytest
from fixture_rows import prov, write_results
from PIL import Image

from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.flash import analysis as flash_analysis
from cs336_systems.stages.flash import answers, jobs
from cs336_systems.stages.flash.plan import TUNE_STEPS


def point(impl, n, fwd, bwd, fb, dtype="bf16", d=64, status="ok"):
    return {**prov(gpus=1), "device": "cuda", "grid": "sweep", "impl": impl, "dtype": dtype,
            "batch_size": 1, "heads": 1, "seq_len": n, "d_head": d, "status": status,
            "fwd_ms_median": fwd, "bwd_ms_median": bwd, "fwd_bwd_ms_median": fb}  # fmt: skip


def test_a_capped_point_says_what_it_would_cost():
    """Seconds from the longest point of the same implementation, dtype and head dim (n^2),
    times the timed calls and our kernel's autotuning; the (n x n) memory where it holds one."""
    done = [point("flash_triton", 16384, 1, 2, 3, "fp32"), point("flash_triton", 32768, 10, 20,
            30, "fp32"), point("flash_triton", 32768, 1, 1, 1, "fp32", d=16)]  # fmt: skip
    row = point("flash_triton", 65536, None, None, None, "fp32")
    step = 30 * 4
    assert jobs.cap_cost(done, row) == (
        f"about {step * (8 + TUNE_STEPS) / 1e3:.0f} s: a {step} ms forward+backward (n^2 from "
        f"30 ms at n = 32768) x {8 + TUNE_STEPS} calls with autotuning"
    )
    on_cpu = jobs.cap_cost([{**r, "device": "cpu"} for r in done], {**row, "device": "cpu"})
    assert on_cpu.endswith("x 8 calls")  # the interpreter has no autotuner
    pt = jobs.cap_cost([], point("flash_pytorch", 65536, None, None, None, "fp32"))
    assert pt == "its (n x n) scores hold 16.0 GiB"  # 65536^2 fp32, nothing ran to time


def test_the_cap_reason_reaches_the_row(tmp_path):
    from test_flash import flash_sweep

    from cs336_systems.stages.flash import measure

    out = tmp_path / "fp32.csv"
    measure.main(flash_sweep(out, ["naive_eager"], [32, 64], max_seq_len={"naive_eager": 32}))
    df = pd.read_csv(out).set_index("seq_len")
    assert df.loc[32, "status"] == "ok"
    why = df.loc[64, "status"]
    assert why.startswith("skipped: n above this preset's max_seq_len 32 for naive_eager (")
    assert "n^2 from" in why and "at n = 32) x 8 calls" in why


def test_the_headline_speedup_leaves_host_bound_points_out():
    """Naive at n = 128 is host-bound by its own numbers (1.0 against 0.2 + 0.3), ours at
    n = 256 (0.5 against 0.1 + 0.2): only n = 1024 and 4096 count, and the sentence says so."""
    rows = [
        point("naive_eager", 128, 0.2, 0.3, 1.0), point("flash_triton", 128, 0.05, 0.1, 0.16),
        point("naive_eager", 256, 0.3, 0.5, 0.8), point("flash_triton", 256, 0.1, 0.2, 0.5),
        point("naive_eager", 1024, 1.0, 2.0, 3.0), point("flash_triton", 1024, 0.2, 0.4, 0.6),
        point("naive_eager", 4096, 10, 20, 30), point("flash_triton", 4096, 1, 2, 3),
    ]  # fmt: skip
    (line,) = answers.speedup_sentences(pd.DataFrame(rows))
    assert line.startswith("bf16: our Triton kernel against naive (eager) on forward+backward: "
                           "7.50× faster (median over 2 of 4 points, n = 1,024–4,096; their "
                           "time / ours from 5 to 10)")  # fmt: skip
    assert line.endswith("left out: 2 host-bound points (forward+backward above 1.25× forward "
                         "plus backward: ours at 1 (n = 256); theirs at 1 (n = 128)).")  # fmt: skip
    # every point host-bound: no speed-up is given, and the sentence says why
    (none,) = answers.speedup_sentences(pd.DataFrame(rows[:4]))
    assert "no point of 2 is free of host overhead" in none and "×" in none.split(";")[1]


def test_a_smaller_grid_says_it_deviates_from_the_handouts():
    whole = [2**i for i in range(7, 17)]
    assert answers.grid_deviation(whole, [16, 32, 64, 128], ["bf16", "fp32"]) == ""
    text = answers.grid_deviation([64, 128], [16, 32], ["fp32"])
    assert text.startswith("This run deviates from the handout's grid")
    assert "n = 256, 512, 1,024, 2,048, 4,096, 8,192, 16,384, 32,768, 65,536 not run" in text
    assert "n = 64 added" in text and "d = 64, 128 not run" in text and "dtype = bf16 not" in text


@pytest.mark.parametrize(
    "status", ["skipped: kernel tests did not check flash_triton (no test of it selected)",
               "error: RuntimeError: No available kernel", "oom"],
)  # fmt: skip
def test_every_figure_draws_when_no_row_ran(tmp_path, status):
    """All rows skipped (a kernel filter that selects no test), failed or out of memory: each
    figure is drawn with a note, or is a placeholder that says why, and the section renders."""
    rows = [point(i, n, None, None, None, dt, d, status) for i in ("flash_triton", "naive_eager")
            for n in (128, 256) for dt in ("bf16", "fp32") for d in (16, 32)]  # fmt: skip
    results = write_results(tmp_path / "r", flash=pd.DataFrame(rows))
    paths = flash_analysis.plot(results, tmp_path / "f")
    assert [p.name for p in paths] == ["flash_latency.png", "flash_tflops.png", "flash_speedup.png"]
    for p in paths:
        with Image.open(p) as im:
            assert im.size[0] > 100
    assert "no successful point" in placeholder_reason(paths[2])
    ctx = flash_analysis.context(results)
    assert ctx["speedups"] == [] and ctx["tflops"] == ""


def grid_rows() -> pd.DataFrame:
    """The gpu preset's grid with times shaped like the H100's: host-bound short lengths, n^2
    beyond; naive fp32 out of memory at 65536."""
    rows = []
    for dt in ("bf16", "fp32"):
        for d in (16, 32, 64, 128):
            for i in range(7, 17):
                n = 2**i
                for impl, scale in (("naive_eager", 8.0), ("flash_triton", 1.0)):
                    t = 0.05 + scale * d * n * n / 2e12 * (4 if dt == "fp32" else 1)
                    oom = impl == "naive_eager" and dt == "fp32" and n == 65536
                    r = point(impl, n, t, 2 * t, 3.2 * t + 0.2, dt, d, "oom" if oom else "ok")
                    rows.append({**r, "fwd_bwd_tflops": d * n * n * 7e-12 / t})
    return pd.DataFrame(rows)


def test_no_label_collides_in_the_figures(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from figure_checks import capture, overlaps

    from cs336_systems.stages.flash import figures

    # the check itself: two labels at one place collide
    fig, ax = plt.subplots()
    ax.set_title("a title")
    ax.text(0.5, 1.02, "a title", transform=ax.transAxes, ha="center")
    assert overlaps(fig) == [("a title", "a title")]
    plt.close(fig)
    figs = capture(monkeypatch, figures)
    flash_analysis.plot(write_results(tmp_path / "r", flash=grid_rows()), tmp_path / "f")
    assert len(figs) == 3
    for fig in figs:
        assert overlaps(fig) == [], fig.texts


def test_the_latency_table_marks_the_host_bound_speedups():
    from cs336_systems.stages.flash.rows import triton_vs_pytorch_table

    rows = [point("naive_eager", 128, 0.2, 0.3, 1.0), point("flash_triton", 128, 0.05, 0.1, 0.16),
            point("naive_eager", 4096, 10, 20, 30), point("flash_triton", 4096, 1, 2, 3)]  # fmt: skip
    table = triton_vs_pytorch_table(pd.DataFrame(rows), "bf16")
    assert "6.2× (host-bound)" in table  # naive at n = 128: 1.0 against 0.2 + 0.3
    assert "| 10×" in table and "10× (host" not in table
