"""Freed blocks whose GPU work may still be running, on their way back to
the pool's free index.

A user's free makes a block pending (the compiled core links it into the
list of open frees). Open frees are covered by one event when the pool next
needs memory or is read (a batch); a batch is retired, its blocks joining
the free index, once its event has completed. Events complete in the order
they were recorded. While frees are held (Numba's defer_cleanup) nothing is
retired.

Not thread safe: the pool calls it under its lock.
"""

from collections import deque

from . import core as _core
from .core import H_OPEN_COUNT, NF, TABLE

_ADDR, _SIZE, _REQ, _PNEXT = _core.ADDR, _core.SIZE, _core.REQ, _core.PNEXT


class PendingFrees:
    """The open frees and the batches of a pool's compiled ``core`` (a
    :class:`~numba_alloc.policy.pool.Core`), the ``backend``'s events that cover
    them, and the hold count. ``stats``: the pool's
    :class:`~numba_alloc.policy.stats.PoolStats` (for num_sync_all_streams).
    ``on_retire``: None, or what is told the frees a batch retires, as
    [(address, requested size, allocated size)] (the pool's observers)."""

    __slots__ = ("_backend", "_core", "_stats", "_batches", "_spare_events", "hold",
                 "on_retire")

    def __init__(self, backend, core, stats):
        self._backend = backend
        self._core = core
        self._stats = stats
        self._batches = deque()      # (event, first row, count) in record order
        self._spare_events = []
        self.hold = 0                # > 0: freed blocks are not made reusable
        self.on_retire = None

    def __bool__(self):
        """True while some freed block is still pending."""
        return bool(self._batches) or bool(self._core.mv[H_OPEN_COUNT])

    @property
    def batched(self):
        """True while some batch waits for its event."""
        return bool(self._batches)

    def close_batch(self):
        """Cover the open frees with one event (when recording it raises,
        the frees stay open and the event is kept for the next try)."""
        core = self._core
        count = core.mv[H_OPEN_COUNT]
        if not count:
            return
        event = self._spare_events.pop() if self._spare_events else self._backend.event()
        try:
            event.record()
        except BaseException:
            self._spare_events.append(event)
            raise
        self._batches.append((event, _core.close_open(core.p), count))

    def poll(self):
        """Retire every batch whose event has completed (never blocks). When
        the newest is done, all are."""
        batches = self._batches
        if self.hold:
            return
        if batches and batches[-1][0].query():
            while batches:
                self._retire_oldest()
            return
        while batches and batches[0][0].query():
            self._retire_oldest()

    def synchronize(self):
        """Wait for the device, then retire every pending free (none while
        held)."""
        self.close_batch()
        self._backend.synchronize()
        self._stats.num_sync_all_streams += 1
        while self._batches and not self.hold:
            self._retire_oldest()

    def _retire_oldest(self):
        """Retire the oldest batch, keeping its event for reuse: its blocks'
        bytes join a free neighbour or a new free block."""
        event, head, count = self._batches.popleft()
        self._spare_events.append(event)
        self._retire(head, count)

    def _retire(self, head, count):
        """Retire the ``count`` pending rows linked from ``head``, then tell
        ``on_retire`` (if any) which frees completed."""
        if self.on_retire is None:
            _core.retire(self._core.p, head, count)
            return
        mv, row, freed = self._core.mv, head, []
        for _ in range(count):
            r = TABLE + row * NF
            freed.append((mv[r + _ADDR], mv[r + _REQ], mv[r + _SIZE]))
            row = mv[r + _PNEXT]
        _core.retire(self._core.p, head, count)
        self.on_retire(freed)

    def retire_open(self):
        """Retire the open frees now: the device is idle and nothing was
        queued since they were freed (reclaim's victims, once their copies
        to host memory have completed; not told to ``on_retire``: the
        observers hear of them as reclaimed)."""
        count = self._core.mv[H_OPEN_COUNT]
        if count:
            _core.retire(self._core.p, _core.close_open(self._core.p), count)

    def retire_all_now(self):
        """Retire every pending free without waiting and forget the events
        (they belong to a context being reset: the device is idle)."""
        for _, head, count in self._batches:
            self._retire(head, count)
        self._batches.clear()
        self._spare_events.clear()
        count = self._core.mv[H_OPEN_COUNT]
        if count:
            self._retire(_core.close_open(self._core.p), count)
