"""Text reports of a pool.

* :func:`memory_summary`: the counters per pool (current, peak, allocated,
  freed), in the manner of ``torch.cuda.memory_summary``, the largest free
  block and the fragmentation, then one occupancy line per segment, as
  TensorFlow's BFC allocator prints on out-of-memory.
* Then, when the pool has open device heaps (numba_alloc.DeviceHeap), their
  counters and, unless abbreviated, each heap's occupancy per size class.
* Then where the device's used memory goes (observe.ledger), rows that add
  up to what its driver reports used (a line saying they are unavailable
  once the pool's context was closed: cuda.close()).
* :func:`out_of_memory_message`: an OutOfMemoryError's message, from the
  pool's :class:`~numba_alloc.policy.errors.OutOfMemoryReport`; it ends with
  :func:`short_summary`, a few lines on the segments.

Fragmentation is ``1 - largest free block / total free bytes`` over the free
(inactive) blocks: 0 when all free memory is one block (or there is none),
near 1 when it is scattered in many small ones.

The functions that take a pool read it through its public methods, which
take its re-entrant lock, and the others format what they are given;
:func:`numba_alloc.memory_summary` (numba_alloc.observe.display) returns
the report with its picture.
"""

from ..plugin import nrt
from ..policy.counters import COUNTERS, EVENT, LARGE, POOL
from ..policy.sizes import MOST_RESERVED
from ..units import format_bytes
from .ledger import format_ledger, processes_of

OCCUPANCY_WIDTH = 40        # characters of a segment's occupancy bar
OCCUPANCY_LEGEND = "#: mostly in use, +: partly in use, .: free"
_SUMMARY_SEGMENTS = 32      # segments listed by memory_summary
_SHORT_SEGMENTS = 4         # segments listed by short_summary
_IN_USE = ("active_allocated", "active_pending_free")
_WIDTH = 84
_ROWS = tuple((c.name, c.summary) for c in COUNTERS if c.form == POOL)
_LARGE_ROWS = tuple((c.name, c.summary) for c in COUNTERS if c.form == LARGE)
_METRICS = ("current", "peak", "allocated", "freed")
_POOLS = (("all", ""), ("large_pool", "  from large pool"), ("small_pool", "  from small pool"))
_EVENTS = tuple(c.name for c in COUNTERS if c.form == EVENT and c.summary)


def free_space(segments):
    """(total free bytes, largest free block, fragmentation) of the free
    blocks of ``segments`` (a snapshot's list)."""
    free = [b["size"] for s in segments for b in s["blocks"] if b["state"] not in _IN_USE]
    total, largest = sum(free), max(free, default=0)
    return total, largest, (1 - largest / total if total else 0.0)


def occupancy_bar(segment, width=OCCUPANCY_WIDTH):
    """The segment as ``width`` characters, each a 1/width slice: '#' when
    more than two thirds of its bytes are in use (allocated or freed but
    pending), '+' when some are, '.' when none is."""
    size = segment["total_size"]
    used = [0.0] * width
    offset = 0
    for block in segment["blocks"]:
        start, end = offset, offset + block["size"]
        offset = end
        if block["state"] not in _IN_USE:
            continue
        first, last = start * width // size, min((end - 1) * width // size, width - 1)
        for cell in range(first, last + 1):
            lo, hi = cell * size / width, (cell + 1) * size / width
            used[cell] += min(end, hi) - max(start, lo)
    cell_size = size / width
    return "".join("#" if u > cell_size * 2 / 3 else "+" if u > 0 else "." for u in used)


def occupancy_line(segment):
    """One line: address, size, pool, occupancy bar, share in use, free
    bytes and blocks, pinned blocks."""
    blocks = segment["blocks"]
    free = [b["size"] for b in blocks if b["state"] not in _IN_USE]
    in_use = segment["total_size"] - sum(free)
    pinned = sum(1 for b in blocks if b.get("pinned"))
    line = (f"{segment['address']:#x} {format_bytes(segment['total_size']):>11} "
            f"{segment['segment_type']:<5} [{occupancy_bar(segment)}] "
            f"{100 * in_use / segment['total_size']:3.0f}% in use, "
            f"{format_bytes(sum(free))} free in {len(free)} block{'s' * (len(free) != 1)}")
    return line + (f", {pinned} pinned" if pinned else "")


