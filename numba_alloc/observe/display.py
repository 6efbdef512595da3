"""Rich display in Jupyter: a compact table in human units and, where there
are segments, the segment map as an inline PNG.

IPython shows a cell's value through its ``_repr_html_``; the pool,
snapshots (:class:`Snapshot`), replay reports, trackers and summaries
(:class:`Summary`) define theirs with the functions here. Each renders data
read once (a pool's in one snapshot, under its lock) and escapes all text.
matplotlib is imported when a picture is drawn, never at import; without it
the HTML holds the table alone.
"""

import base64
import html
import io

from ..plugin.registry import resolve_pool
from ..policy.pool import RENDERERS
from ..units import format_bytes
from ..validate import as_flag
from .summary import format_summary, free_space

PICTURE_DPI = 80            # the inline segment map stays a few tens of KiB
PICTURE_WIDTH = 7.0         # inches
_ROW_HEIGHT = 0.24          # inches per segment
_MAX_PICTURE_HEIGHT = 7.0   # inches
_IN_USE = ("active_allocated", "active_pending_free")
_CELL = "padding:1px 8px;white-space:nowrap;text-align:{}"     # every table cell
# JupyterLab's stylesheet gives output <pre> blocks the page's font
# (.jp-OutputArea-output pre {font-family: inherit}): the style is inline
_PRE = "font-family:monospace;white-space:pre;overflow-x:auto"
_PART = "min-width:0;max-width:100%"     # a flex item may shrink below its content's width


def segment_map_png(segments):
    """PNG bytes of :func:`~numba_alloc.plot_segments` for ``segments`` (a
    snapshot's list) at :data:`PICTURE_DPI`, or None when there are no
    segments or matplotlib is missing. The figure is made without pyplot,
    so none is left open; the PNG carries no version stamp."""
    if not segments:
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from .plots import plot_segments
    height = min(1.1 + _ROW_HEIGHT * len(segments), _MAX_PICTURE_HEIGHT)
    ax = Figure(figsize=(PICTURE_WIDTH, height), layout="constrained").subplots()
    plot_segments(snapshot={"segments": segments}, ax=ax)
    ax.set_title("")                # the table beside it gives these figures
    ax.tick_params(labelsize=8)
    legend = ax.get_legend()
    legend.remove()                 # beside the bars, not over them
    ax.figure.legend(handles=legend.legend_handles, loc="outside right upper", fontsize=8,
                     frameon=False)
    out = io.BytesIO()
    ax.figure.savefig(out, format="png", dpi=PICTURE_DPI, metadata={"Software": None})
    return out.getvalue()


def _picture(segments):
    png = segment_map_png(segments)
    if png is None:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="segment map" style="max-width:100%">'


def _table(caption, rows):
    """A two-column table: ``rows`` of (label, value), escaped."""
    body = "".join(f'<tr><th style="{_CELL.format("left")}">{html.escape(str(label))}</th>'
                   f'<td style="{_CELL.format("right")}">{html.escape(str(value))}</td></tr>'
                   for label, value in rows)
    return (f'<table><caption style="text-align:left;font-weight:bold">'
            f"{html.escape(caption)}</caption>{body}</table>")


def _side_by_side(*parts):
    """``parts`` side by side where the output is wide enough, else one
    under the other; each held within the output's width (a wider part
    scrolls inside its own box, never the page)."""
    inner = "".join(f'<div style="{_PART}">{part}</div>' for part in parts if part)
    return ('<div style="display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start">'
            f"{inner}</div>")


def _plural(count, noun, plural=None):
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def segment_rows(segments, stats):
    """(label, value) rows of a pool's state: ``segments`` as
    :meth:`Pool.snapshot` gives them, ``stats`` as :meth:`Pool.memory_stats`."""
    blocks = [b for s in segments for b in s["blocks"]]
    total_free, largest, fragmentation = free_space(segments)
    large = sum(1 for s in segments if s["segment_type"] == "large")
    allocated = [b for b in blocks if b["state"] == "active_allocated"]
    pending = [b for b in blocks if b["state"] == "active_pending_free"]
    pinned = sum(1 for b in blocks if b.get("pinned"))
    rows = [("reserved", f"{format_bytes(sum(s['total_size'] for s in segments))} in "
                         f"{_plural(len(segments), 'segment')} ({large} large, "
                         f"{len(segments) - large} small)"),
            ("allocated", f"{format_bytes(sum(b['size'] for b in allocated))} in "
                          f"{_plural(len(allocated), 'block')}")]
    if pending:
        rows.append(("freed, GPU work pending", f"{format_bytes(sum(b['size'] for b in pending))}"
                                                f" in {_plural(len(pending), 'block')}"))
    if pinned:
        rows.append(("pinned", _plural(pinned, "block")))
    rows += [("free in the pool", f"{format_bytes(total_free)} in "
                                  f"{_plural(len(blocks) - len(allocated) - len(pending), 'block')}"),
             ("largest free block", format_bytes(largest)),
             ("fragmentation", f"{fragmentation:.3f} (1 - largest free / free)"),
             ("peak reserved", format_bytes(stats["reserved_bytes.all.peak"])),
             ("peak allocated", format_bytes(stats["allocated_bytes.all.peak"])),
             ("out-of-memory errors", stats["num_ooms"]),
             ("defragmentations", stats["num_defragmentations"])]
    return rows


def pool_html(pool):
    """HTML of a :class:`~numba_alloc.Pool`: its state and device memory,
    read at one instant (its snapshot), beside its segment map; the device
    memory unavailable once the pool's context was closed (cuda.close())."""
    snap = pool.snapshot()
    rows = segment_rows(snap["segments"], snap["stats"])
    device = snap["device"]
    rows.append(("device memory", "unavailable: its context was closed" if device is None else
                 f"{format_bytes(device['free'])} free of {format_bytes(device['total'])}"))
    caption = f"numba_alloc pool on {pool.backend.name} device {pool.backend.device_id}"
    return _side_by_side(_table(caption, rows), _picture(snap["segments"]))


