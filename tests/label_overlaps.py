"""Rendered figures' text that collides: every drawn label (titles, axis labels, tick labels,
legend entries, texts) as its box on the canvas, and the pairs of boxes that overlap.
`capture(monkeypatch, module)` keeps the figures a stage's figures module saves, laid out as
reporting/analysis.py `save` lays them out."""

from __future__ import annotations

from itertools import combinations

from matplotlib.figure import Figure

# boxes may touch: a pixel of overlap is antialiasing, not a collision
SLACK_PX = 1.0


def _drawn_ticklabels(ax, axis) -> list:
    """The tick labels drawn: visible, with text, at a tick inside the axes' view."""
    lo, hi = sorted(ax.get_xlim() if axis is ax.xaxis else ax.get_ylim())
    return [
        label
        for tick, label in zip(axis.get_major_locator()(), axis.get_ticklabels(), strict=False)
        if lo <= tick <= hi and label.get_visible() and label.get_text()
    ]


def texts(fig: Figure) -> list:
    """Every text the figure draws, with something in it."""
    found = [*fig.texts, *(t for legend in fig.legends for t in legend.get_texts())]
    if fig._suptitle is not None:
        found.append(fig._suptitle)
    for ax in fig.axes:
        found += list(ax.texts)
        if not ax.axison:
            continue
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        found += _drawn_ticklabels(ax, ax.xaxis) + _drawn_ticklabels(ax, ax.yaxis)
        if ax.get_legend() is not None:
            found += ax.get_legend().get_texts()
    unique = {id(t): t for t in found}.values()  # the suptitle is among fig.texts too
    return [t for t in unique if t.get_visible() and t.get_text().strip()]


def overlaps(fig: Figure) -> list[tuple[str, str]]:
    """The pairs of drawn texts whose boxes overlap by more than SLACK_PX each way."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    bad = []
    for (a, ba), (b, bb) in combinations(boxes, 2):
        dx = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        dy = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if dx > SLACK_PX and dy > SLACK_PX:
            bad.append((a, b))
    return bad


def capture(monkeypatch, module) -> list[Figure]:
    """The figures `module` (a stage's figures.py) saves from now on, laid out as `save` lays
    them out (tight unless told not) and kept open for checking."""
    kept: list[Figure] = []

    def keep(fig, path, tight: bool = True, metadata=None):
        if tight:
            fig.tight_layout()
        kept.append(fig)
        return path

    monkeypatch.setattr(module, "save", keep)
    return kept
