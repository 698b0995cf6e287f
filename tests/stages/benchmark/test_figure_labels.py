"""The benchmark, profile and precision figures, drawn from the committed references' CSVs:
no two of a figure's texts (tick labels, axis labels, titles, legend entries) overlap."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import matplotlib
import matplotlib.figure
import pytest
from matplotlib.text import Text

ROOT = Path(__file__).resolve().parents[3]
STAGES = ("benchmark", "profile", "precision")


def collisions(fig) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes overlap by more than a pixel each way (a tick label
    outside the view is not drawn: only texts inside the figure count)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    whole = fig.bbox
    boxes = []
    for t in fig.findobj(Text):
        if not (t.get_visible() and t.get_text().strip()):
            continue
        b = t.get_window_extent(renderer)
        if b.width > 0 and b.overlaps(whole):
            boxes.append((t.get_text(), b))
    out = []
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        if w > 1 and h > 1:
            out.append((ta[:40], tb[:40]))
    return out


@pytest.mark.parametrize("reference", ["h100-80gb-hbm3", "h100-80gb-hbm3-2025", "cpu"])
def test_no_two_labels_of_a_figure_collide(reference, tmp_path, monkeypatch):
    matplotlib.use("Agg")
    found: dict[str, list] = {}
    save = matplotlib.figure.Figure.savefig

    def check_then_save(fig, fname, *a, **k):
        if str(fname).endswith(".png"):
            found[Path(str(fname)).name] = collisions(fig)
        return save(fig, fname, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", check_then_save)
    csv = ROOT / "report" / "reference" / reference / "csv"
    for stage in STAGES:
        importlib.import_module(f"cs336_systems.stages.{stage}.analysis").plot(csv, tmp_path)
    assert len(found) >= 8, sorted(found)
    assert not {k: v for k, v in found.items() if v}
