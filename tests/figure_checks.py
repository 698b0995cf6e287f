"""Checks of the figures a stage's `analysis.plot` draws: every text artist (titles, axis labels,
tick labels, legend entries, annotations) clear of every other one, checked as each figure is
saved as PNG (`collisions_while`)."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402


def _axes_texts(ax) -> list[Text]:
    texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
    texts += [ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
    for axis in (ax.xaxis, ax.yaxis):
        if not ax.axison:  # `axis("off")`: no tick label is drawn
            break
        for tick in axis._update_ticks():  # the ticks drawn: those inside the view
            texts += [tick.label1, tick.label2]
    texts += list(ax.texts)
    for child in ax.get_children():
        if isinstance(child, Text) and child not in texts:
            texts.append(child)
    legend = ax.get_legend()
    if legend is not None and legend.get_visible():
        texts += [*legend.get_texts(), legend.get_title()]
    return texts


def figure_texts(fig: Figure) -> list[Text]:
    """The figure's visible, non-empty text artists."""
    texts: list[Text] = list(fig.texts)
    for name in ("_suptitle", "_supxlabel", "_supylabel"):
        if getattr(fig, name, None) is not None:
            texts.append(getattr(fig, name))
    for legend in fig.legends:
        texts += [*legend.get_texts(), legend.get_title()]
    for ax in fig.axes:
        if ax.get_visible():
            texts += _axes_texts(ax)
    seen, out = set(), []
    for t in texts:
        if id(t) in seen or not t.get_visible() or not t.get_text().strip():
            continue
        seen.add(id(t))
        out.append(t)
    return out


def _box(t: Text, renderer) -> np.ndarray:
    """The four corners of the text's drawn box in pixels: its extent, or for rotated text the
    rotated rectangle of its width and height about the extent's centre (a 30° tick label's
    axis-aligned extent covers its neighbours where the glyphs do not)."""
    ext = t.get_window_extent(renderer)
    angle = np.deg2rad(t.get_rotation() % 180)
    if np.isclose(np.sin(angle), 0) or "\n" in t.get_text():
        return np.array([[ext.x0, ext.y0], [ext.x1, ext.y0], [ext.x1, ext.y1], [ext.x0, ext.y1]])
    w, h, _ = renderer.get_text_width_height_descent(t.get_text(), t.get_fontproperties(), False)
    along, across = (
        np.array([np.cos(angle), np.sin(angle)]),
        np.array([-np.sin(angle), np.cos(angle)]),
    )
    centre = np.array([(ext.x0 + ext.x1) / 2, (ext.y0 + ext.y1) / 2])
    return np.array([centre + sx * w / 2 * along + sy * h / 2 * across
                     for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))])  # fmt: skip


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """How far two convex quadrilaterals overlap (pixels, along the axis where they overlap
    least; <= 0: apart), by the separating axis theorem."""
    least = np.inf
    for poly in (a, b):
        for i in range(4):
            edge = poly[(i + 1) % 4] - poly[i]
            axis = np.array([-edge[1], edge[0]]) / (np.hypot(*edge) or 1.0)
            pa, pb = a @ axis, b @ axis
            least = min(least, min(pa.max(), pb.max()) - max(pa.min(), pb.min()))
    return float(least)


def collisions(fig: Figure, slack: float = 2.0) -> list[tuple[str, str, float]]:
    """Pairs of text artists whose drawn boxes overlap by more than `slack` pixels, with the
    overlap. The figure is drawn again first: a savefig at another dpi leaves some artists
    (legends) placed for that dpi."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = []
    for t in figure_texts(fig):
        try:
            boxes.append((t.get_text(), _box(t, renderer)))
        except (RuntimeError, ValueError):
            continue
    out = []
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        if (depth := _overlap(ba, bb)) > slack:
            out.append((a, b, round(depth, 1)))
    return out


@contextlib.contextmanager
def collisions_while(vector: bool = True):
    """{PNG path: colliding text pairs} of every figure saved inside the block; `vector=False`
    leaves out the PDF copies (the same drawing: their writing is most of a figure's time)."""
    found: dict[str, list[tuple[str, str]]] = {}
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        if not vector and str(fname).endswith(".pdf"):
            return None
        result = original(self, fname, *args, **kwargs)
        if str(fname).endswith(".png"):
            found[Path(fname).name] = collisions(self)
        return result

    Figure.savefig = savefig
    try:
        yield found
    finally:
        Figure.savefig = original


def overlaps(fig: Figure) -> list[tuple[str, str]]:
    """The colliding text pairs of `fig` (`collisions` without the depth)."""
    return [(a, b) for a, b, _ in collisions(fig)]


def capture(monkeypatch, module) -> list[Figure]:
    """The figures `module` (a stage's figures.py) saves from now on, laid out as its `save`
    lays them out (tight unless told not) and kept open for checking."""
    kept: list[Figure] = []

    def keep(fig, path, tight: bool = True, **kwargs):
        if tight:
            fig.tight_layout()
        kept.append(fig)
        return path

    monkeypatch.setattr(module, "save", keep)
    return kept


@contextlib.contextmanager
def drawn_figures(monkeypatch, module):
    """[(path, its colliding pairs)] of every figure `module` saves inside the block (saved as
    its `save` saves it)."""
    caught: list[tuple[object, list[tuple[str, str]]]] = []
    original = module.save

    def keep(fig, path, tight: bool = True, **kwargs):
        if tight:
            fig.tight_layout()
        caught.append((path, overlaps(fig)))
        return original(fig, path, tight=False, **kwargs)

    monkeypatch.setattr(module, "save", keep)
    yield caught
