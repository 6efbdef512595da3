"""The allocation policy: a caching pool over a :class:`~numba_alloc.backend.Backend`.

Plain Python, no CUDA import. The rules, after PyTorch's caching allocator:

* requests are rounded up to 512 B; requests up to 1 MiB go to the small
  pool, carved from 2 MiB segments; larger ones to the large pool, carved from
  20 MiB segments below 10 MiB and from segments of their own size rounded up
  to 2 MiB above;
* the smallest free block that fits is taken (best fit) and split when the
  rest is worth keeping (512 B in the small pool, more than 1 MiB in the
  large pool); blocks of max_split_size or more are never split, and serve
  only requests of max_split_size or more that they exceed by under 20 MiB;
* a freed block is reusable only once the GPU work queued before its free
  has finished: frees are batched, one event covers each batch, and a block
  rejoins the free index (coalescing with free neighbours) when its event
  completes;
* when no free block fits: reuse completed frees, grow by a segment (within
  the limit), synchronize the device if frees are still pending, return
  fully free cached segments to the device and grow again, with defrag on
  move live blocks to open a hole (planned by :mod:`numba_alloc.compaction`,
  copied by the backend's kernel), then raise
  :class:`~numba_alloc.errors.OutOfMemoryError`.

With growth off the pool reserves one arena (its limit, or all free device
memory) at first use and carves every request from it.

Thread safety: every public method takes the pool's re-entrant lock, so a
free that a garbage-collector finalizer triggers inside malloc is safe.
"""

import contextlib
import threading
from bisect import bisect_right
from collections import deque
from typing import NamedTuple

import numpy as np

from .backend import DeviceOutOfMemory
from .block import ALLOCATED, DEAD, FREE, LARGE, PENDING, SMALL, Block, Segment
from .compaction import LiveBlock, SegmentMap, plan_compaction, plan_hole
from .config import ARENA_UNIT, MiB, Settings, parse_settings
from .display import pool_html
from .errors import (
    DefragmentationError,
    DefragmentationRefused,
    OutOfMemoryError,
    OutOfMemoryReport,
)
from .free_index import FreeIndex
from .observers import PoolObserver
from .stats import EVENTS, FAMILIES, PoolStats
from .summary import format_bytes as _fmt
from .validate import as_int

ROUND = 512                 # every block is a multiple of this
SMALL_SIZE = 1 * MiB        # largest request of the small pool
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB    # segment for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB       # larger requests get a segment of their own, rounded to this
_NO_LIMIT = 1 << 64
_FAMILIES = (*FAMILIES, "oversize_allocations", "oversize_segments")
_COUNTS = (*EVENTS, "largest_alloc_size")


class PreparedSettings(NamedTuple):
    """Settings checked by :meth:`Pool.check_settings`, for :meth:`Pool.commit`:
    the settings and the limit in bytes they resolve to (None before the
    pool's first use)."""
    settings: Settings
    limit: int | None


class Defragmentation(NamedTuple):
    """What one defragmentation did: bytes and blocks moved, bytes of emptied
    segments returned to the device, and whether a hole of the size asked
    for now exists (always True for a full compaction)."""
    bytes_moved: int
    blocks_moved: int
    bytes_released: int
    hole: bool