def _device_name(pool):
    return f"{pool.backend.name} device {pool.backend.device_id}"


def _row(label, cells):
    return f"{label:<26}{cells[0]:>14}{cells[1]:>14}{cells[2]:>15}{cells[3]:>15}"


def format_summary(pool, abbreviated=False, snapshot=None):
    """The full text report of ``pool`` (see the module docstring);
    ``abbreviated`` leaves out the per-pool rows and the segment lines.
    ``snapshot``: the pool's :meth:`Pool.snapshot` to report (default: a new one)."""
    snap = pool.snapshot() if snapshot is None else snapshot
    return _summary(snap, _device_name(pool), abbreviated, pool)


def format_saved_summary(snapshot, title, abbreviated=False):
    """The text report of a snapshot read back from a file (dump_snapshot's,
    see numba_alloc.observe.memory_viz.load_snapshot), headed ``title``: as
    :func:`format_summary`, without the device's ledger, which a saved
    snapshot does not hold. KeyError when ``snapshot`` has no pool
    counters (PyTorch's own snapshots have none)."""
    return _summary(snapshot, title, abbreviated, None)


def _summary(snap, title, abbreviated, pool):
    stats, segments = snap["stats"], snap["segments"]
    total_free, largest, fragmentation = free_space(segments)
    lines = ["=" * _WIDTH, f"numba_alloc memory summary: {title}".center(_WIDTH),
             "-" * _WIDTH,
             f"Out-of-memory errors: {stats['num_ooms']}   device allocation retries: "
             f"{stats['num_alloc_retries']}   device synchronizations: "
             f"{stats['num_sync_all_streams']}",
             "=" * _WIDTH,
             _row("Metric", ["Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"])]
    for family, label in _ROWS:
        lines.append("-" * _WIDTH)
        is_bytes = family.endswith("bytes")
        for kind, suffix in _POOLS[:1] if abbreviated else _POOLS:
            values = [stats[f"{family}.{kind}.{m}"] for m in _METRICS]
            lines.append(_row(suffix or label, [format_bytes(v) if is_bytes else str(v)
                                                 for v in values]))
    lines.append("-" * _WIDTH)
    for family, label in _LARGE_ROWS:
        is_bytes = family.endswith("bytes")
        lines.append(_row(label, [format_bytes(v) if is_bytes else str(v)
                                  for v in (stats[f"{family}.{m}"] for m in _METRICS)]))
    lines += ["-" * _WIDTH,
              *_wrapped([f"{k}={stats[k]}" for k in _EVENTS], "  ", "Events: ", ", "),
              *_wrapped([f"Largest free block: {format_bytes(largest)}",
                         f"free in blocks: {format_bytes(total_free)}",
                         f"fragmentation (1 - largest free / total free): {fragmentation:.3f}"],
                        "  ", "")]
    if stats.get("device_heap.count"):
        lines += ["-" * _WIDTH, *device_heap_lines(stats, snap.get("device_heaps", ()),
                                                   abbreviated)]
    if snap.get("nrt_heap"):
        lines += ["-" * _WIDTH, *device_heap_lines(stats, [snap["nrt_heap"]], abbreviated,
                                                   nrt_heap=True)]
    if "device" in snap and pool is not None:
        cuda_nrt = (pool.backend.name == "cuda" and pool.settings().nrt_heap_size is None
                    and nrt.in_use())
        processes = processes_of(pool) if snap["device"] is not None else None
        lines += ["-" * _WIDTH, *format_ledger(snap, processes, cuda_nrt)]
    if not abbreviated:
        lines += ["-" * _WIDTH, *_wrapped(_segment_heading(segments, OCCUPANCY_LEGEND), "  ", "")]
        lines += _segment_lines(segments, _SUMMARY_SEGMENTS)
    lines.append("=" * _WIDTH)
    return "\n".join(lines)


