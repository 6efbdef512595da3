"""``numba_alloc.DeviceHeap``: malloc and free inside Numba CUDA kernels.

A heap is one pinned block of a pool, cut in two:

* ``data``: the heap's bytes, a whole number of 64 KiB pages;
* ``meta`` (int64): a 64-entry header (counters: bytes in use, peak,
  allocations, frees, failures, invalid frees, and per size class
  allocations, frees, failures and bytes in use; then a page hint per class),
  then per page its state, its reference count and its run length, then per
  page a bitmap of 128 words (32 blocks a word, in the low bits).

Size classes: 16, 32, ..., 2048 bytes (8 classes). A page serves one class
at a time; its bitmap marks its taken blocks. Requests above 2048 bytes take
a run of whole pages (the coarser path). Offsets are 16-byte aligned.

malloc (small): from the class's hint page, look at each page once; skip
pages of another class; reserve a block with ``atomic.add`` on the page's
reference count (back off if that reaches the page's capacity, or the page
is being handed back or owned by a run); claim the page for the class with
``atomic.cas`` if unassigned; then take a clear bit with ``atomic.or_``
(holding a reservation, a clear bit exists). free clears the bit with
``atomic.and_`` (a bit already clear is an invalid free, counted and
ignored) and drops the reference; the last reference hands the page back to
UNASSIGNED (``cas`` of the count from 0 to RETIRING, which makes
reservations back off while the state is reset). malloc (large): ``cas`` the
counts of consecutive pages from 0 to RUN_MARK, rolling back on the first
busy page. Counters are updated with ``atomic.add``/``max``.

It never hangs: every loop is bounded (each page once, a bounded number of
passes over a bitmap, runs scanned left to right); a thread that finds no
room returns -1 and counts a failure; nothing waits for another thread.
Not yet done: warp aggregation (one atomic per warp), size classes as
settings, and the heap's counters in memory_stats/summary/snapshot.

Kernels get the heap itself as an argument. On a GPU it is a Numba
extension type (heap_kernels.DeviceHeapType) over two device arrays, whose
``malloc``/``free``/``view`` compile the functions of
:mod:`numba_alloc.heap_kernels`; under the CUDA simulator it is this object,
whose methods run the same functions as Python on NumPy views of the
simulated device's memory.
"""

import numpy as np

from . import heap_kernels as hk
from .config import parse_size
from .pool import Pool
from .simulated import SimulatedDevice

_CLASS_NAMES = [hk.MIN_BLOCK << k for k in range(hk.SMALL_CLASSES)] + ["large"]


