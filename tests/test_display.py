"""Rich display: what Jupyter shows for a pool, a snapshot, a summary, a
replay report and a tracker, with and without matplotlib."""

import base64
import html
import pickle
import re
import subprocess
import sys

import pytest

import numba_alloc
from numba_alloc.api import compat
from numba_alloc.observe.display import Snapshot, Summary
from numba_alloc.cli.replay import ReplayReport
from numba_alloc.observe.summary import format_summary, free_space
from numba_alloc.units import format_bytes

from workload import KiB, MiB, make_pool

PNG = b"\x89PNG\r\n\x1a\n"


def pictures(page):
    """The PNGs inlined in ``page``."""
    return [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"',
                                                           page)]


def cells(page):
    """The text of every caption and table cell of ``page``, unescaped."""
    return [html.unescape(text) for text in re.findall(r"<(?:t[dh]|caption)[^>]*>([^<]*)<", page)]


def busy_pool():
    """A pool with allocated, pending, free and pinned blocks in 2 segments."""
    device, pool = make_pool()
    blocks = [pool.malloc(100 * KiB) for _ in range(6)] + [pool.malloc(5 * MiB)]
    pool.pin(blocks[1])
    pool.free(blocks[2])
    device.launch()
    pool.free(blocks[4])                 # the batch of both frees waits for the queued work
    return device, pool


