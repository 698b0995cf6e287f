"""memory_timelines.pdf, the figure of the chosen memory timelines side by side: its PNG shows the
timelines' PNGs, its PDF holds the timelines' own PDFs, a page each, so a write-up's copy stays
vector (stages/memory/figures.py)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
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
    pages = PdfReader(png.with_suffix(".pdf")).pages
    assert len(pages) == 2  # both timelines, in the order chosen
    texts = []
    for page in pages:
        xobjects = page["/Resources"].get("/XObject", {})
        images = [x for x in xobjects.values() if x.get_object().get("/Subtype") == "/Image"]
        assert not images  # no raster: the drawings themselves
        assert float(page.mediabox.width) == 4 * 72 and float(page.mediabox.height) == 2.5 * 72
        texts.append(page.extract_text())
    assert "forward timeline" in texts[0] and "train step timeline" in texts[1]


def test_a_timeline_too_large_to_merge_is_copied_whole(tmp_path):
    """A real timeline's page holds more drawing operators than pypdf parses when it merges a
    page onto another (LimitReachedError on a 4x H200 run's timelines): the pages are copied
    whole, never parsed. pypdf's parsing budget is made tiny here, as a large page meets it."""
    from dataclasses import replace

    from pypdf import PageObject, Transformation
    from pypdf._configuration import CURRENT_CONFIGURATION, get_configuration

    timeline(tmp_path, "a", "forward timeline")
    pdf = tmp_path / "memory_timeline_a.pdf"
    tiny = replace(get_configuration(), stream_parsing_work_maximum_count=10)
    token = CURRENT_CONFIGURATION.set(tiny)
    try:
        sheet = PageObject.create_blank_page(width=600, height=400)
        with pytest.raises(Exception, match="maximum number of tokens"):  # what merging meets
            sheet.merge_transformed_page(PdfReader(pdf).pages[0], Transformation())
        out = figures.join_pdfs([pdf, pdf], tmp_path / "both.pdf")
    finally:
        CURRENT_CONFIGURATION.reset(token)
    assert len(PdfReader(out).pages) == 2
