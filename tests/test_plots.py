"""plot_segments and plot_timeline draw what the pool holds and did."""

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="plot_segments and plot_timeline need matplotlib")

import numba_alloc

from workload import GiB, KiB, MiB, make_pool, mixed


def collections_by_label(ax):
    return {c.get_label(): c for c in ax.collections}


def rectangles(collection):
    """(x0, x1, y0) of each rectangle, in drawing order."""
    out = []
    for path in collection.get_paths():
        xs, ys = path.vertices[:, 0], path.vertices[:, 1]
        out.append((xs.min(), xs.max(), ys.min()))
    return out


def test_segment_map_draws_every_block_in_its_state_and_place():
    device, pool = make_pool()
    blocks = [pool.malloc(100 * KiB) for _ in range(6)] + [pool.malloc(5 * MiB)]
    pool.pin(blocks[1])
    pool.free(blocks[2])
    device.launch()
    pool.free(blocks[4])                 # pending: work queued before the free
    fig = numba_alloc.plot_segments(pool)
    ax = fig.axes[0]
    drawn = collections_by_label(ax)
    snap = pool.snapshot()
    for state, label in (("active_allocated", "allocated"),
                         ("active_pending_free", "freed, GPU work pending"), ("inactive", "free")):
        expected = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == state]
        assert len(drawn[label].get_paths()) == len(expected), label
    assert len(drawn["pinned"].get_paths()) == 1
    assert len(drawn["segment"].get_paths()) == len(snap["segments"]) == 2
    x0, x1, row = rectangles(drawn["pinned"])[0]
    offset = blocks[1].address - blocks[1].segment.address
    assert (x0, x1) == pytest.approx((offset / MiB, (offset + 100 * KiB) / MiB))
    assert row == 0                      # the small segment comes first (lower address)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].endswith("2.00 MiB small") and labels[1].endswith("20.00 MiB large")
    assert ax.get_xlabel() == "offset in segment (MiB)"
    assert "fragmentation" in ax.get_title()


def test_segment_map_of_a_kept_snapshot_and_into_given_axes():
    from matplotlib.figure import Figure
    device, pool = make_pool()
    blocks = [pool.malloc(2 * MiB) for _ in range(8)]
    before = numba_alloc.snapshot(pool)
    for block in blocks[::2]:
        pool.free(block)
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert numba_alloc.plot_segments(snapshot=before, ax=left) is fig
    numba_alloc.plot_segments(pool, ax=right)
    free_before = collections_by_label(left)["free"].get_paths()
    free_after = collections_by_label(right)["free"].get_paths()
    assert len(free_before) == 1 and len(free_after) == 5
    with pytest.raises(ValueError, match="not both"):
        numba_alloc.plot_segments(pool, snapshot=before)


@pytest.mark.parametrize("snapshot", [{}, 1, [], {"segments": None}, "snapshot.pickle"])
def test_segment_map_of_something_else_than_a_snapshot_says_so(snapshot):
    """It raised KeyError: 'segments' or TypeError: 'int' object is not subscriptable."""
    with pytest.raises(TypeError, match="snapshot must be a dict with a list of 'segments'"):
        numba_alloc.plot_segments(snapshot=snapshot)


def test_segment_map_saves_as_png(tmp_path):
    device, pool = make_pool()
    mixed(pool, device, steps=100)
    path = tmp_path / "segments.png"
    numba_alloc.plot_segments(pool).savefig(path, dpi=50)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_follows_the_recorded_totals():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool, max_entries=150)
    mixed(pool, device, steps=300, seed=4, oom_every=60)
    events = numba_alloc.recorded_events(pool)
    fig = numba_alloc.plot_timeline(pool)           # the events' order by default
    ax = fig.axes[0]
    assert ax.get_xlabel() == "event number"
    reserved, requested = ax.lines
    assert reserved.get_label() == "reserved (segments)"
    np.testing.assert_allclose(reserved.get_ydata(), [e.reserved / MiB for e in events])
    np.testing.assert_allclose(requested.get_ydata(), [e.requested / MiB for e in events])
    recorded = numba_alloc.observe.history.history_of(pool).recorded
    assert list(reserved.get_xdata()) == list(range(recorded - 150, recorded))
    ooms = [c for c in ax.collections if c.get_label() == "out of memory"]
    assert len(ooms[0].get_offsets()) == sum(e.action == "oom" for e in events) > 0
    assert "dropped" in ax.get_title()
    by_time = numba_alloc.plot_timeline(pool, x="time").axes[0].lines[0].get_xdata()
    assert by_time[0] == 0 and list(by_time) == sorted(by_time)


