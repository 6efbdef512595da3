"""The allocation policy: a caching pool over a :class:`~numba_alloc.policy.backend.Backend`.

No CUDA import. The block table, the free index and the counters are the
compiled core's (:mod:`~numba_alloc.policy.core`); the pending frees are
:mod:`~numba_alloc.policy.pending`'s, the defragmentation
:mod:`~numba_alloc.policy.defrag`'s and :mod:`~numba_alloc.policy.room`'s,
reclaim :mod:`~numba_alloc.policy.reclaim`'s.
:class:`Pool` is this module's request path (malloc, from the free index to
growth, reclaim, defragmentation and out of memory) and the parts it is made
of, one a module: :mod:`~numba_alloc.policy.pool_settings`,
:mod:`~numba_alloc.policy.segments` (growth and release),
:mod:`~numba_alloc.policy.expandable` (segments of mapped pages),
:mod:`~numba_alloc.policy.frees` (frees and their batches),
:mod:`~numba_alloc.policy.uses` (pins, uses, reclaim's coordination),
:mod:`~numba_alloc.policy.staging` (blocks staging a library's own work),
:mod:`~numba_alloc.policy.reading` (stats and snapshots) and
:mod:`~numba_alloc.policy.observers` (attaching observers). The rules
(:mod:`~numba_alloc.policy.sizes`), after PyTorch's caching allocator:

* requests are rounded up to 512 B; requests up to 1 MiB go to the small
  pool, carved from 2 MiB segments; larger ones to the large pool, carved from
  segments that hold a whole number of blocks of the request's size below 10
  MiB (sizes.segment_size; PyTorch: 20 MiB) and from segments of their own
  size rounded up to 2 MiB above;
* the smallest free block that fits is taken (best fit) and split when the
  rest is worth keeping (512 B in the small pool, more than 1 MiB in the
  large pool; 512 B there too once memory is scarce with defrag on, so that
  no block holds a rest a defragmentation could gather); blocks of
  max_split_size or more are never split, and serve only requests of
  max_split_size or more that they exceed by under 20 MiB; with
  separate_big_segments (by default while defrag is off), once memory is
  scarce, a request below 10 MiB passes over the free blocks of big
  segments (reserved for requests of 10 MiB or more) and grows by a segment
  of its own size until growing has failed;
* with expandable_segments (off by default; auto: where the device maps
  pages, the simulated device) the large pool's segments are runs of pages mapped
  under one reserved range (:mod:`~numba_alloc.policy.expandable`): growing
  maps the fewest pages that, with a free block beside them, hold the
  request, and the pool returns the whole pages inside free blocks, not
  only wholly free segments; keep_whole_segments and separate_big_segments
  then have no effect;
* a freed block is reusable only once the GPU work queued before its free
  has finished: frees are batched (at most 64 a batch), one event covers
  each batch, and a block rejoins the free index (coalescing with free
  neighbours) when its event completes; a large request that would split a
  free block while frees are open closes their batch first and reuses what
  has completed (reuse first, the core's H_REUSE_FIRST), once memory is
  scarce (segments.SCARCE_FROM of the limit reserved; so keep_whole_segments);
* when no free block fits: reuse completed frees, grow by a segment (within
  the limit), synchronize the device if frees are still pending, return
  fully free cached segments to the device and grow again, with defrag on
  move live blocks to open a hole, then raise
  :class:`numba_alloc.OutOfMemoryError` (policy.errors makes it).

With growth off the pool reserves one arena (its limit, or all free device
memory) at first use and carves every request from it.

Thread safety: every public method takes the pool's re-entrant lock.
Garbage-collector finalizers hand frees to :meth:`Pool.free_later`, which
never takes the lock: it queues them for the start of the next operation.
"""

import threading
import weakref
from collections import deque

from ..units import format_bytes as _fmt
from ..validate import request_size
from . import core as _core
from . import defrag as _defrag
from . import page_room as _page_room
from . import reclaim as _reclaim
from . import room as _room
from .backend import Backend
from .block import LARGE, SMALL, Block, keep_values
from .config import Settings, defaults_in_force, parse_settings
from .core import H_NBYTES, NF, TABLE
from .errors import ReclaimError, out_of_memory_error
from .expandable import ExpandableSegments
from .frees import Frees
from .host_cache import HostCache, HostOutOfMemoryError
from .live_pools import pool_made
from .managed import ManagedCounts
from .observers import Observed
from .owned_block import OwnedBlock
from .pending import PendingFrees
from .pool_settings import PoolSettings
from .reading import Reading
from .residency import Residency
from .segments import Segments
from .sizes import (CORE_LIMIT, LARGE_SEGMENT, MIN_LARGE_ALLOC, MOST_RESERVED, NO_LIMIT, ROUND,
                    SMALL_SIZE, segment_size)
