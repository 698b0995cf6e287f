"""memory_timelines.pdf, the figure of the chosen memory timelines side by side: its PNG shows the
timelines' PNGs, its PDF tiles the timelines' own PDFs, so a write-up's copy stays vector
(stages/memory/figures.py)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from pypdf import PdfReader

from cs336_systems.reporting.analysis import save
from cs336_systems.stages.memory import figures


def timeline(folder, name: str, label: str) -> None:
    fig, ax = plt.subplots(figsize=(4, 2.5))
    ax.fill_between([0, 1, 2], [0, 1, 0.5], color="tab:blue")
    ax.set_title(label)
    save(fig, folder / f"memory_timeline_{name}.png")  # PNG and its PDF, as the measure job


def test_the_timelines_figure_pdf_is_vector(tmp_path):
    folder = tmp_path / "results" / "memory" / "timelines"
    timeline(folder, "a", "forward timeline")
    timeline(folder, "b", "train step timeline")
    fig_dir = tmp_path / "figures"
    fig_dir.mkdir()
    png = figures._timelines_figure(
        tmp_path / "results", pd.DataFrame(), fig_dir, fig_dir / "memory_timelines.png"
    )
    assert png.stat().st_size > 1000
    page = PdfReader(png.with_suffix(".pdf")).pages[0]
    xobjects = page["/Resources"].get("/XObject", {})
    images = [x for x in xobjects.values() if x.get_object().get("/Subtype") == "/Image"]
    assert not images  # no raster: the drawings themselves
    text = page.extract_text()
    assert "forward timeline" in text and "train step timeline" in text
    # both timelines, one above the other (one mode picked: one column), each as large as drawn
    assert float(page.mediabox.width) == 4 * 72 and float(page.mediabox.height) == 2 * 2.5 * 72
    assert text.index("forward timeline") < text.index("train step timeline")
