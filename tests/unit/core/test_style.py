"""The figures' one style (core/style.py): PDFs with TrueType (Type 42) fonts, not Type 3."""

from __future__ import annotations

import matplotlib

from cs336_systems.core.style import use_figure_style


def test_a_figure_pdf_embeds_truetype_fonts(tmp_path):
    use_figure_style()
    import matplotlib.pyplot as plt

    assert matplotlib.get_backend().lower() == "agg"
    fig, ax = plt.subplots()
    ax.set_title("a title: 1.5 ms")
    fig.savefig(tmp_path / "f.pdf")
    plt.close(fig)
    data = (tmp_path / "f.pdf").read_bytes()
    assert b"/FontFile2" in data and b"/Type3" not in data
