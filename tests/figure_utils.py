"""What a rendered figure looks like to a reader: the text boxes that collide.

`drawn_figures(module)` catches every figure a figures module saves (its `save` patched to
keep the figure, laid out as `save` lays it out, before handing it on); `text_overlaps(fig)`
names each pair of visible texts whose boxes on the rendered canvas overlap (tick labels,
axis labels, titles, legend entries, annotations)."""

from __future__ import annotations

import contextlib
from itertools import combinations

from matplotlib.text import Text


def _undrawn_ticks(fig) -> set[int]:
    """The tick labels matplotlib keeps for ticks outside their axis' view (never drawn)."""
    out = set()
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lo, hi), max(lo, hi)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - 1e-9 * abs(hi - lo) <= tick.get_loc() <= hi + 1e-9 * abs(hi - lo):
                    out.update({id(tick.label1), id(tick.label2)})
    return out


def visible_texts(fig, renderer) -> list[tuple[str, object]]:
    """(text, its box in display pixels) of every visible, non-empty text of `fig` that is
    drawn (tick labels outside their axis' view are not)."""
    out = []
    undrawn = _undrawn_ticks(fig)
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or id(t) in undrawn:
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        out.append((t.get_text(), t.get_window_extent(renderer)))
    return out


def text_overlaps(fig, pad: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of texts whose rendered boxes overlap by more than `pad` pixels each way."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = visible_texts(fig, renderer)
    hits = []
    for (a, ba), (b, bb) in combinations(boxes, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if w > pad and h > pad:
            hits.append((a, b))
    return hits


@contextlib.contextmanager
def drawn_figures(monkeypatch, module):
    """Every figure `module` saves through its `save` (laid out as `save` does), with its path:
    a list filled while the block runs."""
    caught: list[tuple[object, list[tuple[str, str]]]] = []
    original = module.save

    def keep(fig, path, tight: bool = True, **kwargs):
        if tight:
            fig.tight_layout()
        caught.append((path, text_overlaps(fig)))
        return original(fig, path, tight=False, **kwargs)

    monkeypatch.setattr(module, "save", keep)
    yield caught
