"""Scoped statistics: what a region of code allocated from a pool.

``with numba_alloc.track("name", device) as t:`` counts, while the region
runs, every allocation and free of the pool (from any thread) and every
segment it reserves or returns, as RMM's statistics adaptor counts between
push_counters and pop_counters. Each :class:`Counter` has ``current`` (net
change since the region began: negative when the region freed more than it
allocated), ``peak`` (the highest ``current`` reached, at least 0) and
``total`` (everything added). Bytes are the blocks' allocated sizes (after
rounding to 512), the memory they hold: a block reclaimed to host memory
counts as freed, and as allocated again when it comes back, as the pool
counts it.

Regions nest: a region opened inside another (in the same thread or task)
is its child, and :meth:`Tracker.report` shows the tree. The counters stop
when the region ends and keep their values.
"""

import contextlib
import contextvars
from collections.abc import Iterator

from .display import tracker_html
from ..policy.observers import PoolObserver
from ..plugin.registry import resolve_pool
from ..units import format_bytes

_open_regions = contextvars.ContextVar("numba_alloc_open_regions", default=())


class Counter:
    """``current``, ``peak`` and ``total`` of one quantity in a region."""

    __slots__ = ("current", "peak", "total")

    def __init__(self):
        self.current = self.peak = self.total = 0

    def add(self, amount):
        self.current += amount
        self.total += amount
        if self.current > self.peak:
            self.peak = self.current

    def remove(self, amount):
        self.current -= amount

    def __repr__(self):
        return f"Counter(current={self.current}, peak={self.peak}, total={self.total})"


class Tracker(PoolObserver):
    """The statistics of one region: ``bytes`` and ``allocations`` (blocks
    handed out and freed), ``reserved`` (bytes of segments reserved and
    returned), ``name``, ``children`` (the regions opened inside it).
    :meth:`as_dict`, :meth:`report` and the repr read the counters of one
    instant (under the pool's lock), from any thread."""

    def __init__(self, name):
        self.name = name
        self.bytes = Counter()
        self.allocations = Counter()
        self.reserved = Counter()
        self.children = []
        self._lock = contextlib.nullcontext()      # the pool's, once track() attaches it

    def _figures(self):
        """(bytes, allocations, reserved), each (current, peak, total), of one instant."""
        with self._lock:
            return tuple((c.current, c.peak, c.total)
                         for c in (self.bytes, self.allocations, self.reserved))

    def on_malloc(self, pool, block):
        self.bytes.add(block.allocated_size)
        self.allocations.add(1)

    def on_free(self, pool, block):
        self.bytes.remove(block.allocated_size)
        self.allocations.remove(1)

    def on_reclaim(self, pool, block):
        # it holds no device memory, as the pool counts it (its free, later,
        # takes nothing off: on_free_reclaimed)
        self.bytes.remove(block.allocated_size)
        self.allocations.remove(1)

    def on_bring_back(self, pool, block, old_address):
        self.bytes.add(block.allocated_size)
        self.allocations.add(1)

    def on_segment_alloc(self, pool, segment):
        self.reserved.add(segment.size)

    def on_segment_free(self, pool, segment):
        self.reserved.remove(segment.size)

    def as_dict(self):
        """{'name', 'bytes', 'allocations', 'reserved' (each {'current',
        'peak', 'total'}), 'children' (a list of such dicts)}."""
        b, a, r = (dict(zip(("current", "peak", "total"), f)) for f in self._figures())
        return {"name": self.name, "bytes": b, "allocations": a, "reserved": r,
                "children": [child.as_dict() for child in self.children]}

    def report(self):
        """The region and the regions inside it, one block of lines each."""
        return "\n".join(self._report_lines(0))

    def _report_lines(self, depth):
        pad = "  " * depth
        (b_now, b_peak, b_total), (a_now, a_peak, a_total), (r_now, r_peak, r_total) = \
            self._figures()
        lines = [f"{pad}{self.name}:",
                 f"{pad}  bytes:       peak {format_bytes(b_peak)}, "
                 f"current {_signed_bytes(b_now)}, total {format_bytes(b_total)}",
                 f"{pad}  allocations: peak {a_peak}, current {a_now:+d}, total {a_total}",
                 f"{pad}  reserved:    peak {format_bytes(r_peak)}, "
                 f"current {_signed_bytes(r_now)}, total {format_bytes(r_total)}"]
        for child in self.children:
            lines += child._report_lines(depth + 1)
        return lines

    def __repr__(self):
        (b_now, b_peak, _), (a_now, a_peak, _), (r_now, r_peak, _) = self._figures()
        return (f"Tracker({self.name!r}: bytes peak {format_bytes(b_peak)}, current "
                f"{_signed_bytes(b_now)}; allocations peak {a_peak}, current {a_now:+d}; "
                f"reserved peak {format_bytes(r_peak)}, current {_signed_bytes(r_now)}; "
                f"{len(self.children)} region{'s' * (len(self.children) != 1)} inside)")

    def _repr_html_(self):
        return tracker_html(self)


def _signed_bytes(nbytes):
    return ("-" if nbytes < 0 else "+") + format_bytes(abs(nbytes))


@contextlib.contextmanager
def track(name, device=None) -> "Iterator[Tracker]":
    """Context manager: a :class:`Tracker` counting what the pool does while
    the block runs. ``name``: a non-empty str naming the region. ``device``:
    a Pool, a GPU number, a TensorFlow name such as "GPU:0", or None (the
    current GPU); the block runs on the GPU that was current. Raises
    TypeError or ValueError for a bad name."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {name!r}")
    if not name:
        raise ValueError("name must not be empty")
    tracker = Tracker(name)
    parents = _open_regions.get()
    with resolve_pool(device) as pool, pool.lock:
        pool._free_deferred()       # frees finalizers handed over before: not the region's
        tracker._lock = pool.lock   # (its counters change under it)
        pool.add_observer(tracker)
    if parents:
        parents[-1].children.append(tracker)
    token = _open_regions.set(parents + (tracker,))
    try:
        yield tracker
    finally:
        _open_regions.reset(token)
        pool.remove_observer(tracker)