def device_heap_lines(stats, heaps, abbreviated=False, nrt_heap=False):
    """The device heaps' part of the summary: the ``device_heap.*`` totals of
    ``stats``, then (unless ``abbreviated``) per heap of ``heaps`` (the
    snapshot's ``device_heaps``) its live blocks and bytes per size class
    (named by its exact block size) with live blocks (idle classes left
    out), wrapped to the summary's width. ``nrt_heap``: the ``nrt.*``
    totals instead, and ``heaps`` is ``[the snapshot's nrt_heap]``."""
    def get(name):
        return stats[f"{'nrt' if nrt_heap else 'device_heap'}.{name}"]
    title = (f"NRT's heap (np.empty inside kernels, nrt_heap_size): "
             f"{format_bytes(get('size'))}" if nrt_heap else
             f"Device heaps (malloc inside kernels): {get('count')} open")
    lines = [f"{title}, {format_bytes(get('reserved_bytes'))} reserved",
             f"  in use {format_bytes(get('bytes_in_use'))} (peak "
             f"{format_bytes(get('peak_bytes_in_use'))}); allocs {get('num_allocs')}, frees "
             f"{get('num_frees')}, failed {get('num_failed')}, invalid frees "
             f"{get('num_invalid_frees')}"]
    if abbreviated:
        return lines
    for heap in heaps:
        used = [f"{name if name == 'large' else f'{name} B'}: "
                f"{c['live_blocks']} ({format_bytes(c['bytes_in_use'])})"
                for name, c in heap["classes"].items() if c["live_blocks"]]
        note = "" if heap["up_to_date"] else " (as last read: kernels were running)"
        lines.append(f"  heap at {heap['address']:#x}, {format_bytes(heap['size'])}{note}"
                     + (":" if used else ": empty"))
        lines += _wrapped(used, "    ")
    return lines


def _wrapped(items, indent, first=None, separator="; "):
    """``items`` joined by ``separator`` into lines of at most _WIDTH
    characters (an item longer than that alone on its line), a line that
    breaks ending with the separator's mark (";"), the first line starting
    with ``first`` (default ``indent``), the others with ``indent``."""
    mark = separator.rstrip()
    lines = []
    for item in items:
        if lines and len(lines[-1]) + len(separator) + len(item) + len(mark) <= _WIDTH:
            lines[-1] += separator + item
        elif lines:
            lines[-1] += mark
            lines.append(indent + item)
        else:
            lines.append((indent if first is None else first) + item)
    return lines


def short_summary(segments):
    """A few lines for an out-of-memory message, from ``segments`` (a
    snapshot's list): what the pool holds, its free blocks and
    fragmentation, and the occupancy of the segments with the most free
    bytes (where a request could not fit)."""
    total_free, largest, fragmentation = free_space(segments)
    free_blocks = sum(1 for s in segments for b in s["blocks"] if b["state"] not in _IN_USE)
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(s["allocated_size"] for s in segments)
    lines = [f"Pool: {format_bytes(reserved)} reserved in {len(segments)} segment"
             f"{'s' * (len(segments) != 1)}, {format_bytes(allocated)} allocated, "
             f"{format_bytes(total_free)} free in {free_blocks} block"
             f"{'s' * (free_blocks != 1)}, largest free block {format_bytes(largest)}, "
             f"fragmentation {fragmentation:.3f}."]
    if segments:
        by_free = sorted(segments, key=lambda s: s["total_size"] - s["active_size"], reverse=True)
        lines.append("; ".join(_segment_heading(segments, OCCUPANCY_LEGEND, "most free first")))
        lines += _segment_lines(by_free, _SHORT_SEGMENTS)
    return "\n".join(lines)


