"""The device heap's device code: malloc, free and view inside kernels.

Every function here is a ``cuda.jit(device=True)`` function over two arrays,
the heap's bytes ``data`` (uint8) and its bookkeeping ``meta`` (int64), laid
out as :mod:`numba_alloc.device_heap` describes. On a GPU, ``heap.malloc``,
``heap.free`` and ``heap.view`` are methods of the Numba extension type
:class:`DeviceHeapType` that call them; under the CUDA simulator the host
object's methods call them as Python, on NumPy arrays, with the simulator's
atomics. The same source runs both ways.
"""

import numpy as np
from numba import cuda

# -- the layout (device_heap.py's docstring explains it) ---------------------
PAGE = 1 << 16                      # bytes per page
MIN_BLOCK = 16                      # the smallest size class, and the alignment
SMALL_CLASSES = 8                   # 16, 32, ..., 2048 bytes
MAX_SMALL = MIN_BLOCK << (SMALL_CLASSES - 1)
LARGE = SMALL_CLASSES               # the class index of page runs (requests > MAX_SMALL)
CLASSES = SMALL_CLASSES + 1
BITS = 32                           # blocks per bitmap word (low 32 bits of an int64)
FULL_WORD = (1 << BITS) - 1
WORDS_PER_PAGE = PAGE // MIN_BLOCK // BITS

# meta[0:HEADER]: counters and hints
BYTES_IN_USE, PEAK_BYTES_IN_USE, NUM_ALLOCS, NUM_FREES, NUM_FAILED, NUM_INVALID_FREES = range(6)
CLASS_BASE = 8                      # per class: allocs, frees, failed, bytes in use
CLASS_ALLOCS, CLASS_FREES, CLASS_FAILED, CLASS_BYTES = range(4)
CLASS_FIELDS = 4
HINT_BASE = CLASS_BASE + CLASS_FIELDS * CLASSES     # per class: a page to look at first
HEADER = 64

# page states (meta[HEADER + page])
UNASSIGNED = -1
RUN_HEAD = LARGE                    # first page of a run (large allocation)
RUN_BODY = LARGE + 1                # other pages of a run
# reference counts (meta[HEADER + pages + page])
RUN_MARK = 1 << 40                  # a run owns the page: small reservations back off
RETIRING = -(1 << 40)               # being handed back to UNASSIGNED: reservations back off

SMALL_TRIES = 4                     # passes over a page's bitmap before moving on


SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)


