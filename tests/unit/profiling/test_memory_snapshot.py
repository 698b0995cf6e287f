"""profiling/memory_snapshot.py: memory_viz's "Active Memory Timeline" (every live block a band,
stacked in allocation order) on a hand-made trace, checked number by number, and drawn from a
snapshot captured on a GPU (tests/fixtures/gpu/memory_snapshot.pickle), its labels apart."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from pipeline_utils import ROOT

from cs336_systems.profiling import memory_snapshot as mem

SNAPSHOT_FIXTURE = ROOT / "tests" / "fixtures" / "gpu" / "memory_snapshot.pickle"
MARKER = "/work/main/src/cs336_systems/stages/memory/measure.py"


def _frame(name, filename="/work/main/src/cs336_systems/model.py", line=10):
    return {"filename": filename, "line": line, "name": name}


def _trace(times: bool) -> dict:
    """5000 (2048 B) and 1000 (4096 B) live before the trace (5000 freed in it); 3000 allocated
    in it and live at the end; phase markers at forward and backward; `times`: time_us given."""
    events = [
        ("alloc", 50, 512, [_frame("_memory_mark_forward", MARKER)]),
        ("free_completed", 50, 512, []),
        ("alloc", 3000, 1024, [_frame("forward")]),
        ("alloc", 4000, 8192, [_frame("forward", line=42)]),
        ("free_requested", 4000, 8192, []),
        ("free_completed", 4000, 8192, []),
        ("free_completed", 5000, 2048, []),
        ("alloc", 60, 512, [_frame("_memory_mark_backward", MARKER)]),
        ("free_completed", 60, 512, []),
        ("alloc", 6000, 16384, []),
        ("free_completed", 6000, 16384, []),
    ]
    trace = []
    for i, (action, addr, size, frames) in enumerate(events):
        e = {"action": action, "addr": addr, "size": size, "frames": frames}
        if times:  # 1 ms per event in forward, 3 ms per event from backward on
            e["time_us"] = 10_000_000 + 1000 * (i if i < 7 else 7 + 3 * (i - 7))
        trace.append(e)
    blocks = [
        {"address": 1000, "size": 4096, "state": "active_allocated"},
        {"address": 2000, "size": 512, "state": "inactive"},
        {"address": 3000, "size": 1024, "state": "active_allocated"},
    ]
    return {"segments": [{"device": 0, "blocks": blocks}], "device_traces": [trace]}


def _band(bands: dict, size: int) -> dict:
    (b,) = [b for b in bands["bands"] if b["size"] == size]
    return b


def test_blocks_stack_in_allocation_order_and_drop_when_one_below_is_freed():
    bands = mem.stack_bands(_trace(times=False))
    assert bands["xlabel"].startswith("allocator event")  # no time_us: memory_viz's own axis
    assert bands["baseline_bytes"] == 2048 + 4096
    # before the trace: 5000 at the bottom, 1000 on it; both from the axis's start
    first, second = _band(bands, 2048), _band(bands, 4096)
    assert (first["xs"], first["ys"]) == ([0, 6], [0, 0])  # ends where it is freed
    # 1000 drops by 5000's 2048 bytes at event 6, then lives to the end (event 10)
    assert (second["xs"], second["ys"]) == ([0, 6, 6, 10], [2048, 2048, 0, 0])
    # 3000 (allocated at event 2 on top of the 6144 bytes below) drops the same way
    b = _band(bands, 1024)
    assert (b["xs"], b["ys"]) == ([2, 6, 6, 10], [6144, 6144, 4096, 4096])
    # 4000 on top of 3000, freed at event 5 (free_completed: free_requested is not a free)
    b = _band(bands, 8192)
    assert (b["xs"], b["ys"]) == ([3, 5], [7168, 7168])
    # 6000: allocated after the drop, on 1000 and 3000
    assert _band(bands, 16384)["ys"][0] == 4096 + 1024
    assert bands["summarized"] == 0


def test_blocks_past_max_drawn_are_summed_in_one_band_on_top():
    bands = mem.stack_bands(_trace(times=False), max_drawn=2)
    assert sorted(b["size"] for b in bands["bands"]) == [8192, 16384]
    assert bands["summarized"] == 5
    xs, bottoms, sizes = bands["summary"]
    # at the start: every block live before the trace summed (none of them drawn)
    assert (bottoms[0], sizes[0]) == (0, 2048 + 4096) and sizes[1] == 2048 + 4096 + 512
    # after event 3 (8192 drawn, on nothing drawn): the summed band sits on it
    assert (bottoms[4], sizes[4]) == (8192, 2048 + 4096 + 1024)
    assert sizes[-1] == 4096 + 1024  # what is live at the end


def test_time_axis_and_phases_with_their_real_width():
    snap = _trace(times=True)
    bands = mem.stack_bands(snap)
    assert bands["xlabel"].startswith("time since the first allocator event (ms")
    assert list(bands["x"][:3]) == [0.0, 1.0, 2.0] and bands["end"] == 7.0 + 3 * 3
    spans = mem.phase_times(mem.active_timeline(snap), bands["x"])
    # forward from its marker (0 ms) to backward's (7 ms); backward to the last event
    assert spans == [("forward", 0.0, 7.0), ("backward", 7.0, 16.0)]


def _texts(fig) -> list:
    """Every text drawn: titles, axis labels, numbers on bands, the figure's texts, the
    legend's entries and title."""
    out = list(fig.texts)
    for ax in fig.axes:
        out += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
    for leg in fig.legends:
        out += [*leg.get_texts(), leg.get_title()]
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def _render(snapshot, path, monkeypatch) -> list:
    """Draw the figure, keeping the extents of its texts as saved."""
    kept: dict = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        out = real(fig, *a, **k)
        if "texts" not in kept:
            renderer = fig.canvas.get_renderer()
            kept["texts"] = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
        return out

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    png = mem.render_active_memory(snapshot, path, "test point")
    assert png.exists() and png.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
    return kept["texts"]


