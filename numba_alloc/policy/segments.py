"""Segments: reserving one for a request the cached blocks cannot serve,
returning free ones to the device (the garbage-collection threshold, the
retry before out of memory, empty_cache), and releasing every one
(reset). A part of
:class:`~numba_alloc.policy.pool.Pool`, under its lock."""

import numpy as np

from . import core as _core
from . import reclaim as _reclaim
from .backend import DeviceOutOfMemory
from .block import LARGE, Segment, keep_values
from .core import NF, TABLE
from .sizes import MIN_LARGE_ALLOC, SMALL_SIZE, own_segment, segment_size

_GEN, _NEXT, _STATE = _core.GEN, _core.NEXT, _core.STATE
# the core's counters (a family per row, its fields per column: see stats.py),
# the reservations' families among them, and their fields
_COUNTERS = slice(_core.CBASE, _core.CBASE + _core.NFAMILIES * _core.NFIELD)
_RESERVATIONS = [_core.F_RESERVED_BYTES, _core.F_SEGMENT, _core.F_OVERSIZE_SEGMENTS]
_CUR, _TOTALS = slice(_core.CUR, _core.CUR + 2), slice(_core.INC, _core.DEC + 2)
_INC, _DEC = slice(_core.INC, _core.INC + 2), slice(_core.DEC, _core.DEC + 2)
_PEAKS = slice(_core.PEAK, _core.PEAK + 3)

# memory is scarce once the pool has reserved this fraction of its limit: then
# keep_whole_segments (big free segments stay whole and returnable),
# separate_big_segments (a request below MIN_LARGE_ALLOC is carved from a big
# segment only once the pool cannot grow), reuse first (freed blocks serve
# before other free space is split, at an event each) and, with defrag on,
# split rests (a large block keeps no rest of its free block, which a
# defragmentation can then gather) are in force; with memory to spare the
# pool places as PyTorch does, reserving less and recording fewer events
SCARCE_FROM = 0.35