class _SimulatorAtomics:
    """The atomics the heap uses, for the CUDA simulator, under one lock:
    the simulator's own lock each kind of operation separately, so that its
    ``add`` and ``cas`` on one element race each other."""

    def __init__(self):
        import threading
        self._lock = threading.Lock()

    def add(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = old + value
        return old

    def max(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = max(old, value)
        return old

    def or_(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = old | value
        return old

    def and_(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = old & value
        return old

    def exch(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = value
        return old

    def cas(self, array, index, expected, value):
        with self._lock:
            old = array[index]
            if old == expected:
                array[index] = value
        return old


class _SimulatorCuda:
    """``cuda`` in this module under the simulator: the running kernel's
    simulated ``cuda`` module (grid, ffs, threadfence, ...), with atomics
    that share one lock."""

    atomic = _SimulatorAtomics()

    def __getattr__(self, name):
        from numba.cuda.simulator.kernel import _get_kernel_context
        return getattr(_get_kernel_context(), name)


def _device(function):
    """A device function: compiled into whatever calls it on a GPU (an
    overload, as ``register_jitable`` makes: no current device is needed to
    compile, so ``cuda.compile_ptx`` works without a GPU); a simulator
    plain Python function under NUMBA_ENABLE_CUDASIM, whose ``cuda`` is
    :class:`_SimulatorCuda`."""
    if SIMULATOR:
        return function
    from numba.cuda.extending import register_jitable
    return register_jitable(function)


def meta_size(pages):
    """int64 entries of meta for a heap of ``pages`` pages."""
    return HEADER + 3 * pages + pages * WORDS_PER_PAGE


@_device
def _class_of(nbytes):
    """The small size class of a request, or LARGE."""
    k = 0
    size = MIN_BLOCK
    while size < nbytes and k < SMALL_CLASSES:
        size *= 2
        k += 1
    return k


@_device
def _count(meta, k, size, event):
    """Count one allocation (event 0) or free (event 1) of ``size`` bytes in class ``k``."""
    c = CLASS_BASE + CLASS_FIELDS * k
    if event == 0:
        cuda.atomic.add(meta, NUM_ALLOCS, 1)
        cuda.atomic.add(meta, c + CLASS_ALLOCS, 1)
        cuda.atomic.add(meta, c + CLASS_BYTES, size)
        now = cuda.atomic.add(meta, BYTES_IN_USE, size) + size
        cuda.atomic.max(meta, PEAK_BYTES_IN_USE, now)
    else:
        cuda.atomic.add(meta, NUM_FREES, 1)
        cuda.atomic.add(meta, c + CLASS_FREES, 1)
        cuda.atomic.add(meta, c + CLASS_BYTES, -size)
        cuda.atomic.add(meta, BYTES_IN_USE, -size)


@_device
def _unreserve(meta, pages, p):
    """Drop one reference to small page ``p``; the last one hands the page
    back (UNASSIGNED) unless someone reserved it meanwhile."""
    used = HEADER + pages + p
    if cuda.atomic.add(meta, used, -1) == 1:
        if cuda.atomic.cas(meta, used, 0, RETIRING) == 0:
            cuda.atomic.exch(meta, HEADER + p, UNASSIGNED)
            cuda.threadfence()
            cuda.atomic.add(meta, used, -RETIRING)


@_device
def _malloc_small(meta, pages, k, salt):
    size = MIN_BLOCK << k
    capacity = PAGE // size
    words = capacity // BITS
    start = meta[HINT_BASE + k]
    for step in range(pages):
        p = (start + step) % pages
        state = meta[HEADER + p]
        if state != k and state != UNASSIGNED:
            continue
        # reserve a block of the page: afterwards a clear bit exists for us
        used = cuda.atomic.add(meta, HEADER + pages + p, 1)
        if used < 0 or used >= capacity:
            _unreserve(meta, pages, p)
            continue
        # holding a reference, the page cannot be handed back or change class
        state = cuda.atomic.cas(meta, HEADER + p, UNASSIGNED, k)
        if state != k and state != UNASSIGNED:
            _unreserve(meta, pages, p)
            continue
        base = HEADER + 3 * pages + p * WORDS_PER_PAGE
        first = salt % words
        for attempt in range(SMALL_TRIES * words):
            w = (first + attempt) % words
            seen = meta[base + w]
            for _ in range(BITS):
                if seen == FULL_WORD:
                    break
                bit = cuda.ffs(~seen & FULL_WORD) - 1
                mask = 1 << bit
                old = cuda.atomic.or_(meta, base + w, mask)
                if old & mask == 0:
                    if p != start:
                        meta[HINT_BASE + k] = p
                    _count(meta, k, size, 0)
                    return p * PAGE + (w * BITS + bit) * size
                seen = old | mask
        _unreserve(meta, pages, p)
    return -1


@_device
def _malloc_large(meta, pages, nbytes):
    need = (nbytes + PAGE - 1) // PAGE
    s = 0
    while s + need <= pages:
        got = 0
        for j in range(need):
            if cuda.atomic.cas(meta, HEADER + pages + s + j, 0, RUN_MARK) != 0:
                break
            got += 1
        if got == need:
            for j in range(1, need):
                cuda.atomic.exch(meta, HEADER + s + j, RUN_BODY)
            cuda.atomic.exch(meta, HEADER + 2 * pages + s, need)
            cuda.threadfence()
            cuda.atomic.exch(meta, HEADER + s, RUN_HEAD)
            _count(meta, LARGE, need * PAGE, 0)
            return s * PAGE
        for j in range(got):
            cuda.atomic.add(meta, HEADER + pages + s + j, -RUN_MARK)
        s += got + 1
    return -1


@_device
def heap_malloc(data, meta, nbytes):
    """A 16-byte-aligned byte offset of ``nbytes`` free bytes of the heap,
    or -1 (counted in NUM_FAILED) when none is free or ``nbytes`` < 0."""
    salt = cuda.grid(1)         # spreads threads over a page's bitmap
    pages = data.size // PAGE
    off = -1
    k = LARGE
    if nbytes >= 0:
        k = _class_of(nbytes)
        if k < SMALL_CLASSES:
            off = _malloc_small(meta, pages, k, salt)
        else:
            off = _malloc_large(meta, pages, nbytes)
    if off < 0:
        cuda.atomic.add(meta, NUM_FAILED, 1)
        cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * k + CLASS_FAILED, 1)
    return off


@_device
def heap_free(data, meta, off):
    """Give back the allocation at byte offset ``off``; -1 is ignored. An
    offset that is not the start of a live allocation is counted in
    NUM_INVALID_FREES and otherwise ignored (as far as it is recognised:
    freeing memory that is not yours is not supported)."""
    if off == -1:
        return
    pages = data.size // PAGE
    valid = False
    if 0 <= off < pages * PAGE:
        p = off // PAGE
        state = meta[HEADER + p]
        if 0 <= state < SMALL_CLASSES:
            size = MIN_BLOCK << state
            rel = off - p * PAGE
            if rel % size == 0:
                block = rel // size
                mask = 1 << (block % BITS)
                at = HEADER + 3 * pages + p * WORDS_PER_PAGE + block // BITS
                if cuda.atomic.and_(meta, at, ~mask & FULL_WORD) & mask != 0:
                    valid = True
                    _count(meta, state, size, 1)
                    _unreserve(meta, pages, p)
        elif state == RUN_HEAD and off == p * PAGE:
            if cuda.atomic.cas(meta, HEADER + p, RUN_HEAD, RUN_BODY) == RUN_HEAD:
                valid = True
                need = meta[HEADER + 2 * pages + p]
                _count(meta, LARGE, need * PAGE, 1)
                for j in range(need):
                    cuda.atomic.exch(meta, HEADER + p + j, UNASSIGNED)
                cuda.threadfence()
                for j in range(need):
                    cuda.atomic.add(meta, HEADER + pages + p + j, -RUN_MARK)
    if not valid:
        cuda.atomic.add(meta, NUM_INVALID_FREES, 1)


# -- the extension type (GPU); the simulator uses DeviceHeap's own methods ----
def _register_extension():
    from numba.core import types as core_types
    from numba.cuda import types
    from numba.cuda.extending import make_attribute_wrapper, models, overload_method, \
        register_model
    from numba.np import numpy_support

    class DeviceHeapType(types.BaseTuple):
        """A device heap as a kernel argument: its bytes (uint8[::1]) and its
        bookkeeping (int64[::1]). A tuple type so that the kernel launch
        passes its arrays as it passes a tuple's."""

        def __init__(self):
            self.types = (types.uint8[::1], types.int64[::1])
            super().__init__(name="DeviceHeap")

        def __len__(self):
            return len(self.types)

        def __iter__(self):
            return iter(self.types)

        def __getitem__(self, i):
            return self.types[i]

        @property
        def key(self):
            return "numba_alloc.DeviceHeap"

    @register_model(DeviceHeapType)
    class DeviceHeapModel(models.StructModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, [("data", fe_type.types[0]),
                                            ("meta", fe_type.types[1])])

    make_attribute_wrapper(DeviceHeapType, "data", "data")
    make_attribute_wrapper(DeviceHeapType, "meta", "meta")

    @overload_method(DeviceHeapType, "malloc", target="cuda")
    def _malloc(heap, nbytes):
        def impl(heap, nbytes):
            return heap_malloc(heap.data, heap.meta, nbytes)
        return impl

    @overload_method(DeviceHeapType, "free", target="cuda")
    def _free(heap, off):
        def impl(heap, off):
            heap_free(heap.data, heap.meta, off)
        return impl

    @overload_method(DeviceHeapType, "view", target="cuda", inline="always")
    def _view(heap, off, count, dtype):
        if isinstance(dtype, types.NumberClass):
            np_dtype = numpy_support.as_dtype(dtype.instance_type)
        elif isinstance(dtype, types.DType):
            np_dtype = numpy_support.as_dtype(dtype.dtype)
        elif isinstance(dtype, core_types.Type):
            np_dtype = numpy_support.as_dtype(dtype)
        else:
            return None
        itemsize = np_dtype.itemsize

        def impl(heap, off, count, dtype):
            return heap.data[off:off + count * itemsize].view(np_dtype)
        return impl

    device_heap_type = DeviceHeapType()
    return DeviceHeapType, device_heap_type


DeviceHeapType = device_heap_type = None
if SIMULATOR:
    cuda = _SimulatorCuda()         # noqa: F811 (the device functions' ``cuda``)
else:
    DeviceHeapType, device_heap_type = _register_extension()


def register_argument(cls):
    """Make instances of ``cls`` (DeviceHeap) kernel arguments of
    DeviceHeapType (on a GPU; the simulator passes them as they are)."""
    if device_heap_type is None:
        return
    from numba.cuda.extending import typeof_impl

    @typeof_impl.register(cls)
    def _typeof_heap(heap, context):
        heap._check_kernel_argument()
        return device_heap_type


def as_dtype(dtype):
    """A NumPy dtype from a NumPy one or a Numba type (the simulator's view)."""
    from numba.core import types
    if isinstance(dtype, types.NumberClass):
        dtype = dtype.instance_type
    if isinstance(dtype, types.Type):
        from numba.np import numpy_support
        return numpy_support.as_dtype(dtype)
    return np.dtype(dtype)
