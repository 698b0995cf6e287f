"""profiling/memory_page.py: the page beside a kept snapshot, its Active Memory Timeline as
inline SVG (a band per block the figure draws, the largest numbered, a table of them), checked
on the hand-made trace of test_memory_snapshot.py and, rendered by headless Chromium with every
host name unresolvable, on the snapshot captured on a GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from test_memory_snapshot import SNAPSHOT_FIXTURE, _trace

from cs336_systems.profiling import memory_page as page
from cs336_systems.profiling import memory_snapshot as mem

BAND = re.compile(r'<polygon class="band" id="block-(\d+)"[^>]*><title>([^<]*)</title>')


def _bands(html: str) -> dict[int, str]:
    """Each band's element id and tooltip."""
    return {int(k): t for k, t in BAND.findall(html)}


def _no_fetch(html: str) -> None:
    """Nothing the page refers to is fetched: no URL with a scheme, every src/href an anchor."""
    assert not re.search(r"https?:|//[a-z]", html, re.I)
    assert all(ref.startswith("#") for ref in re.findall(r'(?:src|href)="([^"]*)"', html))


def test_a_band_per_block_the_largest_numbered_and_nothing_fetched(tmp_path):
    snap = _trace(times=True)
    path = page.write_viz_page(snap, tmp_path / "point.html", "a test point")
    html = path.read_text()
    _no_fetch(html)
    assert "point.pickle" in html and "pytorch.org/memory_viz" in html
    bands = _bands(html)
    expected = mem.stack_bands(snap)["bands"]
    assert sorted(bands) == sorted(b["element"] for b in expected) and len(bands) == 7
    by_size = {b["size"]: b["element"] for b in expected}
    # the largest (16 KiB, made by the autograd engine in backward, events 9 and 10: 13 and 16
    # ms) is number 1
    largest = bands[by_size[16384]]
    assert largest.startswith("16.0 KiB (16,384 bytes), backward")
    assert "allocated: 13 ms; freed: 16 ms" in largest and "no Python frames" in largest
    assert "model.py:42 forward" in bands[by_size[8192]]
    assert "before the trace" in bands[by_size[4096]] and "live at the end" in bands[by_size[4096]]
    # the three blocks allocated in the trace (phase markers aside) numbered 1, 2, 3
    assert re.findall(r'font-weight="bold">(\d+)</text>', html) == ["1", "2", "3"]
    rows = re.findall(r'<tr><td class="num"><a href="#block-(\d+)">(\d+)</a></td>', html)
    assert rows == [(str(by_size[s]), str(r)) for r, s in enumerate((16384, 8192, 1024), 1)]
    assert "forward: 7 ms" in html and "backward: 9 ms" in html  # the phases' durations


def test_blocks_past_the_cap_are_summed_and_an_empty_trace_still_makes_a_page(monkeypatch):
    monkeypatch.setattr(page, "PAGE_MAX_DRAWN", 2)
    html = page.viz_page(_trace(times=False), "capped", "capped.pickle")
    assert len(_bands(html)) == 2 and html.count('<polygon class="summed"') == 1
    assert "the 5 smallest summed in grey" in html
    html = page.viz_page({"segments": [], "device_traces": [[]]}, "empty", "empty.pickle")
    assert not _bands(html) and "The trace allocated nothing" in html
    _no_fetch(html)


def test_points_drop_vertices_a_unit_apart():
    # a drop of a third of a unit at x=2 vanishes; the 5-unit drop at x=3 stays
    xs = [0.0, 2.0, 2.0, 3.0, 3.0, 4.0]
    ys = [10.0, 10.0, 9.7, 9.7, 4.7, 4.7]
    assert page._points(xs, ys) == "0,10 3,10 3,5 4,5"


# ---- in headless Chromium, offline --------------------------------------------------------

# records, on <html data-errors>, every resource that fails to load and every uncaught error
ERROR_PROBE = (
    '<script>addEventListener("error", e => document.documentElement.setAttribute("data-errors",'
    ' (document.documentElement.getAttribute("data-errors") || "") + " "'
    ' + (e.message || (e.target && (e.target.src || e.target.tagName)) || "?")), true);</script>'
)


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CS336_REQUIRE_CHROMIUM") == "1":
            pytest.fail("CS336_REQUIRE_CHROMIUM=1 but no chromium on PATH")
        pytest.skip("no chromium (apt-get install chromium)")
    return exe


def _offline(path, tmp_path, *what: str) -> subprocess.CompletedProcess:
    """Headless Chromium on the page where no host name resolves (`what`: --dump-dom, or
    --screenshot=...)."""
    argv = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,1400", *what, path.as_uri()]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.skipif(not SNAPSHOT_FIXTURE.exists(), reason="no captured snapshot")
def test_the_page_renders_in_headless_chromium_with_the_network_off(tmp_path):
    """The captured snapshot's page: in Chromium's DOM, a band per block drawn (every block of
    this small step), the largest numbered; its pixels drawn, no resource failing to load."""
    import matplotlib.image

    snap = mem.load_snapshot(SNAPSHOT_FIXTURE)
    path = page.write_viz_page(snap, tmp_path / "point.html", "captured")
    assert path.stat().st_size < 300_000
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text().replace("<head>", "<head>" + ERROR_PROBE, 1))
    dom = _offline(probed, tmp_path, "--dump-dom").stdout
    assert re.search(r"<html[^>]*>", dom).group(0) == '<html lang="en">'  # no data-errors
    (svg,) = re.findall(r"<svg.*?</svg>", dom, re.S)
    blocks = len(mem._elements(snap, mem._trace(snap))[0])
    assert blocks == 381 and len(_bands(svg)) == blocks
    assert svg.count('<g class="number">') == mem.LABELLED
    _offline(path, tmp_path, f"--screenshot={tmp_path / 'shot.png'}")
    shot = matplotlib.image.imread(tmp_path / "shot.png")[:, :, :3]
    plot = shot[200:500, 120:1000]  # inside the plot box at this window's width
    assert (plot.min(axis=2) < 0.9).mean() > 0.5  # mostly bands, not a blank page