class Segments:
    """Growth and release of the pool's segments."""

    def _grow(self, size, kind, nbytes):
        """Reserve a new segment for a ``size``-byte block and carve it (of
        the block's own size below MIN_LARGE_ALLOC while
        separate_big_segments holds); None when growth is off, the limit
        forbids it or the device is full."""
        if self._growth_off:
            return None
        if kind == LARGE and self._range is not None:
            placement = self._placement(size)
            if placement is not None:       # else a segment of its own, outside the range
                return self._grow_by_pages(placement, size, kind, nbytes)
        standard = segment_size(size, self._mv[_core.H_FIT_SEGMENTS])
        if self._mv[_core.H_BIG_APART] and SMALL_SIZE < size < MIN_LARGE_ALLOC:
            standard = own_segment(size)        # separate_big_segments: tight
        reserved = self.stats.current("reserved_bytes")
        threshold = self._settings.garbage_collection_threshold
        trim_after = 0
        releasable = (threshold is not None and reserved + standard > threshold * self._limit
                      and self._releasable_bytes())
        if releasable:
            device_free = self.backend.memory_info()[0]
            excess = reserved + standard - int(threshold * self._limit)
            if reserved + standard <= self._limit and device_free >= standard:
                # room without them: trim once the segment is reserved, so
                # that a failing reservation changes nothing
                trim_after = excess
            elif self._room_after_release(size, releasable, device_free):
                # only when growing can then go ahead: a request that can
                # never fit leaves the cache as it was
                self._release_free_segments(excess)
                reserved = self.stats.current("reserved_bytes")
        big = size >= MIN_LARGE_ALLOC
        for nbytes_segment in ((standard, size) if size < standard else (standard,)):
            if reserved + nbytes_segment > self._limit:
                continue
            # oversize by the segment's size, as PyTorch counts them
            segment = self._add_segment(nbytes_segment, kind, nbytes_segment >= self._max_split,
                                        big)
            if segment is not None:
                self._reserve(1)
                core = self._core
                handle = self._handle(_core.take_row(core.p, segment.row, size, kind, nbytes),
                                      nbytes)
                if trim_after:
                    self._trim_after_growing(trim_after)
                return handle
        return None

    def _grow_by_pages(self, placement, size, kind, nbytes):
        """:meth:`_grow` with expandable segments: map the pages of
        ``placement`` (see _placement) for the block, then, past the
        garbage-collection threshold, unmap cached pages down to it."""
        handle = self._grow_mapped(placement, size, kind, nbytes)
        threshold = self._settings.garbage_collection_threshold
        if handle is not None and threshold is not None:
            excess = self.stats.current("reserved_bytes") - int(threshold * self._limit)
            if excess > 0:
                self._trim_after_growing(excess)
        return handle

    def _trim_after_growing(self, nbytes):
        """The garbage-collection trim of :meth:`_grow` once its segment is
        reserved: the request is served, so a backend that fails a release
        ends the trim there (that segment stays, free and counted) and
        raises nothing."""
        try:
            self._release_free_segments(nbytes)
        except Exception:      # noqa: BLE001 - the trim is best effort
            pass

    def _add_segment(self, nbytes, kind, oversize, big=False):
        """Reserve a segment from the backend and index its one free block;
        the Segment, or None when the device is out of memory. ``big``: it
        is reserved for a request of MIN_LARGE_ALLOC bytes or more."""
        self._reserve(1)
        try:
            address = self.backend.allocate(nbytes)
        except DeviceOutOfMemory:
            return None
        segment = Segment(address, nbytes, kind, oversize, big, self._segments_made)
        self._segments_made += 1
        core = self._core
        segment.row = _core.add_segment(core.p, address, nbytes, kind, oversize, big)
        self._segments[address] = segment
        self.stats.num_device_alloc += 1
        self._update_scarce_rules()
        for observer in self._block_observers:
            observer.on_segment_alloc(self, segment)
        return segment

    def _update_scarce_rules(self):
        """Put the rules for scarce memory in force in the core (its take)
        while at least SCARCE_FROM of the pool's limit is reserved:
        keep_whole_segments and separate_big_segments (when the settings are
        on; the second not while ``_past_growth``), reuse first (when
        ``_reuse_first``) and split rests (when defrag is on). Called where
        the reserved bytes, the limit or the settings change."""
        scarce = self.stats.current("reserved_bytes") >= SCARCE_FROM * self._limit
        mv = self._core.mv
        # pages, not segments, go back to the device with expandable segments
        whole = self._range is None
        mv[_core.H_KEEP_WHOLE] = int(scarce and whole and self._settings.keep_whole_segments)
        mv[_core.H_BIG_APART] = int(scarce and whole and self._settings.big_segments_apart
                                    and not self._past_growth)
        mv[_core.H_REUSE_FIRST] = int(scarce and self._reuse_first)
        mv[_core.H_SPLIT_RESTS] = int(scarce and self._settings.defrag or not whole)

    def _room_after_release(self, size, released, device_free):
        """Whether a segment for a ``size``-byte block could be reserved once
        ``released`` bytes of cached segments are returned: within the limit
        and the device's free memory (``device_free`` bytes now)."""
        return released >= self._least_release(size, device_free)

    def _least_release(self, size, device_free):
        """The fewest bytes of cached segments whose return makes room for
        a segment for a ``size``-byte block (0 or less: room already); with
        expandable segments, for the pages of a large block."""
        need = min(size, segment_size(size))
        if size > SMALL_SIZE and self._range is not None:
            page = self.backend.page_size
            need = -(-size // page) * page
        return max(self.stats.current("reserved_bytes") + need - self._limit, need - device_free)

    def _counters(self):
        """A copy of the core's counters (a row per family), their peaks
        settled (at least the current values: stats.py keeps them lazily)."""
        c = self._core.a[_COUNTERS].reshape(-1, _core.NFIELD).copy()
        c[:, _PEAKS] = np.maximum(c[:, _PEAKS], np.c_[c[:, _CUR], c[:, _CUR].sum(axis=1)])
        return c

    def _growth_mark(self):
        """What :meth:`_give_back_growth` needs to undo a request about to
        be served: the segments made so far."""
        return self._segments_made

    def _give_back_growth(self, segment, mark):
        """After a request served from ``segment`` is undone (its block
        untaken, since ``mark``, from :meth:`_growth_mark`), return what
        growing reserved for it: the segment when it was reserved since the
        mark and is wholly free again; with expandable segments, the pages
        mapped for it. Joining those pages to the free block before them
        and cutting them off again re-index free blocks: the running totals
        and peaks that moved (but the reservations', which count the device
        calls made) are taken back. What else happened meanwhile (frees
        retired, a trim after growing) stays counted, and every current
        value is the core's."""
        if self._mapped(segment):
            mappings = self._mappings
            if mappings and mappings[-1][0] >= mark:   # (undone in reverse: the newest is its)
                _, low, nbytes, joined = mappings.pop()
                before = self._counters()
                self._unmap_growth(low, nbytes)
                self._uncount(joined + self._counters() - before)
        elif segment.serial >= mark and self._wholly_free(segment):
            self._release_segment(segment)

    def _uncount(self, changed):
        """Take the running totals and peaks of ``changed`` (a difference of
        two :meth:`_counters`) off the core's, but the reservations'; the
        current values stay, and what they kept of ``changed`` (where other
        operations meanwhile made it differ from nothing) stays in the
        totals; no peak is below its current value."""
        c = self._core.a[_COUNTERS].reshape(-1, _core.NFIELD)    # a view
        kept = c[_RESERVATIONS].copy()
        settled = self._counters()
        c[:, _TOTALS] -= changed[:, _TOTALS]
        c[:, _INC] += np.maximum(changed[:, _CUR], 0)
        c[:, _DEC] -= np.minimum(changed[:, _CUR], 0)
        c[:, _PEAKS] = np.maximum(settled[:, _PEAKS] - changed[:, _PEAKS],
                                  np.c_[c[:, _CUR], c[:, _CUR].sum(axis=1)])
        c[_RESERVATIONS] = kept

    def _release_segment(self, segment):
        """Give a fully free segment back to the backend (unmap its pages,
        with expandable segments). When the backend raises, the segment
        stays in the pool, free and counted."""
        if self._mapped(segment):
            self.backend.unmap_pages(segment.address, segment.size)
        else:
            self.backend.release(segment.address)
        core = self._core
        _core.release_segment(core.p, segment.row, segment.kind, segment.size,
                              segment.oversize)
        segment.row = -1
        del self._segments[segment.address]
        stats = self.stats
        stats.num_device_free += 1
        stats.bytes_released += segment.size
        self._update_scarce_rules()
        for observer in self._block_observers:
            observer.on_segment_free(self, segment)

    def _free_segments(self):
        """The segments that are one free block each (_wholly_free, inlined:
        the retry before out of memory lists them under pressure)."""
        mv, free = self._core.mv, _core.FREE
        return [s for s in self._segments.values()
                if mv[TABLE + s.row * NF + _STATE] == free and mv[TABLE + s.row * NF + _NEXT] < 0]

    def _wholly_free(self, segment):
        """Whether ``segment`` is one free block."""
        mv, r = self._core.mv, TABLE + segment.row * NF
        return mv[r + _STATE] == _core.FREE and mv[r + _NEXT] < 0

    def _releasable_bytes(self):
        """Bytes of the fully free segments, without a walk: every free block
        in the index either shares its segment (inactive_split_bytes) or is
        a whole segment; with expandable segments, the whole pages inside
        the free blocks of the mapped segments instead of those (a walk)."""
        if self._range is not None:
            return self._free_page_bytes() + sum(
                s.size for s in self._free_segments() if not self._mapped(s))
        return self._free_bytes() - self.stats.current("inactive_split_bytes")

    def _release_free_segments(self, nbytes):
        """Return fully free segments, smallest first, until ``nbytes`` have
        been returned or none is left (the garbage-collection threshold)."""
        released = 0
        try:
            for segment in sorted(self._free_segments(), key=lambda s: s.size):
                if released >= nbytes:
                    break
                self._release_segment(segment)
                released += segment.size
            if self._range is not None and released < nbytes:
                released += self._unmap_free_pages(nbytes - released)
        finally:
            if released:
                self.stats.num_cache_trims += 1

    def _reclaim_and_grow(self, size, kind, nbytes):
        """Return cached free segments to the device, then grow: first the
        smallest single segment whose release makes room, else all of them.
        Does nothing when returning every one could not make room."""
        if self._growth_off:
            return None
        releasable = self._releasable_bytes()
        if not releasable:
            return None
        least = self._least_release(size, self.backend.memory_info()[0])
        if releasable < least:
            return None
        if self._range is not None:     # pages: all go, then the block maps its own
            self._release_all_free()
            return self._grow(size, kind, nbytes)
        # the smallest single free segment whose return makes room
        single = None
        for segment in self._free_segments():
            if segment.size >= least and (single is None or segment.size < single.size):
                single = segment
        if single is not None:
            self._release_segment(single)
            self.stats.num_cache_trims += 1
            block = self._grow(size, kind, nbytes)
            if block is not None:
                return block
        self._release_all_free()
        return self._grow(size, kind, nbytes)

    def _release_all_free(self):
        """Return every fully free segment; once one has been returned, count
        a cache flush."""
        segments = nbytes = 0
        try:
            for segment in self._free_segments():
                self._release_segment(segment)
                segments += 1
                nbytes += segment.size
            if self._range is not None:
                unmapped = self._unmap_free_pages()
                segments += bool(unmapped)
                nbytes += unmapped
        finally:
            if segments:
                self.stats.num_cache_flushes += 1
                for observer in self._observers:
                    observer.on_cache_flush(self, segments, nbytes)

    def empty_cache(self) -> None:
        """Return every fully free segment to the device, after waiting for
        pending frees. With growth off the preallocated arena is kept.
        RuntimeError, nothing changed, once the device context is gone
        (Backend.check_alive)."""
        with self._lock:
            self.backend.check_alive()
            waited = self._synchronize()
            if not self._growth_off:
                self._release_all_free()
            # one num_sync_all_streams, waiting or not, as PyTorch's
            # release_cached_blocks counts (not when the release fails)
            self.stats.num_sync_all_streams += not waited

    def reset(self) -> None:
        """Release every segment, live blocks included, and return to the
        uninitialized state (Numba's context reset). The handles of blocks
        that were live become invalid: free(), pin() and unpin() then raise
        ValueError (the Numba glue's finalizers check first). Waits for the
        device first, even inside :meth:`hold_frees` (and for the other
        devices when pinned blocks given back to the host cache may still
        be used by their work). Raises what the backend
        raises: when waiting fails nothing has changed; when returning a
        segment fails, the segments not yet returned stay, free and counted,
        and a later reset() returns them (the device heaps and NRT's heap are
        closed either way: their blocks are gone)."""
        with self._lock:
            self._free_deferred()
            if self._segments or self._residency.reclaimed:
                self.backend.synchronize()
            self.host_cache.wait_for_other_devices()    # before forget_work below
            # the heaps' blocks die below: closed before anything can fail, so
            # that none stays open (nor serves NRT) on a block that is gone
            for heap in list(self.device_heaps):
                heap._detach()
            self.nrt_heap = None        # (its heap among them; its descriptor dies below)
            observers = self._block_observers
            for segment in list(self._segments.values()):
                for row, block in self._allocated(segment):
                    if block is not None:
                        keep_values(block, self._mv, row)
                    _core.release(self._p, row, self._mv[TABLE + row * NF + _GEN])
                    self._handles[row] = None
                    if block is not None:
                        for observer in observers:
                            observer.on_free(self, block)
            self._forget_staged()
            _reclaim.forget(self)               # reclaimed blocks' chunks back to the cache,
            self.host_cache.forget_work()       # which returns them to the backend
            self._pending.retire_all_now()     # the events belong to the context being reset
            for segment in list(self._segments.values()):
                self._release_segment(segment)
            self._free_range()
            self._handles[:] = [None] * len(self._handles)
            self._initialized = False
