"""Pictures of a pool with matplotlib: its segment map and its timeline.

Both return a :class:`matplotlib.figure.Figure` made without pyplot (no
global figure state, no GUI backend needed); in Jupyter it shows as the
cell's value, a PNG, without ``%matplotlib inline`` (IPython shows a
Figure as a picture only through the formatter the inline backend
registers when pyplot loads it, so a figure these functions make carries
its own ``_repr_png_``), elsewhere ``fig.savefig("file.png")``. Sizes are in the
binary unit of their magnitude (KiB to TiB, named on the axis).
matplotlib is imported on the first plot, so that importing numba_alloc
(which every program under the plugin does) does not pay for it.
"""

import io
from functools import partial
from typing import TYPE_CHECKING

from .history import MOVE, OOM, pool_lock, require_history
from ..plugin.registry import resolve_pool
from ..units import binary_unit, format_bytes
from .summary import free_space

if TYPE_CHECKING:
    from matplotlib.figure import Figure      # (the plot extra)

STATE_COLORS = {"active_allocated": "#4e79a7", "active_pending_free": "#f28e2c",
                "inactive": "#d9d9d9"}
STATE_LABELS = {"active_allocated": "allocated", "active_pending_free": "freed, GPU work pending",
                "inactive": "free"}
_BAR = 0.8           # bar height in rows
_MAX_LABELS = 40     # segment labels shown (every k-th beyond)
MAX_SEGMENTS = 64    # segments drawn: beyond, those with the most free bytes


def require_matplotlib(what):
    """Raise ImportError naming the ``plot`` extra when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(f"{what} needs matplotlib: pip install 'numba-alloc[plot]'",
                          name="matplotlib") from error


def _axes(ax, width, height):
    """``ax``, or a new figure's Axes of ``width`` by ``height`` inches when
    it is None (the figure shown as a PNG by IPython); TypeError naming
    ``ax`` for anything else."""
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    if ax is None:
        figure = Figure(figsize=(width, height), layout="constrained")
        figure._repr_png_ = partial(figure_png, figure)
        return figure.subplots()
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes or None, got {ax!r}")
    return ax


def figure_png(figure) -> bytes:
    """``figure`` as PNG bytes, cropped to what it draws, as the inline
    backend shows a figure (``bbox_inches="tight"``)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _rectangle(x, y, width):
    return [(x, y), (x + width, y), (x + width, y + _BAR), (x, y + _BAR)]


def plot_segments(device=None, snapshot=None, ax=None) -> "Figure":
    """The pool's segment map: one horizontal bar per segment (address
    order, labelled with address, size and pool), its blocks coloured by
    state (allocated, freed with GPU work pending, free), pinned blocks
    hatched, the legend beside them. Beyond MAX_SEGMENTS segments, those
    with the most free bytes are drawn and the title says how many are
    hidden (its totals are of every segment). ``device``: a Pool, a GPU
    number, a TensorFlow name such as "GPU:0", or None (the current GPU);
    or pass ``snapshot`` (from :func:`numba_alloc.snapshot` or
    :meth:`Pool.snapshot`) instead, to draw a state kept from earlier.
    ``ax``: the matplotlib Axes to draw in (default: a new figure). Returns
    the Figure. Raises ValueError when both device and snapshot are given,
    TypeError for a snapshot that is not a dict with a list of segments or
    an ``ax`` that is not an Axes."""
    require_matplotlib("plot_segments")
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    if snapshot is not None and device is not None:
        raise ValueError("give device or snapshot, not both")
    if snapshot is not None and not (isinstance(snapshot, dict)
                                     and isinstance(snapshot.get("segments"), list)):
        raise TypeError("snapshot must be a dict with a list of 'segments', as "
                        f"numba_alloc.snapshot() or Pool.snapshot() returns, got {snapshot!r}")
    if snapshot is None:
        with resolve_pool(device) as pool:
            snapshot = pool.snapshot()
    every = snapshot["segments"]
    segments = every
    if len(every) > MAX_SEGMENTS:       # the most free bytes, kept in address order
        keep = sorted(range(len(every)),
                      key=lambda i: every[i]["total_size"] - every[i]["allocated_size"],
                      reverse=True)[:MAX_SEGMENTS]
        segments = [every[i] for i in sorted(keep)]
    unit, scale = binary_unit(max((s["total_size"] for s in segments), default=0))
    ax = _axes(ax, 10, min(2.0 + 0.35 * len(segments), 20))
    rectangles = {state: [] for state in STATE_COLORS}
    pinned, outlines = [], []
    for row, segment in enumerate(segments):
        outlines.append(_rectangle(0, row, segment["total_size"] / scale))
        offset = 0
        for block in segment["blocks"]:
            box = _rectangle(offset / scale, row, block["size"] / scale)
            rectangles[block["state"]].append(box)
            if block.get("pinned"):
                pinned.append(box)
            offset += block["size"]
    for state, boxes in rectangles.items():
        ax.add_collection(PolyCollection(boxes, facecolors=STATE_COLORS[state],
                                         edgecolors="white", linewidths=0.3,
                                         label=STATE_LABELS[state]))
    ax.add_collection(PolyCollection(pinned, facecolors="none", edgecolors="black",
                                     hatch="////", linewidths=0.6, label="pinned"))
    ax.add_collection(PolyCollection(outlines, facecolors="none", edgecolors="#555555",
                                     linewidths=0.8, label="segment"))
    step = max(1, -(-len(segments) // _MAX_LABELS))
    rows = range(0, len(segments), step)
    ax.set_yticks([row + _BAR / 2 for row in rows])
    ax.set_yticklabels([_segment_label(segments[row]) for row in rows], fontsize=7)
    ax.set_ylim(len(segments), -0.2)
    ax.set_xlim(0, max((s["total_size"] for s in segments), default=scale) / scale * 1.01)
    ax.set_xlabel(f"offset in segment ({unit})")
    total_free, largest, fragmentation = free_space(every)
    reserved = sum(s["total_size"] for s in every)
    allocated = sum(s["allocated_size"] for s in every)
    hidden = (f" ({len(every) - len(segments)} hidden: those with the most free bytes shown)"
              if len(segments) < len(every) else "")
    ax.set_title(f"{len(every)} segments{hidden}, {format_bytes(reserved)} reserved, "
                 f"{format_bytes(allocated)} allocated\n{format_bytes(total_free)} free, "
                 f"largest free block {format_bytes(largest)}, fragmentation {fragmentation:.2f}",
                 fontsize=9)
    handles = [Patch(facecolor=STATE_COLORS[s], label=STATE_LABELS[s]) for s in STATE_COLORS]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="pinned"))
    # beside the bars, never over one
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              fontsize=7)
    return ax.figure


