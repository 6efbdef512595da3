"""The allocation policy: a caching pool over a :class:`~numba_alloc.backend.Backend`.

No CUDA import. The block table, the free index and the counters are the
compiled core's (:mod:`numba_alloc.core`); the pending frees are
:mod:`numba_alloc.pending`'s, the defragmentation :mod:`numba_alloc.defrag`'s.
The rules, after PyTorch's caching allocator:

* requests are rounded up to 512 B; requests up to 1 MiB go to the small
  pool, carved from 2 MiB segments; larger ones to the large pool, carved from
  20 MiB segments below 10 MiB and from segments of their own size rounded up
  to 2 MiB above;
* the smallest free block that fits is taken (best fit) and split when the
  rest is worth keeping (512 B in the small pool, more than 1 MiB in the
  large pool); blocks of max_split_size or more are never split, and serve
  only requests of max_split_size or more that they exceed by under 20 MiB;
* a freed block is reusable only once the GPU work queued before its free
  has finished: frees are batched (at most 64 a batch), one event covers
  each batch, and a block rejoins the free index (coalescing with free
  neighbours) when its event completes;
* when no free block fits: reuse completed frees, grow by a segment (within
  the limit), synchronize the device if frees are still pending, return
  fully free cached segments to the device and grow again, with defrag on
  move live blocks to open a hole, then raise
  :class:`~numba_alloc.errors.OutOfMemoryError`.

With growth off the pool reserves one arena (its limit, or all free device
memory) at first use and carves every request from it.

Thread safety: every public method takes the pool's re-entrant lock.
Garbage-collector finalizers hand frees to :meth:`Pool.free_later`, which
never takes the lock: it queues them for the start of the next operation.
"""

import contextlib
import threading
import weakref
from collections import deque
from typing import NamedTuple

from . import core as _core
from . import defrag as _defrag
from . import reclaim as _reclaim
from .backend import Backend, DeviceOutOfMemory
from .block import ALLOCATED, DEAD, FREE, LARGE, PENDING, SMALL, Block, Segment
from .config import ARENA_UNIT, MiB, Settings, parse_settings
from .display import pool_html
from .core import H_NBYTES, NF, TABLE
from .counters import DEVICE_HEAP, DEVICE_HEAP_COUNTERS, EVENTS, FAMILIES
from .errors import OutOfMemoryReport
from .observers import PoolObserver
from .pending import PendingFrees
from .stats import PoolStats
from .summary import format_bytes as _fmt
from .validate import request_size

ROUND = 512                 # every block is a multiple of this
SMALL_SIZE = 1 * MiB        # largest request of the small pool
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB    # segment for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB       # larger requests get a segment of their own, rounded to this
_NO_LIMIT = 1 << 64
_CORE_NO_LIMIT = 1 << 62     # _NO_LIMIT as the core's int64 holds it
_CORE_LIMIT = 1 << 62       # requests the core takes (its sizes are int64)
_FAMILIES = tuple(c.name for c in FAMILIES)
_COUNTS = (*EVENTS, "largest_alloc_size")
_ADDR, _SIZE, _REQ, _NEXT, _STATE, _SEG, _PIN = (
    _core.ADDR, _core.SIZE, _core.REQ, _core.NEXT, _core.STATE, _core.SEG, _core.PIN)
_CORE_STATES = {_core.ALLOCATED: ALLOCATED, _core.PENDING: PENDING, _core.FREE: FREE}
_SNAPSHOT_STATES = {_core.ALLOCATED: "active_allocated", _core.PENDING: "active_pending_free",
                    _core.FREE: "inactive"}
_ROW_MASK, _ROW_BITS, _GEN = _core.ROW_MASK, _core.ROW_BITS, _core.GEN
_new_block = object.__new__


class Core:
    """A pool's compiled core (numba_alloc.core): its array ``a``, that
    array's address ``p`` (what the compiled functions take), and ``mv``, a
    memoryview of it for quick reads and writes. Growing replaces all three."""

    __slots__ = ("a", "p", "mv")

    def __init__(self, rows=256):
        self._set(_core.new_state(rows))

    def _set(self, a):
        self.a, self.p, self.mv = a, a.ctypes.data, memoryview(a)

    def reserve(self, rows):
        """Make room for ``rows`` new rows (under the pool's lock); True
        when the table grew."""
        if self.mv[_core.H_AVAIL] >= rows:
            return False
        self._set(_core.grown(self.a, rows))
        return True

    def rows_of(self, segment):
        """The rows of a segment's blocks, in address order."""
        mv, row = self.mv, segment.row
        while row >= 0:
            yield row
            row = mv[TABLE + row * NF + _NEXT]

    def is_free(self, row):
        return self.mv[TABLE + row * NF + _STATE] == _core.FREE


class PreparedSettings(NamedTuple):
    """Settings checked by :meth:`Pool.check_settings`, for :meth:`Pool.commit`:
    the settings and the limit in bytes they resolve to (None before the
    pool's first use)."""
    settings: Settings
    limit: int | None