@pytest.fixture
def no_matplotlib(monkeypatch):
    """Imports of matplotlib fail, as where it is not installed."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_a_pool_shows_its_state_in_human_units_beside_its_segment_map():
    pytest.importorskip("matplotlib", reason="the segment map needs matplotlib")
    _, pool = busy_pool()
    page = pool._repr_html_()
    snap = pool.snapshot()
    total_free, largest, fragmentation = free_space(snap["segments"])
    caption, *rest = cells(page)
    shown = dict(zip(rest[::2], rest[1::2]))
    assert caption == "numba_alloc pool on simulated device 0"
    assert shown["reserved"] == "22.00 MiB in 2 segments (1 large, 1 small)"
    assert shown["allocated"] == f"{format_bytes(compat.memory_allocated(pool))} in 5 blocks"
    assert shown["freed, GPU work pending"] == "200.00 KiB in 2 blocks"
    assert shown["pinned"] == "1 block"
    assert shown["free in the pool"] == f"{format_bytes(total_free)} in 2 blocks"   # the tails
    assert shown["largest free block"] == format_bytes(largest)
    assert shown["fragmentation"] == f"{fragmentation:.3f} (1 - largest free / free)"
    assert shown["device memory"] == "234.00 MiB free of 256.00 MiB"
    [png] = pictures(page)
    assert png.startswith(PNG) and len(png) < 100_000
    assert "MiB" in repr(pool) and str(compat.memory_reserved(pool)) not in repr(pool)


def test_without_matplotlib_the_display_is_the_table_alone(no_matplotlib):
    _, pool = busy_pool()
    for page in (pool._repr_html_(), numba_alloc.snapshot(pool)._repr_html_(),
                 numba_alloc.memory_summary(pool)._repr_html_()):
        assert "<img" not in page and format_bytes(compat.memory_reserved(pool)) in page


def test_importing_numba_alloc_imports_no_matplotlib():
    code = "import sys, numba_alloc; print(sorted(m for m in sys.modules if 'matplotlib' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_a_snapshot_is_a_dict_that_shows_as_a_table_and_pickles_as_a_plain_dict():
    pytest.importorskip("matplotlib", reason="the segment map needs matplotlib")
    _, pool = busy_pool()
    numba_alloc.record_history(device=pool)
    pool.free(pool.malloc(3 * MiB))
    snap = numba_alloc.snapshot(pool)
    assert isinstance(snap, Snapshot) and isinstance(snap, dict)
    assert set(snap) == {"segments", "device_traces", "stats", "device_heaps", "nrt_heap"}
    loaded = pickle.loads(pickle.dumps(snap))
    assert type(loaded) is dict and loaded == snap             # loading needs no numba_alloc
    assert b"numba_alloc" not in pickle.dumps(snap)
    assert snap.summary() == (f"<numba_alloc snapshot: 2 segments, "
                              f"{format_bytes(compat.memory_reserved(pool))} reserved, "
                              f"{format_bytes(compat.memory_allocated(pool))} allocated, "
                              f"2 trace entries>")     # alloc, free_requested: work is queued
    page = snap._repr_html_()
    assert cells(page)[-2:] == ["trace entries", "2"] and len(pictures(page)) == 1


def test_a_summary_is_the_same_str_shown_after_its_segment_map():
    pytest.importorskip("matplotlib", reason="the segment map needs matplotlib")
    _, pool = busy_pool()
    summary = numba_alloc.memory_summary(pool)
    assert isinstance(summary, Summary) and summary == format_summary(pool)
    assert summary.splitlines()[1].strip() == "numba_alloc memory summary: simulated device 0"
    page = summary._repr_html_()
    assert html.escape(str(summary)) in page and len(pictures(page)) == 1
    assert page.index("<img") < page.index("<pre")
    assert pickle.loads(pickle.dumps(summary)) == summary
    abbreviated = numba_alloc.memory_summary(pool, abbreviated=True)
    assert pictures(abbreviated._repr_html_()) == []


def styles(page, tag):
    """The inline style of every ``tag`` element of ``page`` ('' where it has none)."""
    return [re.search(r'style="([^"]*)"', attributes).group(1) if "style=" in attributes else ""
            for attributes in re.findall(rf"<{tag}\b([^>]*)>", page)]


def test_the_html_keeps_its_layout_under_jupyterlabs_stylesheet(no_matplotlib):
    """JupyterLab's `.jp-OutputArea-output pre {font-family: inherit}` gave the
    summary the page's proportional font, and narrow outputs wrapped the
    tables' cells: the summary's block and every cell say so inline."""
    _, pool = busy_pool()
    with numba_alloc.track("a region with a long name", pool) as tracker:
        pool.free(pool.malloc(MiB))
    summary = numba_alloc.memory_summary(pool)._repr_html_()
    pre = styles(summary, "pre")
    assert len(pre) == 1
    assert "font-family:monospace" in pre[0] and "white-space:pre" in pre[0]
    assert "overflow-x:auto" in pre[0]
    for page in (pool._repr_html_(), numba_alloc.snapshot(pool)._repr_html_(),
                 tracker._repr_html_()):
        cell_styles = styles(page, "td") + styles(page, "th")
        assert cell_styles and all("white-space:nowrap" in style for style in cell_styles)


def test_a_replay_report_shows_in_human_units_and_escapes_its_trace_name():
    report = ReplayReport(trace="<b>&trace.csv", device="simulated device 0", events=10,
                          allocations=5, frees=4, failed_requests=1, recorded_failures=0,
                          unknown_frees=2, reused_addresses=0, peak_reserved=20 * MiB,
                          peak_allocated=3 * MiB + 512, peak_live_bytes=3 * MiB,
                          fragmentation=0.25, host_us_per_op=1.5)
    page = report._repr_html_()
    assert "<b>" not in page and "replay of <b>&trace.csv" in cells(page)
    shown = dict(zip(cells(page)[1::2], cells(page)[2::2]))
    assert shown["peak reserved"] == "20.00 MiB" and shown["peak allocated"] == "3.00 MiB"
    assert shown["unknown frees in the trace"] == "2" and shown["fragmentation at the end"] == "0.250"
    assert shown["host time per operation"] == "1.50 us"


def test_a_tracker_shows_its_regions_nested_in_human_units():
    _, pool = make_pool()
    kept = pool.malloc(3 * KiB)
    with numba_alloc.track("outer <&>", pool) as outer:
        with numba_alloc.track("inner", pool):
            block = pool.malloc(2 * MiB)
        pool.free(block)
        pool.free(kept)
    page = outer._repr_html_()
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<tbody>")[1])
    assert [cells(row) for row in rows] == [
        ["outer <&>", "2.00 MiB", "-3.00 KiB", "2.00 MiB", "1", "-1", "1",
         "20.00 MiB", "+20.00 MiB", "20.00 MiB"],
        ["inner", "2.00 MiB", "+2.00 MiB", "2.00 MiB", "1", "+1", "1",
         "20.00 MiB", "+20.00 MiB", "20.00 MiB"]]
    assert "padding-left:2.0em" in rows[1] and "<&>" not in page
    assert repr(outer) == ("Tracker('outer <&>': bytes peak 2.00 MiB, current -3.00 KiB; "
                           "allocations peak 1, current -1; reserved peak 20.00 MiB, "
                           "current +20.00 MiB; 1 region inside)")


@pytest.mark.parametrize("abbreviated", ["no", 1, None])
def test_abbreviated_takes_only_a_bool(abbreviated):
    _, pool = busy_pool()
    with pytest.raises(TypeError, match="abbreviated must be True or False"):
        numba_alloc.memory_summary(pool, abbreviated=abbreviated)


def test_each_part_side_by_side_stays_within_the_outputs_width():
    """A flex item is never narrower than its content unless allowed
    (min-width:auto): the summary's block made the output wider than the
    page; each part now may shrink to the output's width, and the block
    scrolls inside itself."""
    pytest.importorskip("matplotlib", reason="the segment map needs matplotlib")
    _, pool = busy_pool()
    for page in (numba_alloc.memory_summary(pool)._repr_html_(), pool._repr_html_(),
                 numba_alloc.snapshot(pool)._repr_html_()):
        flex, *parts = styles(page, "div")
        assert "display:flex" in flex and "flex-wrap:wrap" in flex and len(parts) == 2
        assert all("min-width:0" in part and "max-width:100%" in part for part in parts)
