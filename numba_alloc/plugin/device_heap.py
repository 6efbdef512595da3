"""``numba_alloc.DeviceHeap``: malloc and free inside Numba CUDA kernels.

A heap is one pinned block of a pool, cut in two:

* ``data``: the heap's bytes, a whole number of 64 KiB pages;
* ``meta`` (int64): a 512-entry header (bytes in use and its peak,
  invalid frees; the number of size classes; per size class its
  allocations moved off its pages and its failures, for page runs
  allocations, frees and failures; per class a page hint and the block
  size), then per page its word, then per page its run length (at a run's
  first page), then per page a bitmap of 128 words (32 blocks a word, in
  the low bits).

A page's word packs its state (a size class, UNASSIGNED, or LARGE while a
run owns it), its count (blocks reserved) and its grants (blocks granted
since it took its class), so that one atomic reserves blocks, checks the
page still serves the class and counts the allocations. The statistics
are derived on the host from the header and the page words
(:func:`heap_counters.heap_figures`): a class's allocations are its
header count plus its pages' grants, its live blocks its pages' counts,
its frees the difference; exact once the kernels have completed.

Size classes (a setting): by default 54 classes from 16 B to 8 KiB
(heap_kernels.DEFAULT_CLASSES): every multiple of 16 up to 128 B, then 8
a doubling (144, 160, ..., 256, 288, ...), each raised to the largest
multiple of 16 with as many blocks per 64 KiB page (1168, not 1152: 56
blocks either way). A request above 128 B is rounded up by under 17%; for
sizes log-uniform from 16 B to 8 KiB, 4.5% of the bytes handed out are
rounding (27% with power-of-two classes). Any 1 to 64 ascending multiples
of 16 up to 32 KiB may be given; a request's class is found by a binary
search of them. A page serves one class at a time; its bitmap marks its
taken blocks, so a heap needs about a page per class in use: a heap of a
few MiB fills more of its pages with fewer classes (``classes=(16, 32,
64, ..., 8192)``). Requests above the largest class take a run of whole
pages (the coarser path). Offsets are 16-byte aligned.

malloc (small), warp-aggregated: the lanes of a warp that call malloc
together are grouped by class (``activemask`` + ``match_any_sync``). The
group's lowest lane, its leader, reserves blocks for the whole group with
one atomic on a page's word (from the class's hint page, then a page past
it that the warp's index picks, then every other page once): an
``atomic.add`` on a page of its class, which takes what the capacity
leaves and gives back the rest, or undoes itself when the page changed
meanwhile; a ``cas`` to take an empty page, unassigned or of another class
(whose grants then go to that class's header count); it skips full pages,
pages in use by another class and runs. The page's count before its
reservation is a ticket: while a page fills, the group's blocks are the
ones after those reserved before it. It then sets the group's bits on
that page, a bitmap word at a time, with one ``atomic.or_`` each (first
the ticket's bits, not read first; then the clear bits as read), and
hands each word's blocks out by lane order (``shfl_sync``); then the next
page, until every lane has a block. One lane of the whole warp adds the
bytes all its lanes got to BYTES_IN_USE (their sum by a warp scan) and
raises the peak with an ``atomic.max`` whose result no thread waits for;
failures are counted per group, only when there are some.

malloc_warp: one block for the lanes of a warp that call it together: a
warp scan of their sizes (each rounded up to 16 bytes) gives each lane its
offset in the block and the total, which the lowest lane mallocs alone
(the small path above, or a run); it returns each lane's offset and
whether it holds the block's start (that lane frees it). It counts as one
allocation (or one failure); a negative size is a failure of its own.

free: one lane of the warp takes the bytes of the blocks its lanes free off
BYTES_IN_USE (behind a memory fence); the lanes freeing blocks of one
bitmap word clear their bits with one ``atomic.and_`` (a bit already clear,
or freed by a lower lane of the group too, is an invalid free, counted and
ignored); the lanes freeing blocks of one page drop its count with one
``atomic.add``; one lane counts the invalid frees. A page whose count drops
to 0 keeps its class (no atomic): the next malloc of the class uses it
again, or another class or a run takes it. Global atomics (counted under
the simulator by tests/test_heap_atomics.py, placed by the compiled code's
tests in tests/test_ptx.py): a malloc costs per group 1 per page plus 1 per
bitmap word it takes blocks from, and 2 per warp; a free 1 per word
plus 1 per page freed from plus 1 per warp; a warp of 16 B blocks 4 for
its 32 mallocs and 3 for its frees; four warps of log-uniform sizes from
16 B to 8 KiB (mostly a lane to a class) 1.48 per malloc and 1.44 per
free.

malloc (large): ``cas`` the words of consecutive empty pages to LARGE (a
plain read first skips busy ones), rolling back on the first busy page
(those taken become UNASSIGNED), from where the last run ended to the last
page, then from the first; the run's length, written last at its first
page, makes it freeable (free takes it back with ``atomic.exch``, so that
only one of two frees of a run counts).

It never hangs: every loop is bounded (each page once, a bounded number of
passes over a bitmap, the pages scanned for a run at most twice); a thread that finds no
room returns -1 and counts a failure; nothing waits for another thread
beyond the warp's own ``*_sync`` calls.

Kernels get the heap itself as an argument. On a GPU it is a Numba
extension type (heap_type.DeviceHeapType) over two device arrays, whose
``malloc``/``free``/``view`` compile the functions of
:mod:`numba_alloc.device.heap_kernels`; under the CUDA simulator it is this object,
whose methods run the same functions as Python on NumPy views of the
simulated device's memory.
"""

