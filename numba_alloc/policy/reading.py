"""Reading a pool: memory_stats, the snapshot, the counters' current,
peak and accumulated values, the out-of-memory report. A part of
:class:`~numba_alloc.policy.pool.Pool`; every public reader takes the lock
and first does the frees finalizers handed over."""

from . import core as _core
from .block import ALLOCATED
from .counters import (DEVICE_HEAP, DEVICE_HEAP_COUNTERS, EVENTS, FAMILIES, NRT_HEAP,
                       NRT_HEAP_COUNTERS)
from .core import NF, TABLE
from .errors import OutOfMemoryReport
from .pool_settings import pool_limit
from .sizes import SMALL_SIZE

_FAMILIES = tuple(c.name for c in FAMILIES)
_COUNTS = (*EVENTS, "largest_alloc_size")
_ADDR, _SIZE, _REQ, _STATE, _PIN = _core.ADDR, _core.SIZE, _core.REQ, _core.STATE, _core.PIN
_SNAPSHOT_STATES = {_core.ALLOCATED: "active_allocated", _core.PENDING: "active_pending_free",
                    _core.FREE: "inactive"}


def _check_family(family):
    if family not in _FAMILIES:
        raise ValueError(f"unknown counter family {family!r}; one of {', '.join(_FAMILIES)}")