from .staging import Staging
from .stats import PoolStats
from .uses import Uses

_ROW_MASK, _ROW_BITS, _GEN = _core.ROW_MASK, _core.ROW_BITS, _core.GEN
_NEXT, _SEG, _STATE = _core.NEXT, _core.SEG, _core.STATE
_new_block = Block.__new__
_take_block = _core.take_block
# presentation, which the layers above register (the policy imports none):
# "html", a function of a pool returning what Jupyter shows
RENDERERS = {}


class Core:
    """A pool's compiled core (numba_alloc.policy.core): its array ``a``, that
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


class Pool(PoolSettings, Segments, ExpandableSegments, Frees, Uses, Staging, Reading,
           Observed):
    """A caching pool of device memory on one backend.

    ``Pool(backend, **settings)``: ``backend`` a
    :class:`~numba_alloc.policy.backend.Backend` (such as a SimulatedDevice), the
    settings those of :class:`~numba_alloc.policy.config.Settings` (TypeError or
    ValueError otherwise); those not given are the defaults in force
    (NUMBA_ALLOC_CONF, numba_alloc.configure(): ValueError when
    NUMBA_ALLOC_CONF is invalid). Sizes are in bytes.
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
        self._segments_made = 0      # segments reserved so far: the next one's serial
        self._moves_barred = 0       # > 0: a request may not defragment (stage)
        self._deferred = deque()     # the blocks finalizers handed to free_later()
        self._staged = {}            # address -> the staged Block there (staging.py)
        self._pending = PendingFrees(backend, core, self.stats)
        self._observers = ()         # every attached observer (rare events)
        self._block_observers = ()   # those that watch blocks and segments (the hot paths)
        self.relocator = None        # the Numba glue's Relocator, if any
        self.device_heaps = weakref.WeakSet()   # the open DeviceHeaps carved from this pool
        self.nrt_heap = None         # the heap serving NRT (plugin.nrt_heap), once carved
        self._residency = Residency()   # reclaimed blocks, active ones (residency.py)
        self._refusal = None         # why the last defragmentation was refused
        self._limit = NO_LIMIT
        self._reuse_first = True     # reuse first once memory is scarce (False: PyTorch's)
        self._past_growth = False    # True while a request that growing failed is served
        self.host_cache = HostCache(backend)     # pinned host memory (host_cache.py)
        self.managed = ManagedCounts()          # managed memory, counted (managed.py)
        parsed = parse_settings(settings)
        self._put_in_force(self.check_settings({**defaults_in_force().__dict__, **parsed}))
        pool_made(self)

    # -- allocation --------------------------------------------------------
    def malloc(self, nbytes) -> Block:
        """A block of at least ``nbytes`` bytes (0 is allowed and gets a
        512-byte block). Raises TypeError or ValueError for a bad size and
        :class:`numba_alloc.OutOfMemoryError` when the request cannot
        be met; on any error the pool is as before, but for the steps taken
        to make room before a driver call failed or the request proved
        impossible: cached free segments returned to the device, blocks
        reclaimed to host memory (intact, back on their next use). Thread
        safe."""
        if type(nbytes) is not int or nbytes < 0:
            nbytes = request_size(nbytes)
        with self._lock:
            if self._deferred:
                self._free_deferred()
            if not self._initialized:
                self._initialize()
            # the fast path: the core carves and registers the handle, or
            # answers why it cannot (a negative ticket)
            block = _take_block(self, self._p, self._handles, nbytes) if nbytes < CORE_LIMIT else -1
            if type(block) is int:
                block = self._take(nbytes) if block == -2 else self._block_for(block, nbytes)
                if block is None:
                    size, kind = self._size_and_kind(nbytes)
                    block = self._malloc_slow(nbytes, size, kind)
            if self._block_observers:
                for observer in self._block_observers:
                    observer.on_malloc(self, block)
            return block

    def malloc_owned(self, nbytes) -> OwnedBlock:
        """As :meth:`malloc`, the block held by an :class:`OwnedBlock` that
        frees it when the owner is garbage (as Numba's arrays are freed);
        raises as malloc does."""
        return OwnedBlock(self, self.malloc(nbytes))

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

    def _untake(self, block, undo, mark):
        """Under the lock: give back ``block`` from :meth:`_malloc_undoable`
        (unpinned, never freed) as if never handed out, with what growing
        made for it since ``mark`` (:meth:`_growth_mark`): its memory free at
        once (work queued on it comes before later work on the legacy or a
        blocking stream), every counter, running total, largest_alloc_size
        and peak (unless settled meanwhile) as before. Several go back in
        reverse order. Tells no observer; raises what giving back raises."""
        segment, row = self.segment_of(block), block._ticket & _ROW_MASK
        keep_values(block, self._mv, row)
        self._handles[row] = None
        _core.untake(self._p, row, block._ticket >> _ROW_BITS, *undo)
        self._give_back_growth(segment, mark)

    def _size_and_kind(self, nbytes):
        """(bytes a request of ``nbytes`` gets, SMALL or LARGE pool)."""
        size = ((nbytes + ROUND - 1) // ROUND * ROUND) or ROUND
        return size, LARGE if self._growth_off or size > SMALL_SIZE else SMALL

    def _take(self, nbytes, large=False):
        """Carve a block for ``nbytes`` from the best-fitting free block (the
        core rounds and picks the pool kind as malloc does), or None.
        ``large``: a small request from the large pool's free blocks (the
        last resort before reclaim, defragmentation and out of memory, when
        the small pool can neither serve nor grow)."""
        if nbytes >= CORE_LIMIT:
            return None
        take = _core.take_large if large else _core.take
        while True:
            ticket = take(self._p, nbytes)
            if ticket != -2:
                break
            self._reserve(1)
        return self._block_for(ticket, nbytes, large)

    def _block_for(self, ticket, nbytes, large=False):
        """The block of a ticket from the core's take (or take_large, with
        ``large``) other than -2: on -3, after retiring completed frees and
        taking again; None on -1."""
        if ticket == -3:
            ticket = self._take_after_retiring(nbytes, large)
        return None if ticket < 0 else self._handle(ticket, nbytes)

    def _take_after_retiring(self, nbytes, large):
        """The core's -3: a large request would split a free block while
        freed blocks are open. Cover them with an event, retire the batches
        whose work has completed (they may fit better: a tighter fit, or a
        neighbour that now coalesces) and take again: the ticket, or -1.
        Best effort: when the event cannot be recorded, the frees stay open
        and the block found first serves."""
        self._retire_completed_frees()
        return _core.take_now(self._p, nbytes, large)

    def _handle(self, ticket, nbytes):
        """The handle of the block just carved with ``ticket`` (its address
        and allocated size read from the core)."""
        block = _new_block(Block)
        block._ticket = ticket
        block.pool = self
        block.size = nbytes
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
        if size > MOST_RESERVED:    # never met (the limit is below): kept from the core
            self._out_of_memory(nbytes, size)
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
        # growing failed: the retry, PyTorch's last one (release_cached_blocks,
        # then alloc_block(isRetry=true)). A request it serves counts as
        # there: one num_sync_all_streams, frees pending or not, and one
        # num_alloc_retries; one that fails counts only the wait it made
        # (pending.synchronize's), and num_ooms
        waited = pending.batched
        if waited:
            pending.synchronize()
        block = self._retry(nbytes, size, kind, waited)
        self.stats.num_alloc_retries += 1
        self.stats.num_sync_all_streams += not waited
        return block

    def _retry(self, nbytes, size, kind, waited):
        """The request path once growing has failed and the pending frees
        have been retired (``waited``: some were): take or grow, return
        cached segments and grow, then what lies beyond growth."""
        block = None
        if waited:
            block = self._take(nbytes) or self._grow(size, kind, nbytes)
        if block is None:
            block = self._reclaim_and_grow(size, kind, nbytes)
        if block is None and kind == SMALL:
            block = self._take(nbytes, large=True)
        if block is not None:
            return block
        if not self._core.mv[_core.H_BIG_APART]:
            return self._beyond_growth(nbytes, size, kind)
        # separate_big_segments ends where growing does: a big segment's
        # free block now serves any request (and make_room plans with them)
        self._past_growth = True
        self._update_scarce_rules()
        try:
            block = self._take(nbytes, large=kind == SMALL)
            return block if block is not None else self._beyond_growth(nbytes, size, kind)
        finally:
            self._past_growth = False
            self._update_scarce_rules()

    def _beyond_growth(self, nbytes, size, kind):
        """The request path once the free blocks and growing have failed:
        reclaim, defragmentation (each when on), else OutOfMemoryError. Reclaim
        refused pinned host memory (ReclaimError, every block resident) still
        lets a defragmentation serve; if none does, that ReclaimError is raised."""
        refused = None
        if self._settings.reclaim:
            try:
                block = _reclaim.reclaim_for(self, size, kind, nbytes)
            except ReclaimError as error:
                if not (self._settings.defrag
                        and isinstance(error.__cause__, HostOutOfMemoryError)):
                    raise
                refused = error
            else:
                if block is not None:
                    return block
        if (self._settings.defrag and not self._moves_barred and self._free_bytes()
                and self._moves_could_serve(size)):
            block = (_page_room.make_page_room(self, size, kind, nbytes)
                     or _room.make_room(self, size, kind, nbytes))
            if block is not None:
                return block
        if refused is not None:
            try:
                raise refused
            finally:    # no cycle through this frame (as _out_of_memory)
                del refused
        self._out_of_memory(nbytes, size)

    def _moves_could_serve(self, size):
        """Whether moving blocks could make room for a ``size``-byte block
        at all: the allocated bytes and its own within what the pool
        reserves, or, growing, within the limit and what the device has
        free besides. A bound that needs no plan, so that a request no move
        can serve synchronizes nothing. It holds (defragmentation is tried)
        while blocks are reclaimed to host memory (allocated bytes include
        them) and when the device fails the query (the plans ask again)."""
        if self._residency.reclaimed:
            return True
        need, reserved = self.stats.current("allocated_bytes") + size, self.stats.current(
            "reserved_bytes")
        if need <= reserved:
            return True
        if self._growth_off or need > self._limit:
            return False
        try:
            device_free = self.backend.memory_info()[0]
        except Exception:
            return True
        return need <= reserved + device_free

    def _out_of_memory(self, nbytes, size):
        """Raise OutOfMemoryError for a request of ``nbytes`` (``size`` after
        rounding), counted in num_ooms and told to the observers."""
        # may raise: then nothing is counted
        error = out_of_memory_error(self._out_of_memory_report(nbytes, size))
        self.stats.num_ooms += 1
        for observer in self._observers:
            observer.on_out_of_memory(self, nbytes)
        try:
            raise error
        finally:    # else error -> traceback -> frame -> error keeps the callers' arrays
            del error

    # -- defragmentation (numba_alloc.policy.defrag) --------------------------------
    def defragment(self, nbytes=None, release=True) -> "_defrag.Defragmentation":
        """Move live blocks together (see :func:`numba_alloc.policy.defrag.defragment`):
        open a hole for ``nbytes``, or with None compact every segment and,
        with ``release``, return the segments left free to the device.
        Returns a :class:`~numba_alloc.policy.defrag.Defragmentation`."""
        return _defrag.defragment(self, nbytes, release)

    def pin_for_export(self, block) -> None:
        """Pin a live ``block`` where CUDA IPC can export it, moving it out
        of mapped pages first (see :func:`numba_alloc.policy.defrag.pin_for_export`)."""
        _defrag.pin_for_export(self, block)

    def _fits(self, size, kind):
        """Whether :meth:`_take` would find a free block for ``size`` bytes."""
        return size < CORE_LIMIT and _core.fits(self._core.p, size, kind)

    def _kept_whole_above(self, size, kind):
        """Wholly free segments of more bytes than this stay whole rather
        than serve ``size`` bytes of ``kind`` (keep_whole_segments while in
        force, as the core's take keeps them), or None."""
        if kind != LARGE or not self._core.mv[_core.H_KEEP_WHOLE] or self._growth_off:
            return None
        return segment_size(size, fitted=False) + LARGE_SEGMENT

    def _big_apart(self, size, kind):
        """Whether the core's take passes over big segments' free blocks
        for ``size`` bytes of ``kind`` (separate_big_segments in force)."""
        return kind == LARGE and size < MIN_LARGE_ALLOC and bool(self._core.mv[_core.H_BIG_APART])

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

    def __repr__(self):
        with self._lock:
            return (f"Pool({self.backend!r}, reserved {_fmt(self.current('reserved_bytes'))}, "
                    f"allocated {_fmt(self.current('allocated_bytes'))})")

    def _repr_html_(self):
        """Jupyter's view: what the layer above registered in RENDERERS
        (a table of the pool's state beside its segment map)."""
        render = RENDERERS.get("html")
        return None if render is None else render(self)