class Snapshot(dict):
    """What :func:`numba_alloc.snapshot` returns: a dict in PyTorch's
    snapshot format that Jupyter shows as a table beside its segment map
    and IPython as one line. It pickles as a plain dict (loading needs no
    numba_alloc); pytorch.org/memory_viz reads the pickles
    :func:`~numba_alloc.dump_snapshot` writes, or ``dict(snapshot)``'s."""

    def __reduce__(self):
        return dict, (dict(self),)

    def summary(self):
        """One line: segments, reserved and allocated bytes, trace entries."""
        segments = self["segments"]
        entries = sum(map(len, self["device_traces"]))
        return (f"<numba_alloc snapshot: {_plural(len(segments), 'segment')}, "
                f"{format_bytes(sum(s['total_size'] for s in segments))} reserved, "
                f"{format_bytes(sum(s['allocated_size'] for s in segments))} allocated, "
                f"{_plural(entries, 'trace entry', 'trace entries')}>")

    def _repr_pretty_(self, printer, cycle):
        printer.text(self.summary())

    def _repr_html_(self):
        rows = segment_rows(self["segments"], self["stats"])
        rows.append(("trace entries", sum(map(len, self["device_traces"]))))
        return _side_by_side(_table("numba_alloc snapshot", rows), _picture(self["segments"]))


class Summary(str):
    """What :func:`numba_alloc.memory_summary` returns: the text report, a
    str, that IPython prints as text and Jupyter shows in a monospaced block
    with the segment map of the ``segments`` it was made from (none for an
    abbreviated report)."""

    def __new__(cls, text, segments=()):
        self = super().__new__(cls, text)
        self.segments = segments
        return self

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))

    def _repr_html_(self):
        return _side_by_side(_picture(self.segments),
                             f'<pre style="{_PRE}">{html.escape(str(self))}</pre>')


def replay_html(report):
    """HTML of a :class:`~numba_alloc.cli.replay.ReplayReport`."""
    rows = [("device", report.device), ("events", report.events),
            ("allocations", report.allocations), ("frees", report.frees),
            ("failed requests (out of memory here)", report.failed_requests),
            ("recorded failures in the trace", report.recorded_failures),
            ("unknown frees in the trace", report.unknown_frees),
            ("reused addresses in the trace", report.reused_addresses),
            ("peak reserved", format_bytes(report.peak_reserved)),
            ("peak allocated", format_bytes(report.peak_allocated)),
            ("peak live bytes (requested)", format_bytes(report.peak_live_bytes)),
            ("fragmentation at the end", f"{report.fragmentation:.3f}"),
            ("host time per operation", f"{report.host_us_per_op:.2f} us")]
    if report.device_us_per_op is not None:
        rows.append(("of it, the simulated device's work", f"{report.device_us_per_op:.2f} us"))
    return _table(f"replay of {report.trace}", rows)


def _signed(value, unit):
    return ("-" if value < 0 else "+") + unit(abs(value))


def tracker_html(tracker):
    """HTML of a :class:`~numba_alloc.observe.tracking.Tracker`: one row per region
    (the regions inside it indented), its bytes, allocations and reserved
    bytes as peak, current and total."""
    def region_rows(region, depth):         # region: Tracker.as_dict()
        cells = [f'<th style="{_CELL.format("left")};padding-left:{0.5 + 1.5 * depth}em">'
                 f"{html.escape(region['name'])}</th>"]
        for key, unit in (("bytes", format_bytes), ("allocations", str),
                          ("reserved", format_bytes)):
            counter = region[key]
            for value in (unit(counter["peak"]), _signed(counter["current"], unit),
                          unit(counter["total"])):
                cells.append(f'<td style="{_CELL.format("right")}">{html.escape(value)}</td>')
        rows = [f"<tr>{''.join(cells)}</tr>"]
        for child in region["children"]:
            rows += region_rows(child, depth + 1)
        return rows

    groups = "".join(f'<th colspan="3" style="{_CELL.format("center")}">{name}</th>'
                     for name in ("bytes", "allocations", "reserved"))
    metrics = "".join(f'<th style="{_CELL.format("right")}">{name}</th>'
                      for name in ("peak", "current", "total") * 3)
    return (f'<table><caption style="text-align:left;font-weight:bold">numba_alloc.track: '
            f"{html.escape(tracker.name)}</caption><thead><tr>"
            f'<th style="{_CELL.format("left")}"></th>{groups}</tr>'
            f'<tr><th style="{_CELL.format("left")}">region</th>{metrics}</tr></thead><tbody>'
            f"{''.join(region_rows(tracker.as_dict(), 0))}</tbody></table>")


def memory_summary(device=None, abbreviated=False) -> "Summary":
    """The text report of a pool (numba_alloc.observe.summary). ``device``: a
    :class:`~numba_alloc.Pool`, a GPU number, a TensorFlow name such as
    "GPU:0", or None for the current GPU (which needs numba_alloc to be
    Numba's memory manager). Returns a
    :class:`~numba_alloc.observe.display.Summary`: a str that Jupyter shows with
    the segment map (of the same instant; none when ``abbreviated``).
    TypeError when ``abbreviated`` is not a bool."""
    abbreviated = as_flag(abbreviated, "abbreviated")
    with resolve_pool(device) as pool:
        snap = pool.snapshot()
        return Summary(format_summary(pool, abbreviated, snap),
                       () if abbreviated else snap["segments"])


RENDERERS["html"] = pool_html       # the pool's Jupyter view