def segment_size(size):
    """Bytes of the segment the pool reserves for a ``size``-byte block."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _keep_values(block, mv, row):
    """Keep the address and allocated size of ``block`` at ``row`` in its
    handle, before the block is freed (its row may then change)."""
    r = TABLE + row * NF
    block._address, block._allocated_size = mv[r + _ADDR], mv[r + _SIZE]


def _check_family(family):
    if family not in _FAMILIES:
        raise ValueError(f"unknown counter family {family!r}; one of {', '.join(_FAMILIES)}")


class Pool:
    """A caching pool of device memory on one backend.

    ``Pool(backend, **settings)``: ``backend`` a
    :class:`~numba_alloc.backend.Backend` (such as a SimulatedDevice), the
    settings those of :class:`~numba_alloc.config.Settings` (TypeError or
    ValueError otherwise). Sizes are in bytes.
    """

    def __init__(self, backend, **settings):
        if not isinstance(backend, Backend):
            raise TypeError("backend must be a numba_alloc.Backend, such as "
                            f"numba_alloc.SimulatedDevice(capacity), got {backend!r}")
        self.backend = backend
        self._settings = Settings()
        self._initialized = False
        self._core = core = Core()
        self._lock = threading.RLock()
        self._p, self._mv = core.p, core.mv     # the core's, as of its last growth
        self.stats = PoolStats(core)
        # row -> the handle of the allocated block there (its generation is
        # the row's); None for other rows. A free unregisters its handle, so
        # that a dead handle dies with its user's last reference.
        self._handles = [None] * int(core.a[_core.H_CAP])
        self._segments = {}          # address -> Segment
        self._deferred = deque()     # the blocks finalizers handed to free_later()
        self._pending = PendingFrees(backend, core, self.stats)
        self._observers = ()
        self.relocator = None        # the Numba glue's Relocator, if any
        self.device_heaps = weakref.WeakSet()   # the open DeviceHeaps carved from this pool
        self._residency = _reclaim.Residency()   # reclaimed blocks, active ones (reclaim.py)
        self._refusal = None         # why the last defragmentation was refused
        self._limit = _NO_LIMIT
        self.commit(self.check_settings(parse_settings(settings)))

    # -- settings ----------------------------------------------------------
    def commit(self, prepared):
        """Put settings from :meth:`check_settings` in force (under the lock
        held since then). Cannot fail: everything that could was done there."""
        old, settings = self._settings, prepared.settings
        self._settings = settings
        if self.relocator is not None and settings.reclaim != old.reclaim:
            self.relocator.reclaiming(self, settings.reclaim)
        self._max_split = settings.max_split_size or _NO_LIMIT
        self._growth_off = not settings.growth
        mv = self._core.mv
        mv[_core.H_MAX_SPLIT] = min(self._max_split, _CORE_NO_LIMIT)
        mv[_core.H_GROWTH_OFF] = int(self._growth_off)
        if self._initialized:
            self._limit = prepared.limit

    def settings(self):
        """The :class:`~numba_alloc.config.Settings` in force."""
        return self._settings

    def configure(self, **changes):
        """Change settings. Raises ValueError for an unknown key or bad value
        and RuntimeError for one that can no longer apply (growth or
        max_split_size_mb once the pool has reserved memory, a limit with
        growth off once the arena is reserved, a limit below the bytes
        already reserved, or a host_limit below the host memory reclaimed
        blocks hold); on error nothing is changed."""
        parsed = parse_settings(changes)
        with self._lock:
            self.commit(self.check_settings(parsed))

    def check_settings(self, parsed):
        """The :class:`PreparedSettings` that ``parsed`` (from
        :func:`~numba_alloc.config.parse_settings`) would put in force, with
        the limit resolved; raises as :meth:`configure` does, changing
        nothing. Hold the lock until :meth:`commit`."""
        with self._lock:
            old = self._settings
            new = Settings(**{**old.__dict__, **parsed})
            if not new.growth and isinstance(new.limit, float):
                arena = new.resolve_limit(self.backend.memory_info()[1])
                if arena < ARENA_UNIT:
                    raise ValueError(
                        f"limit {new.limit} of this device is {arena} bytes, below the "
                        f"{ARENA_UNIT} bytes the arena is reserved in with growth off")
            if new.reclaim and not old.reclaim:
                if not self.backend.reclaims:
                    raise RuntimeError(f"reclaim: {self.backend!r} cannot copy blocks to host "
                                       "memory")
                refused = self.relocator and self.relocator.reclaim_refused()
                if refused:
                    raise RuntimeError(refused)
            if new.host_limit is not None and new.host_limit != old.host_limit:
                _reclaim.release_host_buffers(self)
                held = self._residency.host_bytes
                if new.host_limit < held:
                    reclaimed = sum(saved.size for saved in self._residency.reclaimed.values())
                    raise RuntimeError(
                        f"host_limit {new.host_limit} is below the {held} bytes of host "
                        f"memory held: {reclaimed} by reclaimed blocks (use or free them "
                        f"first) and {held - reclaimed} by buffers whose copies are still "
                        "under way (synchronize() releases them)")
            if not self._initialized:
                return PreparedSettings(new, None)
            for key in ("growth", "max_split_size_mb"):
                if getattr(new, key) != getattr(old, key):
                    raise RuntimeError(
                        f"{key} cannot be changed once the pool is initialized "
                        "(it has reserved device memory)")
            limit = self._limit
            if new.limit != old.limit:
                if self._growth_off:
                    raise RuntimeError(
                        "limit cannot be changed with growth off once the "
                        "arena is reserved")
                limit = new.resolve_limit(self.backend.memory_info()[1])
                reserved = self.stats.current("reserved_bytes")
                if limit < reserved:
                    raise RuntimeError(
                        f"limit {limit} is below the {reserved} bytes the pool "
                        "already reserves; free memory and call empty_cache() first")
            return PreparedSettings(new, limit)

    @property
    def lock(self):
        """The pool's re-entrant lock: hold it to read several things (its
        snapshot, an observer's state) at one instant."""
        return self._lock

    @property
    def initialized(self):
        """True once the pool has reserved device memory or resolved its limit."""
        return self._initialized

    def _initialize(self):
        """Resolve the limit and, with growth off, reserve the arena. The
        pool stays uninitialized when this raises or the arena finds no
        memory, so the next request tries again."""
        free, total = self.backend.memory_info()
        self._limit = self._settings.resolve_limit(total)
        if self._growth_off:
            if self._settings.limit is None:
                nbytes = free - self.backend.headroom(free)
            else:
                nbytes = min(self._limit, free)
            if not self._reserve_arena(nbytes):
                return
        self._initialized = True

    def _reserve_arena(self, nbytes):
        """Reserve the largest arena of at most ``nbytes`` the device gives
        (trying 5% less each time); False when not even one unit fits."""
        nbytes = nbytes // ARENA_UNIT * ARENA_UNIT
        while nbytes >= ARENA_UNIT:
            if self._add_segment(nbytes, LARGE, False) is not None:
                return True
            nbytes = int(nbytes * 0.95) // ARENA_UNIT * ARENA_UNIT
        return False

    # -- allocation --------------------------------------------------------
    def malloc(self, nbytes):
        """A block of at least ``nbytes`` bytes (0 is allowed and gets a
        512-byte block). Raises TypeError or ValueError for a bad size and
        :class:`~numba_alloc.errors.OutOfMemoryError` when the request cannot
        be met; on any error the pool is as before. Thread safe."""
        if type(nbytes) is not int or nbytes < 0:
            nbytes = request_size(nbytes)
        with self._lock:
            if self._deferred:
                self._free_deferred()
            if not self._initialized:
                self._initialize()
            block = self._take(nbytes)
            if block is None:
                size, kind = self._size_and_kind(nbytes)
                block = self._malloc_slow(nbytes, size, kind)
            if self._observers:
                for observer in self._observers:
                    observer.on_malloc(self, block)
            return block

    def _malloc_unobserved(self, nbytes):
        """A block for ``nbytes`` under the lock, as malloc finds one but
        without telling observers (bringing a reclaimed block back)."""
        size, kind = self._size_and_kind(nbytes)
        return self._take(nbytes) or self._malloc_slow(nbytes, size, kind)

    def _malloc_undoable(self, nbytes):
        """Under the lock: (block, undo), a block for int ``nbytes`` >= 0 as
        malloc finds one, told to no observer (the caller tells them once it
        keeps the block), and what :meth:`_untake` needs to give it back.
        Raises as malloc does. Frees deferred by finalizers wait for the next
        operation (one of them may be of a block the caller is handling)."""
        if not self._initialized:
            self._initialize()
        largest = self._mv[_core.H_LARGEST]
        block = self._malloc_unobserved(nbytes)
        mv = self._mv                   # (the core may have grown)
        return block, (mv[_core.H_CARVED_FREE], mv[_core.H_CARVED_REST], largest)

    def _untake(self, block, undo):
        """Under the lock: give back ``block`` from :meth:`_malloc_undoable`,
        unpinned, never freed, as if it had never been handed out: its
        memory is free at once (work queued on it, on the legacy or a
        blocking stream, comes before any later work there), and every
        counter, running total and largest_alloc_size is as before (a peak
        too, unless an operation in between settled it while the block was
        held). Blocks from several calls go back in the reverse order. Tells
        no observer; cannot fail."""
        row = block._ticket & _ROW_MASK
        _keep_values(block, self._mv, row)
        self._handles[row] = None
        _core.untake(self._p, row, block._ticket >> _ROW_BITS, *undo)

    def _size_and_kind(self, nbytes):
        """(bytes a request of ``nbytes`` gets, SMALL or LARGE pool)."""
        size = ((nbytes + ROUND - 1) // ROUND * ROUND) or ROUND
        return size, LARGE if self._growth_off or size > SMALL_SIZE else SMALL

    def _take(self, nbytes):
        """Carve a block for ``nbytes`` from the best-fitting free block (the
        core rounds and picks the pool kind as malloc does), or None."""
        if nbytes >= _CORE_LIMIT:
            return None
        while True:
            ticket = _core.take(self._p, nbytes)
            if ticket != -2:
                break
            self._reserve(1)
        return None if ticket < 0 else self._handle(ticket, nbytes)

    def _handle(self, ticket, nbytes):
        """The handle of the block just carved with ``ticket``."""
        block = _new_block(Block)
        block._ticket = ticket
        block.pool = self
        block.size = nbytes
        block._address = block._allocated_size = None     # read from the core
        self._handles[ticket & _ROW_MASK] = block
        return block

    def _reserve(self, rows):
        """Room for ``rows`` new rows in the core's table."""
        core = self._core
        if core.reserve(rows):
            self._p, self._mv = core.p, core.mv
            self._handles.extend([None] * (int(core.a[_core.H_CAP]) - len(self._handles)))

    def _segment_of(self, row):
        """The Segment holding the block at ``row``."""
        return self._segments[self._core.mv[TABLE + row * NF + _SEG]]

    def _free_bytes(self, kind=None):
        """Bytes in the free index: of ``kind``, or of both."""
        mv = self._core.mv
        if kind is None:
            return mv[H_NBYTES] + mv[H_NBYTES + 1]
        return mv[H_NBYTES + kind]

    def _malloc_slow(self, nbytes, size, kind):
        pending = self._pending
        if pending:
            pending.close_batch()
            pending.poll()
            block = self._take(nbytes)
            if block is not None:
                return block
        block = self._grow(size, kind, nbytes)
        if block is not None:
            return block
        if pending.batched:
            pending.synchronize()
            block = self._take(nbytes) or self._grow(size, kind, nbytes)
            if block is not None:
                return block
        block = self._reclaim_and_grow(size, kind, nbytes)
        if block is not None:
            return block
        if self._settings.reclaim:
            block = _reclaim.reclaim_for(self, size, kind, nbytes)
            if block is not None:
                return block
        if self._settings.defrag and self._free_bytes():
            block = _defrag.make_room(self, size, kind, nbytes)
            if block is not None:
                return block
        self._out_of_memory(nbytes, size)

    def _out_of_memory(self, nbytes, size):
        """Raise OutOfMemoryError for a request of ``nbytes`` (``size`` after
        rounding), counted in num_ooms and told to the observers."""
        # may raise: then nothing is counted
        from .out_of_memory import OutOfMemoryError   # imports numba.cuda, once
        error = OutOfMemoryError.from_report(self._out_of_memory_report(nbytes, size))
        self.stats.num_ooms += 1
        for observer in self._observers:
            observer.on_out_of_memory(self, nbytes)
        raise error

    def _grow(self, size, kind, nbytes):
        """Reserve a new segment for a ``size``-byte block and carve it;
        None when growth is off, the limit forbids it or the device is full."""
        if self._growth_off:
            return None
        standard = segment_size(size)
        reserved = self.stats.current("reserved_bytes")
        threshold = self._settings.garbage_collection_threshold
        if threshold is not None and reserved + standard > threshold * self._limit:
            releasable = sum(seg.size for seg in self._free_segments())
            if releasable and self._room_after_release(
                    size, releasable, self.backend.memory_info()[0]):
                # only when growing can then go ahead: a request that can
                # never fit leaves the cache as it was
                self._release_free_segments(reserved + standard - int(threshold * self._limit))
                reserved = self.stats.current("reserved_bytes")
        oversize = size >= self._max_split
        for nbytes_segment in ((standard, size) if size < standard else (standard,)):
            if reserved + nbytes_segment > self._limit:
                continue
            segment = self._add_segment(nbytes_segment, kind, oversize)
            if segment is not None:
                self._reserve(1)
                core = self._core
                return self._handle(_core.take_row(core.p, segment.row, size, kind, nbytes),
                                    nbytes)
        return None

    def _add_segment(self, nbytes, kind, oversize):
        """Reserve a segment from the backend and index its one free block;
        the Segment, or None when the device is out of memory."""
        self._reserve(1)
        try:
            address = self.backend.allocate(nbytes)
        except DeviceOutOfMemory:
            return None
        segment = Segment(address, nbytes, kind, oversize)
        core = self._core
        segment.row = _core.add_segment(core.p, address, nbytes, kind, oversize)
        self._segments[address] = segment
        self.stats.num_device_alloc += 1
        for observer in self._observers:
            observer.on_segment_alloc(self, segment)
        return segment

    def _room_after_release(self, size, released, device_free):
        """Whether a segment for a ``size``-byte block could be reserved once
        ``released`` bytes of cached segments are returned: within the limit
        and the device's free memory (``device_free`` bytes now)."""
        need = min(size, segment_size(size))
        return (self.stats.current("reserved_bytes") - released + need <= self._limit
                and device_free + released >= need)

    def _release_segment(self, segment):
        """Give a fully free segment back to the backend. When the backend
        raises, the segment stays in the pool, free and counted."""
        self.backend.release(segment.address)
        core = self._core
        _core.release_segment(core.p, segment.row, segment.kind, segment.size,
                              segment.oversize)
        segment.row = -1
        del self._segments[segment.address]
        stats = self.stats
        stats.num_device_free += 1
        stats.bytes_released += segment.size
        for observer in self._observers:
            observer.on_segment_free(self, segment)

    def _free_segments(self):
        mv = self._core.mv
        return [s for s in self._segments.values()
                if mv[TABLE + s.row * NF + _STATE] == _core.FREE
                and mv[TABLE + s.row * NF + _NEXT] < 0]

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
        finally:
            if released:
                self.stats.num_cache_trims += 1

    def _reclaim_and_grow(self, size, kind, nbytes):
        """Return cached free segments to the device, then grow: first the
        smallest single segment whose release makes room, else all of them.
        Does nothing when returning every one could not make room. The retry
        counts once a segment has been returned (a backend that fails the
        first release changes nothing)."""
        if self._growth_off:
            return None
        segments = sorted(self._free_segments(), key=lambda s: s.size)
        if not segments:
            return None
        device_free = self.backend.memory_info()[0]
        if not self._room_after_release(size, sum(s.size for s in segments), device_free):
            return None
        single = next((s for s in segments
                       if self._room_after_release(size, s.size, device_free)), None)
        if single is not None:
            self._release_segment(single)
            self.stats.num_alloc_retries += 1
            self.stats.num_cache_trims += 1
            block = self._grow(size, kind, nbytes)
            if block is not None:
                return block
        self._release_all_free(retry=single is None)
        return self._grow(size, kind, nbytes)

    def _release_all_free(self, retry=False):
        """Return every fully free segment; once one has been returned, count
        a cache flush and, with ``retry``, an allocation retry."""
        released = False
        try:
            for segment in self._free_segments():
                self._release_segment(segment)
                released = True
        finally:
            if released:
                self.stats.num_cache_flushes += 1
                if retry:
                    self.stats.num_alloc_retries += 1

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
            host_limit=settings.host_limit,
            reclaim_available=self.backend.reclaims and not (
                self.relocator and self.relocator.reclaim_refused()))

    # -- defragmentation (numba_alloc.defrag) --------------------------------
    def defragment(self, nbytes=None):
        """Move live blocks together (see :func:`numba_alloc.defrag.defragment`):
        open a hole for ``nbytes``, or with None compact every segment.
        Returns a :class:`~numba_alloc.defrag.Defragmentation`."""
        return _defrag.defragment(self, nbytes)
    # -- defragmentation ----------------------------------------------------
    def _fits(self, size, kind):
        """Whether :meth:`_take` would find a free block for ``size`` bytes."""
        return size < _CORE_LIMIT and _core.fits(self._core.p, size, kind)

    def _max_run(self, size):
        """Free blocks of this many bytes or more do not serve ``size`` bytes."""
        return self._max_split if size < self._max_split else size + LARGE_SEGMENT

    def _handle_of(self, row):
        """The handle registered at allocated ``row``, or None when none of
        its generation is (such a block must not move)."""
        block = self._handles[row]
        if block is None or block._ticket >> _ROW_BITS != self._mv[TABLE + row * NF + _GEN]:
            return None
        return block

    def _allocated(self, segment):
        """(row, handle or None, see _handle_of) of a segment's allocated
        blocks, in address order."""
        mv = self._mv
        return [(row, self._handle_of(row)) for row in self._core.rows_of(segment)
                if mv[TABLE + row * NF + _STATE] == _core.ALLOCATED]

    def _blocks(self, segment):
        """The handles of a segment's allocated blocks, in address order."""
        return [block for _, block in self._allocated(segment) if block is not None]

    # -- freeing -----------------------------------------------------------
    def free(self, block):
        """Return a block from :meth:`malloc`. It becomes reusable once the
        GPU work queued before this call has finished. Raises ValueError for a
        block that is not live in this pool (double free, foreign block, a
        copy of a handle). Thread safe."""
        with self._lock:
            if self._is_reclaimed(block):
                _reclaim.free_reclaimed(self, block)
                for observer in self._observers:
                    observer.on_free(self, block)
                return
            row = self._allocated_row(block, "free")
            _keep_values(block, self._mv, row)
            done = _core.release(self._p, row, block._ticket >> _ROW_BITS)
            self._handles[row] = None
            if self._observers:
                for observer in self._observers:
                    observer.on_free(self, block)
            if done == 2:
                self._close_full_batch()

    def _close_full_batch(self):
        """The open frees fill a batch: cover them with an event and retire
        the batches whose events have completed, so that freed memory is
        reused while it is still in cache and the pool grows less. Best
        effort: when the backend fails, the frees stay open, and the next
        request that needs memory records their event (and raises)."""
        with self._lock:
            pending = self._pending
            try:
                pending.close_batch()
                pending.poll()
            except Exception:       # noqa: BLE001 (left to the next allocation, see above)
                pass

    def free_later(self, block):
        """Free ``block`` at the start of the pool's next operation (any
        malloc, synchronize, defragmentation, reset or stats read).
        For garbage-collector finalizers: they may run in the middle of a
        pool operation on this thread, or while this thread holds a lock
        another thread waits on inside the pool. Takes no lock and never
        raises; a block that is no longer live by then is skipped."""
        self._deferred.append(block)

    def _free_deferred(self):
        deferred = self._deferred
        while deferred:
            block = deferred.popleft()
            if self._allocated_row(block, None) >= 0 or self._is_reclaimed(block):
                self.free(block)

    def _live_row(self, block):
        """The core row of ``block`` while it is a handle of this pool that
        is allocated or pending; -1 otherwise."""
        if type(block) is not Block or block.pool is not self:
            return -1
        row = block._ticket & _ROW_MASK
        r, mv = TABLE + row * NF, self._mv
        state = mv[r + _STATE]
        if (mv[r + _GEN] == block._ticket >> _ROW_BITS
                and (state == _core.ALLOCATED or state == _core.PENDING)):
            return row
        return -1

    def state_of(self, block):
        """ALLOCATED (a reclaimed block too), PENDING (freed, its GPU work
        may be running) or DEAD (any handle that is not a live block of this
        pool). Takes no lock."""
        if self._is_reclaimed(block):
            return ALLOCATED
        row = self._live_row(block)
        return DEAD if row < 0 else _CORE_STATES[self._mv[TABLE + row * NF + _STATE]]

    def pins_of(self, block):
        """How many pins hold ``block`` (0 once it is no longer live, or
        while it is reclaimed)."""
        if self._is_reclaimed(block):
            return 0
        row = self._live_row(block)
        return 0 if row < 0 else self._mv[TABLE + row * NF + _PIN]

    def segment_of(self, block):
        """The :class:`~numba_alloc.block.Segment` holding a live ``block``,
        else None (also while it is reclaimed)."""
        if self._is_reclaimed(block):
            return None
        row = self._live_row(block)
        return None if row < 0 else self._segments.get(self._mv[TABLE + row * NF + _SEG])

    # -- whole-pool operations ----------------------------------------------
    def synchronize(self):
        """Wait for pending frees to become reusable (synchronizes the device
        only when some have not completed)."""
        with self._lock:
            self._free_deferred()
            pending = self._pending
            pending.close_batch()
            pending.poll()
            _reclaim.release_host_buffers(self)
            if pending.batched or self._residency.host_pending:
                pending.synchronize()
                _reclaim.device_idle(self)

    def empty_cache(self):
        """Return every fully free segment to the device, after waiting for
        pending frees. With growth off the preallocated arena is kept."""
        with self._lock:
            self.synchronize()
            if not self._growth_off:
                self._release_all_free()

    def reset(self):
        """Release every segment, live blocks included, and return to the
        uninitialized state (Numba's context reset). The handles of blocks
        that were live become invalid: free(), pin() and unpin() then raise
        ValueError (the Numba glue's finalizers check first). Waits for the
        device first, even inside :meth:`hold_frees`. Raises what the backend
        raises: when waiting fails nothing has changed; when returning a
        segment fails, the segments not yet returned stay, free and counted,
        and a later reset() returns them."""
        with self._lock:
            self._free_deferred()
            if self._segments or self._residency.host_pending or self._residency.reclaimed:
                self.backend.synchronize()
            observers = self._observers
            for segment in list(self._segments.values()):
                for row, block in self._allocated(segment):
                    if block is not None:
                        _keep_values(block, self._mv, row)
                    _core.release(self._p, row, self._mv[TABLE + row * NF + _GEN])
                    self._handles[row] = None
                    if block is not None:
                        for observer in observers:
                            observer.on_free(self, block)
            self._pending.retire_all_now()     # the events belong to the context being reset
            _reclaim.forget(self)
            for segment in list(self._segments.values()):
                self._release_segment(segment)
            self._handles[:] = [None] * len(self._handles)
            for heap in list(self.device_heaps):
                heap._detach()          # its block is gone: the heap is closed
            self._initialized = False

    def add_observer(self, observer):
        """Attach a :class:`~numba_alloc.observers.PoolObserver`; TypeError for
        anything else."""
        if not isinstance(observer, PoolObserver):
            raise TypeError("observer must be a numba_alloc.observers.PoolObserver "
                            f"(subclass it and override what you need), got {observer!r}")
        with self._lock:
            self._observers = self._observers + (observer,)

    def remove_observer(self, observer):
        """Detach an observer, once it has been told of the frees handed to
        free_later() meanwhile; ValueError if it is not attached."""
        with self._lock:
            self._free_deferred()
            observers = list(self._observers)
            if observer not in observers:
                raise ValueError(f"remove_observer: {observer!r} is not attached to this pool")
            observers.remove(observer)
            self._observers = tuple(observers)

    @contextlib.contextmanager
    def hold_frees(self):
        """While active (nestable, for all threads), freed blocks stay
        pending and are not handed out again (Numba's defer_cleanup)."""
        with self._lock:
            self._pending.hold += 1
        try:
            yield
        finally:
            with self._lock:
                self._pending.hold -= 1

    def pin(self, block):
        """Keep a live block where it is until as many :meth:`unpin` calls
        (IPC export, an address that left Numba); a reclaimed block is
        brought back first (OutOfMemoryError when it cannot be). Raises
        ValueError for a block that is not live in this pool."""
        with self._lock:
            if self._is_reclaimed(block):
                _reclaim.bring_back(self, [block])      # pinned once
                return
            self._mv[TABLE + self._allocated_row(block, "pin") * NF + _PIN] += 1

    @contextlib.contextmanager
    def use(self, *blocks):
        """Make ``blocks`` resident and active for the duration of the
        ``with`` block: reclaimed ones come back (all of them, or none:
        OutOfMemoryError, and each block is as it was), and none of them is
        reclaimed or moved until the GPU work queued inside has completed.
        Outside it a block is inactive: with the ``reclaim`` setting on, the
        pool may reclaim it to host memory when it needs room, and its
        address then means nothing (``block.resident`` is False) until its
        next use. ValueError for a block that is not live in this pool.
        Thread safe; uses nest."""
        for block in blocks:
            if type(block) is not Block:
                raise TypeError(f"use: blocks must be Block handles from malloc, got {block!r}")
        handles = self._begin_use(list(dict.fromkeys(blocks)))
        try:
            yield
        finally:
            self._end_use(handles)

    def _begin_use(self, handles, stream=0):
        """Enter :meth:`use` for ``handles`` (a list of distinct Block
        handles), for work queued on ``stream`` (0: the legacy default
        stream); returns them, to pass to :meth:`_end_use`."""
        with self._lock:
            if self._deferred:
                self._free_deferred()
            _reclaim.begin_use(self, handles, stream)
        return handles

    def _end_use(self, handles, completed=False, stream=0):
        """Leave :meth:`use` for what :meth:`_begin_use` returned;
        ``completed``: the GPU work queued meanwhile has finished; else it
        was queued on ``stream`` (0: the legacy default stream)."""
        with self._lock:
            _reclaim.end_use(self, handles, completed, stream)

    def _is_reclaimed(self, block):
        """Whether ``block`` is a live block of this pool in host memory."""
        return type(block) is Block and block in self._residency.reclaimed

    def is_resident(self, block):
        """Whether ``block`` is a live block of this pool with device memory
        (not reclaimed to host memory). Takes no lock."""
        return self.state_of(block) is ALLOCATED and not self._is_reclaimed(block)

    def unpin(self, block):
        """Undo one :meth:`pin`; ValueError if the block is not pinned."""
        with self._lock:
            if self._is_reclaimed(block):
                raise ValueError(f"unpin: {block!r} is not pinned (it is reclaimed: in "
                                 "host memory)")
            r = TABLE + self._allocated_row(block, "unpin") * NF + _PIN
            if not self._mv[r]:
                raise ValueError(f"unpin: {block!r} is not pinned")
            self._mv[r] -= 1

    def _allocated_row(self, block, action):
        """The row of ``block`` when it is itself (not a copy) an allocated
        block of this pool; else ValueError naming ``action``, or -1 when
        ``action`` is None."""
        row = self._live_row(block)
        if (row < 0 or self._handles[row] is not block
                or self._mv[TABLE + row * NF + _STATE] != _core.ALLOCATED):
            if action is None:
                return -1
            raise ValueError(f"{action}: {block!r} is not a live block of this pool")
        return row

    # -- reading -----------------------------------------------------------
    def _refresh(self):
        """Take the finalizers' frees and retire the frees whose GPU work has
        completed (never blocks), so that what is read next is up to date."""
        self._free_deferred()
        self._pending.close_batch()
        self._pending.poll()
        _reclaim.release_host_buffers(self)

    def memory_stats(self):
        """The counters, keyed as torch.cuda.memory_stats (see docs/stats.md).
        Frees whose GPU work has completed are retired first."""
        with self._lock:
            self._refresh()
            return self._stats_dict()

    def _stats_dict(self, heaps=None):
        """memory_stats() as the counters are (nothing retired first);
        ``heaps`` as for :meth:`_device_heap_stats`."""
        stats = self.stats.as_dict(self._settings.max_split_size)
        stats.update(self._device_heap_stats(heaps))
        return stats

    def _device_heap_stats(self, heaps=None):
        """The device_heap.* keys: the open heaps' counters, summed (each as
        read without waiting for kernels still running, see DeviceHeap.stats).
        ``heaps``: each open heap's stats() as already read (a snapshot's),
        else they are read now."""
        if heaps is None:
            heaps = [{**heap.counters()[0], "reserved_bytes": heap.reserved_bytes}
                     for heap in list(self.device_heaps)]
        totals = dict.fromkeys((c.name for c in DEVICE_HEAP_COUNTERS), 0)
        for heap in heaps:
            for name in totals:
                totals[name] += 1 if name == "count" else heap[name]
        return {f"{DEVICE_HEAP}.{name}": value for name, value in totals.items()}

    def snapshot(self):
        """Segments and blocks, with the stats, taken atomically. The
        segments follow torch.cuda.memory_snapshot(): each a dict with
        address, total_size, allocated_size, active_size, requested_size,
        segment_type ('small'/'large'), and blocks, each with address, size,
        requested_size, state ('active_allocated', 'active_pending_free' or
        'inactive') and pinned. ``device_heaps``: per open DeviceHeap, the
        address of its (pinned) block and its :meth:`DeviceHeap.stats`, whose
        ``classes`` give its occupancy per size class. ``reclaimed``: the
        blocks reclaim keeps in host memory (where they were, their sizes);
        ``in_use``: the blocks inside :meth:`use` (size, resident)."""
        with self._lock:
            self._refresh()
            heaps = [{"address": heap.address, **heap.stats()}    # each read once
                     for heap in sorted(self.device_heaps, key=lambda heap: heap.address)]
            return {"segments": self._segment_records(), "stats": self._stats_dict(heaps),
                    "device_heaps": heaps,
                    "reclaimed": self._reclaimed_records(),
                    "in_use": [{"size": block.allocated_size, "resident": self.is_resident(block)}
                               for block in self._residency.active]}

    def inactive_bytes(self):
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

    # The reading primitives: numba_alloc.compat builds PyTorch's, TensorFlow's
    # and TF-LMS's names on these. Each takes the lock (hold pool.lock across
    # several to read them at one instant) and first does the frees that
    # finalizers handed to free_later.
    def current(self, family, retire_completed=False):
        """The current value of counter ``family``, over both pools: bytes
        for the ``*_bytes`` families, a number of blocks or segments for the
        others. ``family``: the name of one of
        :data:`numba_alloc.counters.FAMILIES`; ValueError for another. ``retire_completed``: first retire the frees whose GPU
        work has completed (never blocks), as memory_stats() does; only the
        active, requested and inactive_split families change by it."""
        _check_family(family)
        with self._lock:
            if retire_completed:
                self._refresh()
            else:
                self._free_deferred()
            return self.stats.current(family)

    def peak(self, family):
        """The peak of :meth:`current` ``(family)`` since the last
        :meth:`reset_peaks`."""
        _check_family(family)
        with self._lock:               # settling a peak writes it
            self._free_deferred()
            return self.stats.peak(family)

    def accumulated(self, family):
        """(increase, decrease) of counter ``family`` over both pools since
        the last :meth:`reset_accumulated`: memory_stats()'s ``allocated``
        and ``freed`` (``accumulated("allocation")[0]``: the requests served)."""
        _check_family(family)
        with self._lock:
            self._free_deferred()
            return self.stats.accumulated(family)

    def count(self, name):
        """An event counter: a name of :data:`numba_alloc.counters.EVENTS`
        (``num_*`` times, ``bytes_released`` and ``bytes_defragged`` in
        bytes), or ``"largest_alloc_size"`` (the largest block handed out,
        in bytes after rounding); ValueError for another name."""
        if name not in _COUNTS:
            raise ValueError(f"count: unknown counter {name!r}; one of {', '.join(_COUNTS)}")
        with self._lock:
            self._free_deferred()
            return getattr(self.stats, name)

    def reset_peaks(self):
        """Set every peak to its current value."""
        with self._lock:
            self._free_deferred()
            self.stats.reset_peak()

    def reset_accumulated(self):
        """Zero every increase and decrease (:meth:`accumulated`) and the
        ``num_*`` and ``bytes_*`` event counters (not largest_alloc_size)."""
        with self._lock:
            self._free_deferred()
            self.stats.reset_accumulated()

    def limit_bytes(self):
        """Most bytes the pool may reserve: its limit setting resolved
        against the device's total memory, or that total, whichever is
        smaller (asks the backend)."""
        total = self.backend.memory_info()[1]
        with self._lock:
            return min(self._settings.resolve_limit(total), total)

    def __repr__(self):
        with self._lock:
            return (f"Pool({self.backend!r}, reserved {_fmt(self.current('reserved_bytes'))}, "
                    f"allocated {_fmt(self.current('allocated_bytes'))})")

    def _repr_html_(self):
        """Jupyter's view: a table of the pool's state beside its segment map."""
        return pool_html(self)