import weakref

import numpy as np

from ..device import heap_kernels as hk
from ..device import heap_layout as layout
from ..device import heap_type
from ..policy.block import ALLOCATED
from ..units import parse_size
from ..policy.pool import Pool
from ..backends.simulated import SimulatedDevice
from ..validate import as_flag, as_int
from .heap_counters import Completed, CounterReader, heap_figures


def check_classes(classes):
    """The size classes as a tuple of ints: 1 to MAX_CLASSES (64) ascending
    multiples of 16 from 16 to 32 KiB (ints or NumPy integers, not bools);
    TypeError or ValueError naming ``classes`` otherwise."""
    if isinstance(classes, (str, bytes)):
        raise TypeError(f"classes must be a sequence of block sizes in bytes, got "
                        f"{classes!r}")
    try:
        values = tuple(classes)
    except TypeError:
        raise TypeError(f"classes must be a sequence of block sizes in bytes, got "
                        f"{classes!r}") from None
    try:
        values = tuple(as_int(c, "classes", "") for c in values)
    except TypeError:
        raise TypeError(f"classes must hold int block sizes, got {classes!r}") from None
    if not 1 <= len(values) <= layout.MAX_CLASSES:
        raise ValueError(f"classes must hold 1 to {layout.MAX_CLASSES} block sizes, got "
                         f"{len(values)}")
    if any(c % layout.MIN_BLOCK or not layout.MIN_BLOCK <= c <= layout.PAGE // 2 for c in values):
        raise ValueError(f"classes must be multiples of {layout.MIN_BLOCK} from "
                         f"{layout.MIN_BLOCK} to {layout.PAGE // 2} bytes, got {classes!r}")
    if any(a >= b for a, b in zip(values, values[1:])):
        raise ValueError(f"classes must be in ascending order without repeats, got {classes!r}")
    return values


def check_size(size):
    """A heap's size in bytes, as an int > 0, from an int (a NumPy integer
    too, not a bool) or a string such as ``"256MiB"`` or ``"1.5GB"``;
    TypeError or ValueError naming ``size`` otherwise."""
    if not isinstance(size, str):
        size = as_int(size, "size", "an int number of bytes or a string such as '256MiB'")
    size = parse_size(size, "size")
    if size <= 0:
        raise ValueError(f"size must be a positive number of bytes, got {size}")
    return size


class DeviceHeap:
    """A heap of ``size`` bytes (an int > 0, a NumPy integer, or a string
    such as ``"256MiB"`` or ``"1.5GB"``), rounded up to whole 64 KiB pages,
    for allocating inside kernels, carved from ``pool`` (a
    :class:`numba_alloc.Pool`; None: the current GPU's pool) as one pinned
    block. ``classes``: the block sizes of the small path, in bytes, 1 to
    64 ascending multiples of 16 from 16 to 32 KiB (default
    ``DeviceHeap.default_classes``: 54 from 16 to 8192). A bad ``size`` or
    ``classes`` raises TypeError or ValueError naming it; a heap the pool
    cannot hold raises its OutOfMemoryError.

    In kernels and device functions: ``heap.malloc(nbytes)`` (a byte
    offset, 16-byte aligned, or -1 when full), ``heap.malloc_warp(nbytes)``
    (one block for the lanes of a warp calling it together: this lane's
    offset in it and whether this lane frees it), ``heap.free(offset)``,
    ``heap.view(offset, count, dtype)`` (a 1-D array of ``count`` items of
    ``dtype``, a Numba or NumPy type). On the host: :meth:`stats`,
    :meth:`reset`, :meth:`close`.
    """

    page_size = layout.PAGE
    default_classes = layout.DEFAULT_CLASSES
    _announced = True       # the pool's observers are told of its block when it is carved

    def __init__(self, size="64MiB", pool=None, classes=default_classes):
        self._block = None
        size = check_size(size)
        if pool is not None and not isinstance(pool, Pool):
            raise TypeError(f"pool must be a numba_alloc.Pool or None, got {pool!r}")
        self.size_classes = check_classes(classes)
        self._pages = -(-size // layout.PAGE)
        self.size = self._pages * layout.PAGE
        self._meta_len = layout.meta_size(self._pages)
        total = self.size + 8 * self._meta_len
        if pool is None:
            from .registry import resolve_pool
            with resolve_pool(None, "pool") as pool:
                self._allocate(pool, total)
        else:
            self._allocate(pool, total)

    def _allocate(self, pool, total):
        """Carve the heap's block from ``pool``, pinned, with its initial
        bookkeeping written. A fresh pool is initialized first, as its
        malloc would be (its limit resolved; with growth off, its arena
        reserved), so that the checks and errors below are those of the
        pool's malloc. All or nothing: a heap over the pool's limit
        raises its OutOfMemoryError (the limit and hint its malloc would
        give) before host memory is taken for the bookkeeping, which is
        built next (outside the pool's lock), and when anything fails once
        the block is carved (a backend call) the block goes back as if
        never allocated (the pool's counters, running totals included, as
        before; no observer told) and the heap is not registered."""
        backend = pool.backend
        with pool.lock:
            if not pool.initialized:        # a fresh pool's limit is not resolved yet
                pool._initialize()
            if total > pool.limit_bytes():  # no bookkeeping built for it
                pool._out_of_memory(total, total)
        simulated = isinstance(backend, SimulatedDevice)
        initial = self._initial_meta()
        if simulated:
            words = np.zeros(layout.HEADER + self._pages, np.int64)
        else:
            from numba import cuda
            with backend.in_context():
                words = cuda.pinned_array(layout.HEADER + self._pages, np.int64)
        # under the pool's lock from the carve to the registration: no other
        # thread moves or reclaims the block, nor resets the pool (which would
        # leave the heap open on a block that is gone), meanwhile; reset()
        # writes the bookkeeping under it too
        with pool.lock:
            mark = pool._growth_mark()
            block, undo = pool._malloc_undoable(total)
            pool.pin(block)
            try:
                start = self._views(backend, simulated, block, total, words)
                self._write_meta(backend, simulated, initial)
            except BaseException:
                self._data = self._meta = None
                pool.unpin(block)
                pool._untake(block, undo, mark)     # as if never allocated
                raise
            self._undo = None
            if self._announced:
                for observer in pool._block_observers:
                    observer.on_malloc(pool, block)
            else:
                self._undo = undo, mark      # (for _withdraw, until _announce)
            self._pool, self._block, self._simulated = pool, block, simulated
            # the host calls (stats, reset, close, ...) hold the pool's lock: one
            # lock, never two in either order (the pool's reads call counters())
            self._lock = pool.lock
            self._reader = CounterReader(start, words, self._lock)
            # a heap dropped without close() gives its block back (once the GPU
            # work queued before is done); free_later never blocks or raises.
            # Nothing the heap holds refers back to it (no reference cycle), so
            # that happens as soon as the last reference goes.
            self._finalizer = weakref.finalize(self, pool.free_later, block)
            pool.device_heaps.add(self)

    def _announce(self):
        """Tell the pool's observers of the block of a heap carved
        unannounced (``_announced`` False): it is kept (under the pool's lock)."""
        self._undo = None
        for observer in self._pool._block_observers:
            observer.on_malloc(self._pool, self._block)

    def _withdraw(self):
        """Give back the block of a heap carved unannounced, as if it had
        never been (the allocation counters as before), and the segment
        the pool grew for it, if it did: only while nothing else has
        happened in the pool since (under the pool's lock, held since the
        carve)."""
        pool, block, (undo, mark) = self._pool, self._block, self._undo
        self._detach()
        pool.unpin(block)
        pool._untake(block, undo, mark)

    def _views(self, backend, simulated, block, total, words):
        """Set the heap's views of ``block`` (data, meta); returns the start
        of a copy of meta's header and page words into ``words`` (for
        CounterReader), which refers to the meta view only, not to the heap."""
        self._meta_address = meta_address = block.address + self.size
        if simulated:
            memory = backend.view(block.address, total)
            self._data = memory[:self.size]
            self._meta = memory[self.size:].view(np.int64)
            meta_words = self._meta[:layout.HEADER + self._pages]

            def start():
                words[:] = meta_words
                return Completed
            return start
        from numba import cuda
        with backend.in_context():
            self._data = backend._array(block.address, (self.size,), np.uint8)
            self._meta = backend._array(meta_address, (self._meta_len,), np.int64)
            meta_words = self._meta[:layout.HEADER + self._pages]

        def start():
            with backend.in_context():
                stream = cuda.legacy_default_stream()   # after every blocking stream
                meta_words.copy_to_host(words, stream=stream)
            event = backend.event()              # recorded on that stream too
            event.record()
            return event
        return start

    def _write_meta(self, backend, simulated, meta):
        """Write ``meta`` (the whole bookkeeping) to device memory."""
        if simulated:
            backend.write(self._meta_address, meta)
        else:
            with backend.in_context():
                self._meta.copy_to_device(meta)

    # -- host side -----------------------------------------------------------
    @property
    def closed(self):
        return self._block is None

    def _open(self, action):
        if self._block is None:
            raise RuntimeError(f"DeviceHeap.{action}: the heap is closed")

    def _initial_meta(self):
        meta = np.zeros(self._meta_len, dtype=np.int64)
        meta[layout.HEADER:layout.HEADER + self._pages] = layout.UNASSIGNED * layout.STATE_UNIT
        n = len(self.size_classes)
        meta[layout.NUM_CLASSES] = n
        meta[layout.SIZE_BASE:layout.SIZE_BASE + n] = self.size_classes
        return meta

    def reset(self) -> None:
        """Everything free again and every counter zero. Call it between
        launches, never while a kernel using the heap runs. Thread safe."""
        with self._lock:
            self._open("reset")
            self._write_meta(self._pool.backend, self._simulated, self._initial_meta())
            self._reader.forget()

    @property
    def address(self):
        """The device address of the heap's pool block (its first page)."""
        with self._lock:
            self._open("address")
            return self._block.address

    @property
    def reserved_bytes(self):
        """Bytes of the heap's pool block: its pages and its bookkeeping."""
        with self._lock:
            self._open("reserved_bytes")
            return self._block.allocated_size

    def counters(self, wait=False) -> tuple[dict[str, int], bool]:
        """(the counters of numba_alloc.policy.counters.DEVICE_HEAP_COUNTERS that the
        kernels keep, as a dict, and up_to_date): see :meth:`stats`."""
        wait = as_flag(wait, "wait")
        self._open("counters")
        words, up_to_date = self._reader.read(wait)
        self._open("counters")          # closed meanwhile (by another thread)
        return heap_figures(words, self.size_classes)[0], up_to_date

    def stats(self, wait=False, compact=False) -> dict:
        """The heap's counters, as its kernels updated them in device memory:
        bytes_in_use, peak_bytes_in_use, num_allocs, num_frees, num_failed,
        num_invalid_frees (see numba_alloc.policy.counters.DEVICE_HEAP_COUNTERS),
        size, reserved_bytes, and ``classes``: per size class (keyed by its
        block size, and "large" for page runs) num_allocs, num_frees,
        num_failed, bytes_in_use and live_blocks. Bytes are those of the
        blocks handed out (a request rounded up to its class, or to whole
        pages). The allocations, frees and bytes are derived from the page
        words (:func:`heap_counters.heap_figures`), exact once the kernels
        have completed; a read copies the header and 8 bytes a page.
        ``compact=True`` leaves out of ``classes`` those that have neither
        served nor refused a request since the heap's last reset (of the 55
        by default, a kernel uses a few).

        Never waits for a kernel still running: ``up_to_date`` says whether
        the figures include all work queued before this call (they do once
        it has completed); when not, they are those of the last read that
        completed. ``wait=True`` waits for that work instead (without holding
        the pool's lock). TypeError when ``wait`` or ``compact`` is not a
        bool. Thread safe."""
        wait, compact = as_flag(wait, "wait"), as_flag(compact, "compact")
        self._open("stats")
        words, up_to_date = self._reader.read(wait)
        self._open("stats")             # closed meanwhile (by another thread)
        counters, classes = heap_figures(words, self.size_classes)
        if compact:
            classes = {name: c for name, c in classes.items()
                       if c["num_allocs"] or c["num_failed"]}
        return {"size": self.size, "reserved_bytes": self.reserved_bytes, **counters,
                "classes": classes, "up_to_date": up_to_date}

    def close(self) -> None:
        """Give the heap's block back to its pool (reusable once the GPU work
        queued before has finished). Idempotent; the heap cannot be used
        afterwards. A heap dropped without close() gives its block back
        as soon as its last reference goes (no reference cycle keeps it for
        the garbage collector). Thread safe."""
        with self._lock:
            if self._block is None:
                return
            block = self._block
            self._pool.unpin(block)
            try:
                self._pool.free(block)
            except BaseException:
                if self._pool.state_of(block) == ALLOCATED:
                    self._pool.pin(block)       # not freed: the heap stays open
                else:
                    self._detach()              # freed (an observer raised afterwards)
                raise
            self._detach()

    def _detach(self):
        """Forget the block (closed): after close(), or when the pool's
        reset() killed it (under the pool's lock)."""
        self._finalizer.detach()
        self._pool.device_heaps.discard(self)
        self._reader.close()
        self._block = self._data = self._meta = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self._block is None else f"{self._pages} pages"
        return f"DeviceHeap(size={self.size}, classes={self.size_classes}, {state})"

    # -- the kernel argument (GPU): passed as the tuple (data, meta) ------------
    def _check_kernel_argument(self):
        self._open("kernel argument")
        if self._simulated:
            raise TypeError("a DeviceHeap on a SimulatedDevice is a kernel argument only "
                            "under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")

    def __len__(self):
        return 2

    def __iter__(self):
        with self._lock:
            self._check_kernel_argument()
            return iter((self._data, self._meta))

    # -- device side under the CUDA simulator ---------------------------------
    def malloc(self, nbytes) -> int:
        """(in kernels) A 16-byte-aligned byte offset of ``nbytes`` bytes, or -1."""
        self._in_simulated_kernel("malloc")
        return hk.heap_malloc(self._data, self._meta, nbytes)

    def malloc_warp(self, nbytes) -> tuple[int, bool]:
        """(in kernels) One block for the lanes of a warp that call this
        together, each lane's ``nbytes`` rounded up to 16 bytes, in lane
        order: (this lane's 16-byte-aligned offset, whether this lane frees
        the block: ``free(offset)`` there), or (-1, False)."""
        self._in_simulated_kernel("malloc_warp")
        return hk.heap_malloc_warp(self._data, self._meta, nbytes)

    def free(self, offset) -> None:
        """(in kernels) Give back the allocation at ``offset`` (-1 is ignored;
        an offset that is not the start of a live allocation, a second free
        of one too, is counted in num_invalid_frees and otherwise ignored, as
        far as it is recognised: freeing a block another thread got since is
        not detected)."""
        self._in_simulated_kernel("free")
        hk.heap_free(self._data, self._meta, offset)

    def view(self, offset, count, dtype) -> np.ndarray:
        """(in kernels) A 1-D array of ``count`` items of ``dtype`` at ``offset``
        (from a successful malloc: check it is not -1 first). It is cut off
        at the heap's end; the view of -1 is empty, and writing through it
        is undefined (as writing through the null pointer CUDA's malloc
        returns when full): no bounds are checked on the device."""
        self._in_simulated_kernel("view")
        dtype = heap_type.as_dtype(dtype)
        start, items = hk.view_bounds(self._data.size, offset, count, dtype.itemsize)
        return self._data[start:start + items * dtype.itemsize].view(dtype)

    def _in_simulated_kernel(self, action):
        if not hk.SIMULATOR:
            raise TypeError(f"DeviceHeap.{action} runs inside CUDA kernels (pass the heap "
                            "as a kernel argument), not on the host")
        self._open(action)


heap_type.register_argument(DeviceHeap)