def segment_size(size):
    """Bytes of the segment the pool reserves for a ``size``-byte block."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _check_family(family):
    if family not in _FAMILIES:
        raise ValueError(f"unknown counter family {family!r}; one of {', '.join(_FAMILIES)}")


def _request_size(nbytes):
    """Validate a request; return it as an int."""
    if type(nbytes) is not int:
        nbytes = as_int(nbytes, "nbytes", "an integer number of bytes")
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    return nbytes


class Pool:
    """A caching pool of device memory on one backend.

    ``Pool(backend, **settings)``: the settings are those of
    :class:`~numba_alloc.config.Settings`. Sizes are in bytes.
    """

    def __init__(self, backend, **settings):
        self.backend = backend
        self._lock = threading.RLock()
        self._settings = Settings()
        self._initialized = False
        self.stats = PoolStats()
        self._index = (FreeIndex(), FreeIndex())   # by kind: SMALL, LARGE
        self._segments = {}          # address -> Segment
        self._open = []              # freed blocks not yet covered by an event
        self._deferred = deque()     # blocks finalizers handed to free_later()
        self._batches = deque()      # (event, [blocks]) in record order
        self._spare_events = []
        self._hold = 0               # > 0: freed blocks are not made reusable
        self._observers = ()
        self.relocator = None        # the Numba glue's Relocator, if any
        self._refusal = None         # why the last defragmentation was refused
        self._limit = _NO_LIMIT
        self.commit(self.check_settings(parse_settings(settings)))

    # -- settings ----------------------------------------------------------
    def commit(self, prepared):
        """Put settings from :meth:`check_settings` in force (under the lock
        held since then). Cannot fail: everything that could was done there."""
        self._settings = settings = prepared.settings
        self._max_split = settings.max_split_size or _NO_LIMIT
        self._arena = not settings.growth
        if self._initialized:
            self._limit = prepared.limit

    def settings(self):
        """The :class:`~numba_alloc.config.Settings` in force."""
        return self._settings

    def configure(self, **changes):
        """Change settings. Raises ValueError for an unknown key or bad value
        and RuntimeError for one that can no longer apply (growth or
        max_split_size_mb once the pool has reserved memory, a limit with
        growth off once the arena is reserved, or a limit below the bytes
        already reserved); on error nothing is changed."""
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
            if not self._initialized:
                return PreparedSettings(new, None)
            for key in ("growth", "max_split_size_mb"):
                if getattr(new, key) != getattr(old, key):
                    raise RuntimeError(
                        f"{key} cannot be changed once the pool is initialized "
                        "(it has reserved device memory)")
            limit = self._limit
            if new.limit != old.limit:
                if self._arena:
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
        if self._arena:
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
        be met; on any error the pool is as before."""
        if type(nbytes) is not int or nbytes < 0:
            nbytes = _request_size(nbytes)
        size = ((nbytes + ROUND - 1) // ROUND * ROUND) or ROUND
        with self._lock:
            if self._deferred:
                self._free_deferred()
            if not self._initialized:
                self._initialize()
            kind = LARGE if self._arena or size > SMALL_SIZE else SMALL
            block = self._take(size, kind, nbytes)
            if block is None:
                block = self._malloc_slow(nbytes, size, kind)
            if self._observers:
                for observer in self._observers:
                    observer.on_malloc(self, block)
            return block

    def _take(self, size, kind, nbytes):
        """Carve a block from the best-fitting free block, or return None."""
        index = self._index[kind]
        max_split = self._max_split       # inlined _max_run(size): the hot path
        found = index.best_fit(size, max_split if size < max_split else size + LARGE_SEGMENT)
        if not found:
            return None
        free = index.pop(found)
        stats = self.stats
        if free.prev is not None or free.next is not None:
            stats.split_free_removed(kind, found)
        return self._carve(free, size, kind, nbytes)

    def _carve(self, free, size, kind, nbytes):
        """Hand out the first ``size`` bytes of the free block ``free`` (not
        in the index) as a new block; the rest stays free if worth keeping."""
        rest = free.allocated_size - size
        if kind == SMALL or self._arena:
            split = rest >= ROUND
        else:
            split = rest > SMALL_SIZE and free.allocated_size < self._max_split
        block = Block(free.address, size if split else free.allocated_size,
                      free.segment, self, ALLOCATED)
        block.size = nbytes
        prev = free.prev
        block.prev = prev
        if prev is None:
            free.segment.first = block
        else:
            prev.next = block
        if split:
            free.address += size
            free.allocated_size = rest
            free.prev = block
            block.next = free
            self._index_add(free)
        else:
            nxt = free.next
            block.next = nxt
            if nxt is not None:
                nxt.prev = block
            free.state = DEAD
            free.prev = free.next = None     # a dead block holds no other
        stats = self.stats
        allocated = block.allocated_size
        stats.malloc(kind, allocated, nbytes)
        if allocated >= self._max_split:
            stats.oversize_allocations.up(LARGE, 1)
        return block

    def _malloc_slow(self, nbytes, size, kind):
        if self._open or self._batches:
            self._close_batch()
            self._poll()
            block = self._take(size, kind, nbytes)
            if block is not None:
                return block
        block = self._grow(size, kind, nbytes)
        if block is not None:
            return block
        if self._batches:
            self._synchronize()
            block = self._take(size, kind, nbytes) or self._grow(size, kind, nbytes)
            if block is not None:
                return block
        block = self._reclaim_and_grow(size, kind, nbytes)
        if block is not None:
            return block
        if self._settings.defrag and self._index[SMALL].nbytes + self._index[LARGE].nbytes:
            block = self._defragment_for(size, kind, nbytes)
            if block is not None:
                return block
        # may raise: then nothing is counted
        error = OutOfMemoryError.from_report(self._out_of_memory_report(nbytes, size))
        self.stats.num_ooms += 1
        for observer in self._observers:
            observer.on_out_of_memory(self, nbytes)
        raise error

    def _grow(self, size, kind, nbytes):
        """Reserve a new segment for a ``size``-byte block and carve it;
        None when growth is off, the limit forbids it or the device is full."""
        if self._arena:
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
            free = self._add_segment(nbytes_segment, kind, oversize)
            if free is not None:
                self._index_remove(free)
                return self._carve(free, size, kind, nbytes)
        return None

    def _add_segment(self, nbytes, kind, oversize):
        """Reserve a segment from the backend and index its one free block;
        None when the device is out of memory."""
        try:
            address = self.backend.allocate(nbytes)
        except DeviceOutOfMemory:
            return None
        segment = Segment(address, nbytes, kind, oversize)
        free = Block(address, nbytes, segment, self, FREE)
        segment.first = free
        self._segments[address] = segment
        stats = self.stats
        stats.num_device_alloc += 1
        stats.segment.up(kind, 1)
        stats.reserved_bytes.up(kind, nbytes)
        if oversize:
            stats.oversize_segments.up(LARGE, 1)
        self._index_add(free)
        for observer in self._observers:
            observer.on_segment_alloc(self, segment)
        return free

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
        free = segment.first
        self._index_remove(free)
        free.state = DEAD
        del self._segments[segment.address]
        stats = self.stats
        stats.num_device_free += 1
        stats.segment.down(segment.kind, 1)
        stats.reserved_bytes.down(segment.kind, segment.size)
        if segment.oversize:
            stats.oversize_segments.down(LARGE, 1)
        stats.bytes_reclaimed += segment.size
        for observer in self._observers:
            observer.on_segment_free(self, segment)
        segment.first = free.segment = None     # no cycle left behind

    def _free_segments(self):
        return [s for s in self._segments.values() if s.is_free]

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
                self.stats.num_single_reclaims += 1

    def _reclaim_and_grow(self, size, kind, nbytes):
        """Return cached free segments to the device, then grow: first the
        smallest single segment whose release makes room, else all of them.
        Does nothing when returning every one could not make room."""
        if self._arena:
            return None
        segments = sorted(self._free_segments(), key=lambda s: s.size)
        if not segments:
            return None
        device_free = self.backend.memory_info()[0]
        if not self._room_after_release(size, sum(s.size for s in segments), device_free):
            return None
        self.stats.num_alloc_retries += 1
        single = next((s for s in segments
                       if self._room_after_release(size, s.size, device_free)), None)
        if single is not None:
            self._release_segment(single)
            self.stats.num_single_reclaims += 1
            block = self._grow(size, kind, nbytes)
            if block is not None:
                return block
        self._release_all_free()
        return self._grow(size, kind, nbytes)

    def _release_all_free(self):
        released = False
        try:
            for segment in self._free_segments():
                self._release_segment(segment)
                released = True
        finally:
            if released:
                self.stats.num_full_reclaims += 1

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
            largest_free=max(index.largest() for index in self._index),
            limit=min(self._limit, total), growth=not self._arena,
            initialized=self._initialized, defrag=settings.defrag, small=size <= SMALL_SIZE,
            refusal=self._refusal, segments=self._segment_records(),
            stats=stats.as_dict(settings.max_split_size))

    # -- defragmentation ----------------------------------------------------
    def defragment(self, nbytes=None):
        """Move live blocks together. With ``nbytes``: open a free range of at
        least that many bytes (in the pool a request of that size uses),
        moving the fewest live bytes; ``hole`` is True exactly when
        ``malloc(nbytes)`` would then succeed without reserving memory.
        Without: compact every segment and return the segments that become
        empty to the device. Synchronizes the device first. Returns a
        :class:`Defragmentation`. Raises TypeError or ValueError for a bad
        ``nbytes``, DefragmentationRefused when moving is not safe (nothing
        moves) and DefragmentationError when a copy fails (the pool stays
        consistent)."""
        if nbytes is not None:
            nbytes = _request_size(nbytes)
        with self._lock:
            self._free_deferred()
            if not self._initialized:
                return Defragmentation(0, 0, 0, nbytes is None)
            if nbytes is None:
                self._quiesce_for_moves()
                return self._compact(*self._plan_compaction())
            size = ((nbytes + ROUND - 1) // ROUND * ROUND) or ROUND
            kind = LARGE if self._arena or size > SMALL_SIZE else SMALL
            if self._fits(size, kind):
                return Defragmentation(0, 0, 0, True)
            self._quiesce_for_moves()
            moves = plan_hole(self._segment_maps(kind), size, self._max_run(size),
                              self._max_split)
            if not moves:
                return Defragmentation(0, 0, 0, self._fits(size, kind))
            moved = self._execute([moves])
            return Defragmentation(moved, len(moves), 0, self._fits(size, kind))

    def _fits(self, size, kind):
        """Whether :meth:`_take` would find a free block for ``size`` bytes."""
        return bool(self._index[kind].best_fit(size, self._max_run(size)))

    def _max_run(self, size):
        """Free blocks of this many bytes or more do not serve ``size`` bytes."""
        return self._max_split if size < self._max_split else size + LARGE_SEGMENT

    def _defragment_for(self, size, kind, nbytes):
        """The malloc path, once nothing else has made room: when the kind's
        free bytes would hold the request, open a hole in a segment; when no
        hole can be opened, compact, return the emptied segments to the
        device and grow into that memory, if the plan shows that growing
        then fits the limit and the device. The carved block, or None when
        moving cannot help: then nothing has moved and the device was not
        synchronized."""
        if self._plan_for(size, kind) is None:      # on the state as it is
            return None
        try:
            self._quiesce_for_moves()
        except DefragmentationRefused as refusal:
            self._refusal = str(refusal)
            return None
        plan = self._plan_for(size, kind)           # frees retired, pins taken
        if plan is None:
            return None
        hole, compaction = plan
        if hole:
            self._execute([hole])
            return self._take(size, kind, nbytes)
        self._compact(*compaction)
        return self._take(size, kind, nbytes) or self._grow(size, kind, nbytes)

    def _plan_for(self, size, kind):
        """(hole moves, None) or (None, (phases, emptied)) that would make
        room for a ``size``-byte block of ``kind``, or None."""
        index = self._index
        if index[kind].nbytes >= size and any(
                seg.size >= size for seg in self._segments.values() if seg.kind == kind):
            moves = plan_hole(self._segment_maps(kind), size, self._max_run(size),
                              self._max_split)
            if moves:
                return moves, None
        if self._arena:
            return None
        device_free = self.backend.memory_info()[0]
        if not self._room_after_release(size, index[SMALL].nbytes + index[LARGE].nbytes,
                                        device_free):
            return None
        phases, emptied = self._plan_compaction()
        released = sum(self._segments[address].size for address in emptied)
        if released and self._room_after_release(size, released, device_free):
            return None, (phases, emptied)
        return None

    def _plan_compaction(self):
        """(phases, emptied segment addresses) compacting both kinds."""
        phases, emptied = [], []
        for kind in (SMALL, LARGE):
            kind_phases, kind_emptied = plan_compaction(self._segment_maps(kind),
                                                        max_free=self._max_split)
            phases += kind_phases
            emptied += kind_emptied
        return phases, emptied

    def _compact(self, phases, emptied):
        """Run a compaction plan and return the emptied segments."""
        bytes_moved = self._execute(phases)
        released = 0
        for address in emptied:
            segment = self._segments[address]
            self._release_segment(segment)
            released += segment.size
        return Defragmentation(bytes_moved, sum(map(len, phases)), released, True)

    def _quiesce_for_moves(self):
        """Make the device idle and every completed free reusable, then let
        the relocator pin what must stay (it may refuse)."""
        self._refusal = None
        self._synchronize()
        if self.relocator is not None:
            self.relocator.pin_unmovable(self)

    def _segment_maps(self, kind):
        """The planner's view of one kind's segments: blocks that are not
        free are live; pinned and still-pending ones must stay."""
        return [SegmentMap(seg.address, seg.size, tuple(
                    LiveBlock(b.address, b.allocated_size, bool(b.pinned) or b.state is PENDING)
                    for b in seg.blocks() if b.state is not FREE))
                for seg in self._segments.values() if seg.kind == kind]

    def _execute(self, phases):
        """Run the phases' copies and move the blocks' records after each
        phase has completed; returns the bytes moved. The move counters
        count a phase once it has completed, from the device's counters."""
        bases = sorted(self._segments)
        live = {b.address: b for seg in self._segments.values() for b in seg.blocks()
                if b.state is not FREE}

        def segment_of(address):
            return self._segments[bases[bisect_right(bases, address) - 1]]

        moved_bytes, first = 0, 1
        for number, phase in enumerate(phases, 1):
            if not phase:
                continue
            groups = {}
            for move in phase:
                key = (segment_of(move.dst), segment_of(move.src))
                groups.setdefault(key, []).append(
                    (move.src - key[1].address, move.dst - key[0].address, move.size))
            batches = [((dst.address, dst.size), (src.address, src.size),
                        np.array(rows, dtype=np.int64).reshape(-1, 3))
                       for (dst, src), rows in groups.items()]
            before = self.backend.move_counters()
            try:
                self.backend.copy(batches, first)
            except Exception as e:
                raise DefragmentationError(
                    f"the copy kernel failed in phase {number} of {len(phases)} ({e}); "
                    f"the {len(phase)} blocks of that phase keep their old addresses "
                    "and data, and the pool is consistent") from e
            after = self.backend.move_counters()
            stats = self.stats
            stats.num_defragmentations += after[0] - before[0]
            stats.bytes_defragged += after[1] - before[1]
            first = 0
            moved_bytes += sum(m.size for m in phase)
            self._move_records(phase, live, segment_of)
        return moved_bytes

    def _move_records(self, phase, live, segment_of):
        """Point the phase's blocks at their new addresses and rebuild the
        free blocks of the segments involved."""
        blocks = [live.pop(move.src) for move in phase]
        chains = {}
        for block, move in zip(blocks, phase):
            chains.setdefault(block.segment, None)
            chains.setdefault(segment_of(move.dst), None)
        for segment in chains:              # the old chains, before any relinking
            chains[segment] = list(segment.blocks())
        for block, move in zip(blocks, phase):
            block.address = move.dst
            block.segment = segment_of(move.dst)
            live[move.dst] = block
        relinks = []
        for segment, chain in chains.items():
            staying = [b for b in chain if b.state is not FREE and b.segment is segment]
            kept = set(map(id, staying))
            arriving = [b for b in blocks if b.segment is segment and id(b) not in kept]
            relinks.append((segment, staying + arriving))
        for chain in chains.values():      # every count goes down before any goes up,
            self._drop_free_blocks(chain)  # so no peak sees a state between two segments
        for segment, live in relinks:
            self._relink(segment, live)
        moves = [(block, move.src) for block, move in zip(blocks, phase)]
        for observer in self._observers:
            for block, old in moves:
                observer.on_move(self, block, old)
        if self.relocator is not None:
            self.relocator.relocated(self, moves)

    def _drop_free_blocks(self, chain):
        """Take a segment's free blocks (``chain``, as linked before the
        phase) out of the index and counters; they die."""
        for block in chain:
            if block.state is FREE:
                self._index_remove(block)
                block.state = DEAD
                block.prev = block.next = None

    def _relink(self, segment, blocks):
        """Relink a segment from its non-free ``blocks``, with new free
        blocks in the gaps, keeping the free index and counters exact."""
        chain, cursor = [], segment.address
        for block in sorted(blocks, key=lambda b: b.address):
            if block.address > cursor:
                chain.append(Block(cursor, block.address - cursor, segment, self, FREE))
            chain.append(block)
            cursor = block.address + block.allocated_size
        if cursor < segment.address + segment.size:
            chain.append(Block(cursor, segment.address + segment.size - cursor, segment, self, FREE))
        for prev, block in zip([None] + chain, chain):
            block.prev = prev
            if prev is not None:
                prev.next = block
        chain[-1].next = None
        segment.first = chain[0]
        for block in chain:
            if block.state is FREE:
                self._index_add(block)

    # -- freeing -----------------------------------------------------------
    def free(self, block):
        """Return a block from :meth:`malloc`. It becomes reusable once the
        GPU work queued before this call has finished. Raises ValueError for a
        block that is not live in this pool (double free, foreign block)."""
        with self._lock:
            self._check_live(block, "free")
            block.state = PENDING
            self._open.append(block)
            stats = self.stats
            kind = block.segment.kind
            allocated = block.allocated_size
            stats.free(kind, allocated)
            if allocated >= self._max_split:
                stats.oversize_allocations.down(LARGE, 1)
            if self._observers:
                for observer in self._observers:
                    observer.on_free(self, block)

    def free_later(self, block):
        """Free ``block`` at the start of the pool's next operation (any
        malloc, synchronize, defragmentation, reset or stats read). For
        garbage-collector finalizers: they may run in the middle of a pool
        operation on this thread, or while this thread holds a lock another
        thread waits on inside the pool. Takes no lock and never raises; a
        block that is no longer live by then is skipped."""
        self._deferred.append(block)

    def _free_deferred(self):
        deferred = self._deferred
        while deferred:
            block = deferred.popleft()
            if block.state is ALLOCATED and block.pool is self:
                self.free(block)

    def _close_batch(self):
        """Cover the open frees with one event (when recording it raises,
        the frees stay open and the event is kept for the next try)."""
        if not self._open:
            return
        event = self._spare_events.pop() if self._spare_events else self.backend.event()
        try:
            event.record()
        except BaseException:
            self._spare_events.append(event)
            raise
        self._batches.append((event, self._open))
        self._open = []

    def _poll(self):
        """Retire every batch whose event has completed. Events complete in
        record order, so when the newest is done all are."""
        batches = self._batches
        if self._hold:
            return
        if batches and batches[-1][0].query():
            while batches:
                self._retire_batch()
            return
        while batches and batches[0][0].query():
            self._retire_batch()

    def _synchronize(self):
        """Wait for the device, then retire every pending free."""
        self._close_batch()
        self.backend.synchronize()
        self.stats.num_sync_all_streams += 1
        while self._batches and not self._hold:
            self._retire_batch()

    def _retire_batch(self):
        """Retire the oldest batch, keeping its event for reuse."""
        event, blocks = self._batches.popleft()
        self._spare_events.append(event)
        self._retire(blocks)

    def _retire(self, blocks):
        """Make freed blocks reusable: each handle dies and its bytes join a
        free neighbour, or a new free block."""
        stats = self.stats
        for block in blocks:
            kind = block.segment.kind
            allocated = block.allocated_size
            stats.retire(kind, allocated, block.size)
            block.state = DEAD
            prev, nxt = block.prev, block.next
            block.prev = block.next = None     # a dead handle holds no other block
            if prev is not None and prev.state is FREE:
                self._index_remove(prev)
                prev.allocated_size += allocated
                free = prev
                if nxt is not None and nxt.state is FREE:
                    self._index_remove(nxt)
                    free.allocated_size += nxt.allocated_size
                    nxt.state = DEAD
                    dead, nxt = nxt, nxt.next
                    dead.prev = dead.next = None
                free.next = nxt
                if nxt is not None:
                    nxt.prev = free
            else:
                if nxt is not None and nxt.state is FREE:
                    self._index_remove(nxt)
                    free = nxt
                    free.address = block.address
                    free.allocated_size += allocated
                else:
                    free = Block(block.address, allocated, block.segment, self, FREE)
                    free.next = nxt
                    if nxt is not None:
                        nxt.prev = free
                free.prev = prev
                if prev is None:
                    block.segment.first = free
                else:
                    prev.next = free
            self._index_add(free)

    def _index_add(self, block):
        kind = block.segment.kind
        self._index[kind].add(block)
        if block.prev is not None or block.next is not None:
            self.stats.split_free_added(kind, block.allocated_size)

    def _index_remove(self, block):
        kind = block.segment.kind
        self._index[kind].remove(block)
        if block.prev is not None or block.next is not None:
            self.stats.split_free_removed(kind, block.allocated_size)

    # -- whole-pool operations ----------------------------------------------
    def synchronize(self):
        """Wait for pending frees to become reusable (synchronizes the device
        only when some have not completed)."""
        with self._lock:
            self._free_deferred()
            self._close_batch()
            self._poll()
            if self._batches:
                self._synchronize()

    def empty_cache(self):
        """Return every fully free segment to the device, after waiting for
        pending frees. With growth off the preallocated arena is kept."""
        with self._lock:
            self.synchronize()
            if not self._arena:
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
            if self._segments:
                self.backend.synchronize()
            for segment in list(self._segments.values()):
                for block in list(segment.blocks()):
                    if block.state is ALLOCATED:
                        self.free(block)
            pending, self._open = self._open, []
            for _, blocks in self._batches:
                pending += blocks
            self._batches.clear()          # the events belong to the context being reset
            self._retire(pending)
            for segment in list(self._segments.values()):
                self._release_segment(segment)
            self._spare_events.clear()
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
        """Detach an observer; ValueError if it is not attached."""
        with self._lock:
            observers = list(self._observers)
            observers.remove(observer)
            self._observers = tuple(observers)

    @contextlib.contextmanager
    def hold_frees(self):
        """While active (nestable, for all threads), freed blocks stay
        pending and are not handed out again (Numba's defer_cleanup)."""
        with self._lock:
            self._hold += 1
        try:
            yield
        finally:
            with self._lock:
                self._hold -= 1

    def pin(self, block):
        """Keep a live block where it is until as many :meth:`unpin` calls
        (IPC export, an address that left Numba). Raises ValueError for a
        block that is not live in this pool."""
        with self._lock:
            self._check_live(block, "pin")
            block.pinned += 1

    def unpin(self, block):
        """Undo one :meth:`pin`; ValueError if the block is not pinned."""
        with self._lock:
            self._check_live(block, "unpin")
            if not block.pinned:
                raise ValueError(f"unpin: {block!r} is not pinned")
            block.pinned -= 1

    def _check_live(self, block, action):
        """ValueError unless ``block`` is itself (not a copy) a live handle of
        this pool."""
        if (type(block) is not Block or block.pool is not self or block.state is not ALLOCATED
                or (block.segment.first if block.prev is None else block.prev.next) is not block):
            raise ValueError(f"{action}: {block!r} is not a live block of this pool")

    # -- reading -----------------------------------------------------------
    def _refresh(self):
        """Take the finalizers' frees and retire the frees whose GPU work has
        completed (never blocks), so that what is read next is up to date."""
        self._free_deferred()
        self._close_batch()
        self._poll()

    def memory_stats(self):
        """The counters, keyed as torch.cuda.memory_stats (see docs/stats.md).
        Frees whose GPU work has completed are retired first."""
        with self._lock:
            self._refresh()
            return self.stats.as_dict(self._settings.max_split_size)

    def snapshot(self):
        """Segments and blocks, with the stats, taken atomically. The
        segments follow torch.cuda.memory_snapshot(): each a dict with
        address, total_size, allocated_size, active_size, requested_size,
        segment_type ('small'/'large'), and blocks, each with address, size,
        requested_size, state ('active_allocated', 'active_pending_free' or
        'inactive') and pinned."""
        with self._lock:
            self._refresh()
            return {"segments": self._segment_records(), "stats": self.memory_stats()}

    def _segment_records(self):
        """The snapshot's segments, as they are (nothing retired first)."""
        states = {ALLOCATED: "active_allocated", PENDING: "active_pending_free",
                  FREE: "inactive"}
        segments = []
        for segment in sorted(self._segments.values(), key=lambda s: s.address):
            blocks = [{"address": b.address, "size": b.allocated_size,
                       "requested_size": b.size, "state": states[b.state],
                       "pinned": bool(b.pinned)} for b in segment.blocks()]
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

    # The reading primitives: numba_alloc.compat builds PyTorch's, TensorFlow's
    # and TF-LMS's names on these. Each takes the lock (hold pool.lock across
    # several to read them at one instant) and first does the frees that
    # finalizers handed to free_later.
    def current(self, family, retire_completed=False):
        """The current value of counter ``family``, over both pools: bytes
        for the ``*_bytes`` families, a number of blocks or segments for the
        others. ``family``: a name of :data:`numba_alloc.stats.FAMILIES`,
        ``"oversize_allocations"`` or ``"oversize_segments"``; ValueError
        for another. ``retire_completed``: first retire the frees whose GPU
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
            counter = getattr(self.stats, family)
            return sum(counter.inc), sum(counter.dec)

    def count(self, name):
        """An event counter: a name of :data:`numba_alloc.stats.EVENTS`
        (``num_*`` times, ``bytes_reclaimed`` and ``bytes_defragged`` in
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