class Reading:
    """The pool's counters, stats and snapshot. numba_alloc.api.compat
    builds PyTorch's, TensorFlow's and TF-LMS's names on these primitives.
    Each takes the lock (hold pool.lock across several to read them at one
    instant) and first does the frees that finalizers handed to free_later."""

    def _refresh(self):
        """Take the finalizers' frees and retire the frees whose GPU work has
        completed (never blocks), so that what is read next is up to date.
        Once the device context is gone (a pool whose reset failed, held
        across cuda.close()) the frees stay as they are: no event is asked."""
        self._free_deferred()
        if self.backend.context_alive:
            self._pending.close_batch()
            self._pending.poll()

    def memory_stats(self) -> dict[str, int]:
        """The counters, keyed as torch.cuda.memory_stats (see docs/stats.md).
        Frees whose GPU work has completed are retired first."""
        with self._lock:
            self._refresh()
            return self._stats_dict()

    def _stats_dict(self, heaps=None, nrt_heap=None):
        """memory_stats() as the counters are (nothing retired first);
        ``heaps`` as for :meth:`_device_heap_stats`, ``nrt_heap`` the NRT
        heap's counters as already read (else they are read now)."""
        stats = self.stats.as_dict(self._settings.max_split_size)
        stats.update(self._device_heap_stats(heaps))
        if nrt_heap is None:
            nrt_heap = self.nrt_heap.counters() if self.nrt_heap is not None else {}
        stats.update({f"{NRT_HEAP}.{c.name}": nrt_heap.get(c.name, 0) for c in NRT_HEAP_COUNTERS})
        stats.update(self.managed.as_dict())
        return stats

    def _user_heaps(self):
        """The open DeviceHeaps but the one serving NRT (counted in nrt.*)."""
        return [heap for heap in list(self.device_heaps) if not getattr(heap, "serves_nrt", False)]

    def _device_heap_stats(self, heaps=None):
        """The device_heap.* keys: the open heaps' counters, summed (each as
        read without waiting for kernels still running, see DeviceHeap.stats).
        ``heaps``: each open heap's stats() as already read (a snapshot's),
        else they are read now."""
        if heaps is None:
            heaps = [{**heap.counters()[0], "reserved_bytes": heap.reserved_bytes}
                     for heap in self._user_heaps()]
        totals = dict.fromkeys((c.name for c in DEVICE_HEAP_COUNTERS), 0)
        for heap in heaps:
            for name in totals:
                totals[name] += 1 if name == "count" else heap[name]
        return {f"{DEVICE_HEAP}.{name}": value for name, value in totals.items()}

    def snapshot(self) -> dict:
        """Segments and blocks, with the stats, taken atomically. The
        segments follow torch.cuda.memory_snapshot(): each a dict with
        address, total_size, allocated_size, active_size, requested_size,
        segment_type ('small'/'large'), is_expandable (a run of pages
        mapped under expandable_segments), and blocks, each with address, size,
        requested_size, state ('active_allocated', 'active_pending_free' or
        'inactive') and pinned. ``device_heaps``: per open DeviceHeap, the
        address of its (pinned) block and its :meth:`DeviceHeap.stats`, whose
        ``classes`` give its occupancy per size class; ``nrt_heap``: the
        heap serving NRT (nrt_heap_size), alike, or None. ``reclaimed``: the
        blocks reclaim keeps in host memory (where they were, their sizes);
        ``in_use``: the blocks inside :meth:`use` (size, resident);
        ``staged``: the staged blocks (address, size, requested_size);
        ``host_blocks``: the pinned host cache's blocks (size, flags, state);
        ``device``: the device's total and free bytes as its driver reports
        them at that instant, ``scratch_bytes``, what the backend holds
        outside the segments, and ``malloc_heap_size``, its device malloc
        heap's bytes (None without one); None, the driver not asked, once
        the device context is gone (Backend.context_alive: cuda.close()),
        the pool's own figures kept."""
        with self._lock:
            self._refresh()
            heaps = [{"address": heap.address, **heap.stats()}    # each read once
                     for heap in sorted(self._user_heaps(), key=lambda heap: heap.address)]
            nrt_heap = None
            if self.nrt_heap is not None:
                nrt_heap = {"address": self.nrt_heap.heap.address, **self.nrt_heap.stats()}
            device = None
            if self.backend.context_alive:
                free, total = self.backend.memory_info()
                device = {"total": total, "free": free,
                          "scratch_bytes": self.backend.scratch_bytes,
                          "malloc_heap_size": self.backend.malloc_heap_size()}
            return {"segments": self._segment_records(),
                    "stats": self._stats_dict(heaps, nrt_heap or {}),
                    "device": device,
                    "device_heaps": heaps,
                    "nrt_heap": nrt_heap,
                    "reclaimed": self._reclaimed_records(),
                    "staged": self._staged_records(),
                    "host_blocks": self.host_cache.records(),
                    "in_use": [{"size": block.allocated_size, "resident": self.is_resident(block)}
                               for block in self._residency.active]}

    def inactive_bytes(self) -> int:
        """Bytes of the resident live blocks that are not in use (outside
        :meth:`use`): what reclaim may take, unless they are pinned."""
        with self._lock:
            self._free_deferred()
            return self._inactive_bytes()

    def _inactive_bytes(self):
        """inactive_bytes() as the pool is (no finalizer's free taken)."""
        in_use = sum(block.allocated_size for block in self._residency.active
                     if self.state_of(block) is ALLOCATED)
        return self.stats.current("allocated_bytes") - in_use

    def _unpinned_bytes(self):
        """Bytes of the resident live blocks that are not pinned (blocks in
        use are): those reclaim may take, once their GPU work completes."""
        mv = self._mv
        return sum(mv[TABLE + row * NF + _SIZE] for segment in self._segments.values()
                   for row in self._core.rows_of(segment)
                   if mv[TABLE + row * NF + _STATE] == _core.ALLOCATED
                   and not mv[TABLE + row * NF + _PIN])

    def _reclaimed_records(self):
        """The snapshot's reclaimed blocks: where they were on the device
        (``address``) and their bytes, now in pinned host memory."""
        return [{"address": saved.address, "size": saved.size,
                 "requested_size": saved.requested, "where": "host"}
                for saved in self._residency.reclaimed.values()]

    def _segment_records(self):
        """The snapshot's segments, as they are (nothing retired first)."""
        segments = []
        for segment in sorted(self._segments.values(), key=lambda s: s.address):
            blocks = self._snapshot_blocks(segment)
            segments.append({
                "device": self.backend.device_id,
                "address": segment.address,
                "total_size": segment.size,
                "allocated_size": sum(b["size"] for b in blocks
                                      if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in blocks),
                "stream": 0,
                "segment_type": ("small", "large")[segment.kind],
                "is_expandable": segment.mapped,
                "blocks": blocks,
            })
        return segments

    def _snapshot_blocks(self, segment):
        mv, blocks = self._mv, []
        for row in self._core.rows_of(segment):
            r = TABLE + row * NF
            blocks.append({"address": mv[r + _ADDR], "size": mv[r + _SIZE],
                           "requested_size": mv[r + _REQ],
                           "state": _SNAPSHOT_STATES[mv[r + _STATE]],
                           "pinned": bool(mv[r + _PIN])})
        return blocks

    def current(self, family, retire_completed=False) -> int:
        """The current value of counter ``family``, over both pools: bytes
        for the ``*_bytes`` families, a number of blocks or segments for the
        others. ``family``: the name of one of
        :data:`numba_alloc.policy.counters.FAMILIES`; ValueError for another. ``retire_completed``: first retire the frees whose GPU
        work has completed (never blocks), as memory_stats() does; only the
        active, requested and inactive_split families change by it."""
        _check_family(family)
        with self._lock:
            if retire_completed:
                self._refresh()
            else:
                self._free_deferred()
            return self.stats.current(family)

    def peak(self, family) -> int:
        """The peak of :meth:`current` ``(family)`` since the last
        :meth:`reset_peaks`."""
        _check_family(family)
        with self._lock:               # settling a peak writes it
            self._free_deferred()
            return self.stats.peak(family)

    def accumulated(self, family) -> tuple[int, int]:
        """(increase, decrease) of counter ``family`` over both pools since
        the last :meth:`reset_accumulated`: memory_stats()'s ``allocated``
        and ``freed`` (``accumulated("allocation")[0]``: the requests served)."""
        _check_family(family)
        with self._lock:
            self._free_deferred()
            return self.stats.accumulated(family)

    def count(self, name) -> int:
        """An event counter: a name of :data:`numba_alloc.policy.counters.EVENTS`
        (``num_*`` times, ``bytes_released`` and ``bytes_defragged`` in
        bytes), or ``"largest_alloc_size"`` (the largest block handed out,
        in bytes after rounding); ValueError for another name."""
        if name not in _COUNTS:
            raise ValueError(f"count: unknown counter {name!r}; one of {', '.join(_COUNTS)}")
        with self._lock:
            self._free_deferred()
            return getattr(self.stats, name)

    def reset_peaks(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._free_deferred()
            self.stats.reset_peak()
            self.managed.reset_peaks()

    def reset_accumulated(self) -> None:
        """Zero every increase and decrease (:meth:`accumulated`) and the
        ``num_*`` and ``bytes_*`` event counters (not largest_alloc_size)."""
        with self._lock:
            self._free_deferred()
            self.stats.reset_accumulated()
            self.managed.reset_accumulated()

    def clear_stats(self) -> None:
        """As TensorFlow's BFCAllocator::ClearStats (its reset_memory_stats):
        :meth:`since_clear` restarts from 0 and the peaks of allocated_bytes
        go to their current values; every other counter keeps its value (the
        peak of reserved_bytes, the totals, memory_stats()' largest_alloc_size)."""
        with self._lock:
            self._free_deferred()
            self.stats.clear()

    def since_clear(self) -> tuple[int, int]:
        """(requests served since the last :meth:`clear_stats` or
        :meth:`reset_accumulated`, the largest block handed out since the
        last clear_stats, in bytes after rounding): TensorFlow's num_allocs
        and largest_alloc_size."""
        with self._lock:
            self._free_deferred()
            return self.stats.since_clear()

    def limit_bytes(self) -> int:
        """Most bytes the pool may reserve: its limit setting resolved
        against the device's total memory, or that total, whichever is
        smaller, and never MOST_RESERVED or more (asks the backend: its
        RuntimeError once the device context is gone, Backend.check_alive)."""
        total = self.backend.memory_info()[1]
        with self._lock:
            return min(pool_limit(self._settings, total), total)

    def _out_of_memory_report(self, nbytes, size):
        """What an OutOfMemoryError reports, read without changing the pool:
        no finalizer's free is taken, no pending free retired, nothing
        counted (so the message shows the state the request failed in)."""
        stats = self.stats
        device_free, total = self.backend.memory_info()
        settings = self._settings
        return OutOfMemoryReport(
            nbytes=nbytes, size=size, device_name=self.backend.name,
            device_id=self.backend.device_id, device_total=total, device_free=device_free,
            allocated=stats.current("allocated_bytes"),
            cached=stats.current("reserved_bytes") - stats.current("active_bytes"),
            largest_free=_core.largest(self._core.p),
            limit=min(self._limit, total), growth=not self._growth_off,
            initialized=self._initialized, defrag=settings.defrag, small=size <= SMALL_SIZE,
            refusal=self._refusal, segments=self._segment_records(),
            stats=self._stats_dict(), reclaim=settings.reclaim,
            inactive=self._inactive_bytes(), reclaimable=self._unpinned_bytes(),
            host_limit=settings.host_limit, malloc_heap=self.backend.malloc_heap_size(),
            nrt_heap_size=settings.nrt_heap_size, expandable=self._range is not None,
            pages_available=bool(self.backend.page_size) and settings.growth
            and settings.max_split_size_mb is None,
            reclaim_available=self.backend.reclaims and not (
                self.relocator and self.relocator.reclaim_refused()))