def out_of_memory_hint(report):
    """Which setting could help with the failure ``report`` (an
    :class:`~numba_alloc.policy.errors.OutOfMemoryReport`) describes. Only settings
    that can help are named: no limit, growth or max_split_size for a
    request beyond the device, no max_split_size or expandable_segments
    for the small pool (its blocks never reach them), neither with
    expandable_segments on, no defrag when it is on."""
    size, total = report.size, report.device_total
    if size > total:
        return (f"the request is larger than the device's {format_bytes(total)}; no setting "
                "can make room")
    if size > MOST_RESERVED:
        return ("the request is larger than any pool holds (2**62 - 2 MiB bytes: its sizes "
                "are int64); no setting can make room")
    if not report.growth and not report.initialized:
        return ("growth is off and the device had no room for the arena; it is "
                "tried again on the next request")
    if not report.growth:
        larger = "a larger limit or " if report.limit < min(total, MOST_RESERVED) else ""
        return ("growth is off: every request comes from the arena reserved "
                f"at first use; {larger}growth on could help")
    if report.limit < min(total, MOST_RESERVED) and report.device_free >= size:
        return f"the pool's limit ({format_bytes(report.limit)}) stops it; raise limit"
    if report.cached >= size:
        helps = [] if report.defrag else ["defrag:on"]
        if not report.small and not report.expandable:
            # with it a free block's whole pages serve any request
            if report.pages_available:
                helps.append("expandable_segments:true")
            helps.append("a smaller max_split_size_mb")
        return ("free memory is scattered in blocks too small for this request"
                + (f"; {' or '.join(helps)} could help" if helps else ""))
    if report.reclaim and report.host_limit is not None and report.reclaimable >= size:
        return ("the inactive blocks that could go to host memory would pass host_limit "
                f"({format_bytes(report.host_limit)}); a larger host_limit could help")
    if not report.reclaim and report.reclaim_available and report.reclaimable >= size:
        return ("live blocks fill the device; reclaim:on could move the inactive ones to "
                "host memory (with Pool.use around their uses)")
    return "free device memory or lower the request; no setting can make room"


def out_of_memory_message(report, hint=None):
    """An OutOfMemoryError's message (without Numba's ``[code]`` prefix)
    from an :class:`~numba_alloc.policy.errors.OutOfMemoryReport`: what was asked,
    what the device and the pool hold, the hint (``hint``, or
    :func:`out_of_memory_hint`'s setting for a caller that takes settings),
    then :func:`short_summary`."""
    r = report
    message = (
        f"out of memory: tried to allocate {format_bytes(r.nbytes)} ({r.size} bytes after "
        f"rounding) on {r.device_name} device {r.device_id}. "
        f"Device: {format_bytes(r.device_total)} total, {format_bytes(r.device_free)} free. "
        f"Pool: {format_bytes(r.allocated)} allocated, {format_bytes(r.cached)} reserved but "
        f"unallocated, largest free block {format_bytes(r.largest_free)}, "
        f"limit {format_bytes(r.limit)}. Hint: {hint or out_of_memory_hint(r)}.")
    if r.refusal:
        message += f" Defragmentation was refused: {r.refusal}."
    if r.nrt_heap_size is not None:
        message += (f" np.empty inside kernels (NRT) draws from the pool's NRT heap "
                    f"({format_bytes(r.stats['nrt.reserved_bytes'])} reserved, the "
                    "nrt_heap_size setting).")
    elif r.malloc_heap is not None and r.device_name == "cuda" and nrt.in_use():
        message += (f" Kernels use NRT: np.empty inside a kernel draws from CUDA's device "
                    f"malloc heap ({format_bytes(r.malloc_heap)}, the malloc_heap_size "
                    "setting), not from this pool.")
    if r.reclaim:
        stats = r.stats
        message += (f" Reclaim: {format_bytes(stats['lms_active_bytes.current'])} in use "
                    f"(active), {format_bytes(r.inactive)} inactive, "
                    f"{format_bytes(stats['reclaimed_bytes.current'])} reclaimed to host "
                    "memory" + (f" (host_limit {format_bytes(r.host_limit)})"
                                if r.host_limit is not None else "") + ".")
    return message + "\n" + short_summary(r.segments)


def _segment_heading(segments, legend, order="by address"):
    """The heading of the segment lines, as its parts, to join with "; "."""
    large = sum(1 for s in segments if s["segment_type"] == "large")
    return [f"Segments ({large} large, {len(segments) - large} small", order, f"{legend}):"]


def _segment_lines(segments, limit):
    lines = ["  " + occupancy_line(s) for s in segments[:limit]]
    if len(segments) > limit:
        lines.append(f"  ... and {len(segments) - limit} more")
    return lines