class DeviceHeap:
    """A heap of ``size`` bytes (an int or a string such as ``"256MiB"``,
    rounded up to whole 64 KiB pages) for allocating inside kernels, carved
    from ``pool`` (a :class:`numba_alloc.Pool`; None: the current GPU's
    pool) as one pinned block.

    In kernels and device functions: ``heap.malloc(nbytes)`` (a byte
    offset, 16-byte aligned, or -1 when full), ``heap.free(offset)``,
    ``heap.view(offset, count, dtype)`` (a 1-D array of ``count`` items of
    ``dtype``, a Numba or NumPy type). On the host: :meth:`stats`,
    :meth:`reset`, :meth:`close`.
    """

    page_size = hk.PAGE
    size_classes = tuple(_CLASS_NAMES[:-1])

    def __init__(self, size="64MiB", pool=None):
        if isinstance(size, float) or not isinstance(size, (int, str)):
            raise TypeError(f"size must be an int number of bytes or a string such as "
                            f"'256MiB', got {size!r}")
        size = parse_size(size, "size")
        if size <= 0:
            raise ValueError(f"size must be a positive number of bytes, got {size}")
        if pool is not None and not isinstance(pool, Pool):
            raise TypeError(f"pool must be a numba_alloc.Pool or None, got {pool!r}")
        self._pages = -(-size // hk.PAGE)
        self.size = self._pages * hk.PAGE
        self._meta_len = hk.meta_size(self._pages)
        total = self.size + 8 * self._meta_len
        if pool is None:
            from .registry import resolve_pool
            with resolve_pool(None, "pool") as pool:
                self._allocate(pool, total)
        else:
            self._allocate(pool, total)
        self.reset()

    def _allocate(self, pool, total):
        block = pool.malloc(total)
        pool.pin(block)
        self._pool, self._block = pool, block
        backend = pool.backend
        self._simulated = isinstance(backend, SimulatedDevice)
        meta_address = block.address + self.size
        if self._simulated:
            memory = backend.view(block.address, total)
            self._data = memory[:self.size]
            self._meta = memory[self.size:].view(np.int64)
        else:
            self._data = backend._array(block.address, (self.size,), np.uint8)
            self._meta = backend._array(meta_address, (self._meta_len,), np.int64)
        self._meta_address = meta_address

    # -- host side -----------------------------------------------------------
    @property
    def closed(self):
        return self._block is None

    def _open(self, action):
        if self._block is None:
            raise RuntimeError(f"DeviceHeap.{action}: the heap is closed")

    def _initial_meta(self):
        meta = np.zeros(self._meta_len, dtype=np.int64)
        meta[hk.HEADER:hk.HEADER + self._pages] = hk.UNASSIGNED
        return meta

    def reset(self):
        """Everything free again and every counter zero. Call it between
        launches, never while a kernel using the heap runs."""
        self._open("reset")
        meta = self._initial_meta()
        if self._simulated:
            self._pool.backend.write(self._meta_address, meta)
        else:
            self._meta.copy_to_device(meta)

    def _header(self):
        """The counters: one device-to-host copy."""
        if self._simulated:
            return self._pool.backend.read(self._meta_address, 8 * hk.HEADER).view(np.int64)
        return self._meta[:hk.HEADER].copy_to_host()

    def stats(self):
        """The heap's counters, read after the kernels that updated them
        completed: bytes_in_use, peak_bytes_in_use, num_allocs, num_frees,
        num_failed, num_invalid_frees, size, and ``classes``: per size class
        (16 ... 2048, and "large" for page runs) num_allocs, num_frees,
        num_failed and bytes_in_use. Bytes are those of the blocks handed
        out (a request rounded up to its class, or to whole pages)."""
        self._open("stats")
        h = [int(x) for x in self._header()]
        classes = {}
        for k, name in enumerate(_CLASS_NAMES):
            c = hk.CLASS_BASE + hk.CLASS_FIELDS * k
            classes[name] = {"num_allocs": h[c + hk.CLASS_ALLOCS],
                             "num_frees": h[c + hk.CLASS_FREES],
                             "num_failed": h[c + hk.CLASS_FAILED],
                             "bytes_in_use": h[c + hk.CLASS_BYTES]}
        return {"size": self.size, "bytes_in_use": h[hk.BYTES_IN_USE],
                "peak_bytes_in_use": h[hk.PEAK_BYTES_IN_USE], "num_allocs": h[hk.NUM_ALLOCS],
                "num_frees": h[hk.NUM_FREES], "num_failed": h[hk.NUM_FAILED],
                "num_invalid_frees": h[hk.NUM_INVALID_FREES], "classes": classes}

    def close(self):
        """Give the heap's block back to its pool. Idempotent; the heap
        cannot be used afterwards."""
        if self._block is None:
            return
        block, self._block = self._block, None
        self._data = self._meta = None
        self._pool.unpin(block)
        self._pool.free(block)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self._block is None else f"{self._pages} pages"
        return f"DeviceHeap(size={self.size}, {state})"

    # -- the kernel argument (GPU): passed as the tuple (data, meta) ------------
    def _check_kernel_argument(self):
        self._open("kernel argument")
        if self._simulated:
            raise TypeError("a DeviceHeap on a SimulatedDevice is a kernel argument only "
                            "under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")

    def __len__(self):
        return 2

    def __iter__(self):
        self._check_kernel_argument()
        return iter((self._data, self._meta))

    # -- device side under the CUDA simulator ---------------------------------
    def malloc(self, nbytes):
        """(in kernels) A 16-byte-aligned byte offset of ``nbytes`` bytes, or -1."""
        self._in_simulated_kernel("malloc")
        return hk.heap_malloc(self._data, self._meta, nbytes)

    def free(self, offset):
        """(in kernels) Give back the allocation at ``offset`` (-1 is ignored)."""
        self._in_simulated_kernel("free")
        hk.heap_free(self._data, self._meta, offset)

    def view(self, offset, count, dtype):
        """(in kernels) A 1-D array of ``count`` items of ``dtype`` at ``offset``."""
        self._in_simulated_kernel("view")
        dtype = hk.as_dtype(dtype)
        return self._data[offset:offset + count * dtype.itemsize].view(dtype)

    def _in_simulated_kernel(self, action):
        if not hk.SIMULATOR:
            raise TypeError(f"DeviceHeap.{action} runs inside CUDA kernels (pass the heap "
                            "as a kernel argument), not on the host")
        self._open(action)


hk.register_argument(DeviceHeap)