def test_the_axes_take_the_unit_of_the_largest_size():
    """They were in MiB whatever the sizes: a 3 GiB segment was 3072 wide."""
    device, pool = make_pool(capacity=8 * GiB)
    numba_alloc.record_history(device=pool)
    small = pool.malloc(100 * KiB)
    big = pool.malloc(3 * GiB)
    ax = numba_alloc.plot_segments(pool).axes[0]
    assert ax.get_xlabel() == "offset in segment (GiB)"
    x0, x1, _ = next(r for r in rectangles(collections_by_label(ax)["allocated"]) if r[1] > 1)
    assert x1 - x0 == pytest.approx(3.0)
    timeline = numba_alloc.plot_timeline(pool).axes[0]
    assert timeline.get_ylabel() == "GiB"
    reserved = timeline.lines[0].get_ydata()
    assert reserved[-1] == pytest.approx(pool.current("reserved_bytes") / GiB)
    pool.free(small)
    pool.free(big)


def test_timeline_needs_a_history_and_a_known_axis():
    _, pool = make_pool()
    with pytest.raises(RuntimeError, match="record_history"):
        numba_alloc.plot_timeline(pool)
    numba_alloc.record_history(device=pool)
    with pytest.raises(ValueError, match="x must be"):
        numba_alloc.plot_timeline(pool, x="steps")


def _bars_and_legend(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    return ax, ax.get_window_extent(), ax.get_legend().get_window_extent()


def test_the_legend_is_beside_the_bars_never_over_one():
    device, pool = make_pool()
    for _ in range(3):
        pool.malloc(19 * MiB)            # bars reaching the right end of the axes
    ax, bars, legend = _bars_and_legend(numba_alloc.plot_segments(pool))
    assert legend.x0 >= bars.x1


def test_hundreds_of_segments_show_the_most_free_and_say_how_many_are_hidden():
    segments = [{"address": i << 30, "total_size": 20 * MiB, "segment_type": "large",
                 "allocated_size": (20 - i % 7) * MiB,
                 "blocks": [{"size": (20 - i % 7) * MiB, "state": "active_allocated"},
                            {"size": (i % 7) * MiB, "state": "inactive"}]}
                for i in range(300)]
    fig = numba_alloc.plot_segments(snapshot={"segments": segments})
    ax = fig.axes[0]
    drawn = collections_by_label(ax)
    shown = numba_alloc.observe.plots.MAX_SEGMENTS
    assert len(drawn["segment"].get_paths()) == shown
    assert f"300 segments ({300 - shown} hidden" in ax.get_title()
    # 42 segments have 6 MiB free, 43 have 5: all the first and 22 of the rest
    free_drawn = sorted(round(x1 - x0) for x0, x1, _ in rectangles(drawn["free"]))
    assert free_drawn == [5] * 22 + [6] * 42
    assert "5.86 GiB reserved" in ax.get_title()         # the totals: every segment


def test_axes_that_are_not_matplotlib_axes_are_refused_naming_ax():
    _, pool = make_pool(64 * MiB)
    numba_alloc.record_history(device=pool)
    for draw in (numba_alloc.plot_segments, numba_alloc.plot_timeline):
        with pytest.raises(TypeError, match="ax must be a matplotlib Axes or None, got 5"):
            draw(pool, ax=5)
