"""The figures' one style: matplotlib on its Agg backend (no display), text in PDF and PostScript
as TrueType (Type 42) fonts, not Type 3: a write-up's figures keep searchable, editable text and
pass the font checks of venues that refuse Type 3. Every figure of the package is drawn after
`use_figure_style()` (reporting/analysis.py at import, profiling/memory_snapshot.py)."""

from __future__ import annotations

FIGURE_RC = {"pdf.fonttype": 42, "ps.fonttype": 42}


def use_figure_style() -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update(FIGURE_RC)