def _collisions(texts) -> list:
    return [
        (a, b)
        for (a, ea), (b, eb) in itertools.combinations(texts, 2)
        if ea.overlaps(eb) and ea.width > 0 and eb.width > 0
    ]


def test_the_figure_names_phases_with_durations_and_labels_do_not_collide(tmp_path, monkeypatch):
    texts = _render(_trace(times=True), tmp_path / "t.png", monkeypatch)
    names = [t for t, _ in texts]
    assert "forward: 7 ms" in names and "backward: 9 ms" in names
    # the largest allocation (6000, 16 KiB, made by the autograd engine) is number 1
    (below,) = [t for t in names if t.startswith("The largest allocations")]
    assert "1: 16.0 KiB, in backward, at no Python frames" in below
    assert "model.py:42 forward" in below
    assert _collisions(texts) == []


def test_a_trace_without_phase_markers_draws_without_a_legend(tmp_path, monkeypatch):
    snap = _trace(times=False)
    trace = snap["device_traces"][0]
    snap["device_traces"][0] = [e for e in trace if e["addr"] not in (50, 60)]
    texts = _render(snap, tmp_path / "t.png", monkeypatch)
    assert not any(t.endswith(" events") for t, _ in texts)  # no phase, no legend
    assert any(t.startswith("The largest allocations") for t, _ in texts)
    empty = {"segments": [], "device_traces": [[]]}
    texts = _render(empty, tmp_path / "e.png", monkeypatch)
    assert any(t.startswith("test point") for t, _ in texts)


@pytest.mark.skipif(not SNAPSHOT_FIXTURE.exists(), reason="no captured snapshot")
def test_the_captured_snapshot_as_memory_viz_draws_it(tmp_path, monkeypatch):
    snap = mem.load_snapshot(SNAPSHOT_FIXTURE)
    bands = mem.stack_bands(snap)
    # what the bands hold at the end is what the snapshot's segments hold active
    active_end = sum(
        b["size"]
        for seg in snap["segments"]
        for b in seg["blocks"]
        if b["state"] in ("active_allocated", "active_pending_free")
    )
    live = [b for b in bands["bands"] if b.get("live")]
    assert sum(b["size"] for b in live) == active_end
    # stacked: no band starts below zero or above the blocks live then
    assert min(min(b["ys"]) for b in bands["bands"]) >= 0
    spans = dict((p, (a, b)) for p, a, b in mem.phase_times(mem.active_timeline(snap), bands["x"]))
    assert spans["optimizer"][1] > spans["optimizer"][0]  # the optimizer has a width
    texts = _render(snap, tmp_path / "real.png", monkeypatch)
    numbers = [t for t, _ in texts if t.isdigit()]
    assert numbers and set(numbers) <= {str(k) for k in range(1, mem.LABELLED + 1)}
    assert _collisions(texts) == []


def test_numbers_on_thin_bands_side_by_side_are_moved_apart(tmp_path, monkeypatch):
    """Six 1 MiB blocks stacked on a 1 GiB one (a layer's equal tensors on the weights): their
    middles are a pixel apart, so the numbers go elsewhere along the bands, or are left off
    (and the line below says so), never over each other."""
    trace = [
        {"action": "alloc", "addr": 100 + i, "size": 2**20, "frames": [_frame("forward", line=i)]}
        for i in range(6)
    ]
    trace += [{"action": "free_completed", "addr": 100 + i, "size": 2**20} for i in range(6)]
    for i, e in enumerate(trace):  # allocated within 6 µs, freed 10 ms later
        e["time_us"] = 1_000_000 + i + (10_000 if i >= 6 else 0)
    big = {"address": 1, "size": 2**30, "state": "active_allocated"}
    snap = {"segments": [{"blocks": [big]}], "device_traces": [trace]}
    texts = _render(snap, tmp_path / "thin.png", monkeypatch)
    numbers = [t for t, _ in texts if t.isdigit()]
    (below,) = [t for t, _ in texts if t.startswith("The largest allocations")]
    assert len(numbers) + below.count("not marked") == mem.LABELLED
    assert _collisions(texts) == []