def _segment_label(segment):
    size = format_bytes(segment["total_size"])
    return f"{segment['address']:#x} {size} {segment['segment_type']}"


def plot_timeline(device=None, ax=None, x="event") -> "Figure":
    """Reserved, allocated and requested bytes over the pool's recorded
    history (see :func:`numba_alloc.record_history`); out-of-memory errors
    marked with red crosses and defragmentation moves with ticks on the
    allocated line. ``x``: "event" (the events' order, the default: every
    event gets the same width) or "time" (seconds from the first recorded
    event, where a slow step such as a defragmentation squeezes the rest).
    ``device``: a Pool, a GPU number, a TensorFlow name such as "GPU:0", or
    None (the current GPU). ``ax`` as for :func:`plot_segments`. Returns the
    Figure. Raises ValueError for another ``x`` and RuntimeError when the
    pool records no history."""
    require_matplotlib("plot_timeline")
    if x not in ("time", "event"):
        raise ValueError(f'x must be "time" or "event", got {x!r}')
    with resolve_pool(device) as pool, pool_lock(pool):
        history = require_history(pool)
        entries, recorded = list(history.entries), history.recorded
        name = f"{pool.backend.name} device {pool.backend.device_id}"
    unit, scale = binary_unit(max((e.reserved for e in entries), default=0))
    ax = _axes(ax, 10, 4)
    if x == "time":
        start = entries[0].time_ns if entries else 0
        xs = [(e.time_ns - start) / 1e9 for e in entries]
        ax.set_xlabel("seconds since the first recorded event")
    else:
        xs = list(range(recorded - len(entries), recorded))
        ax.set_xlabel("event number")
    ax.step(xs, [e.reserved / scale for e in entries], where="post", color="#e15759",
            label="reserved (segments)")
    ax.fill_between(xs, [e.allocated / scale for e in entries], step="post",
                    color="#4e79a7", alpha=0.5, label="allocated (live blocks)")
    ax.step(xs, [e.requested / scale for e in entries], where="post", color="#2b4a6f",
            linewidth=0.8, label="requested (live blocks)")
    for action, marker, color, label in ((OOM, "x", "red", "out of memory"),
                                         (MOVE, "|", "black", "defragmentation move")):
        points = [(at, e.allocated / scale) for at, e in zip(xs, entries) if e.action == action]
        if points:
            ax.scatter(*zip(*points), marker=marker, color=color, zorder=3, label=label)
    ax.set_ylabel(unit)
    dropped = recorded - len(entries)
    ax.set_title(f"History of {name}: {len(entries)} events"
                 + (f" (the {dropped} before them dropped)" if dropped else ""), fontsize=9)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_ylim(bottom=0)
    return ax.figure
