"""The device heap's device code: malloc, free and view inside kernels.

Every function here is a ``cuda.jit(device=True)`` function over two arrays,
the heap's bytes ``data`` (uint8) and its bookkeeping ``meta`` (int64), laid
out as :mod:`numba_alloc.plugin.device_heap` describes. On a GPU, ``heap.malloc``,
``heap.free`` and ``heap.view`` are methods of the Numba extension type
:class:`DeviceHeapType` that call them; under the CUDA simulator the host
object's methods call them as Python, on NumPy arrays, with the simulator's
atomics. The same source runs both ways.
"""

from numba import cuda

from .heap_simulator import WARP, SimulatorCuda

# -- the layout (device_heap.py's docstring explains it) ---------------------
PAGE = 1 << 16                      # bytes per page
MIN_BLOCK = 16                      # the smallest class size, and the alignment
MAX_CLASSES = 64                    # size classes a heap may have
LARGE = MAX_CLASSES                 # the class index of page runs (above the largest class)
BITS = 32                           # blocks per bitmap word (low 32 bits of an int64)
FULL_WORD = (1 << BITS) - 1
WORDS_PER_PAGE = PAGE // MIN_BLOCK // BITS

# meta[0:HEADER]: counters, the class sizes and a page hint per class
BYTES_IN_USE, PEAK_BYTES_IN_USE, NUM_ALLOCS, NUM_FREES, NUM_FAILED, NUM_INVALID_FREES = range(6)
NUM_CLASSES = 6                     # how many size classes this heap has
RUN_HINT = 7                        # where the last page run ended: the next search starts there
CLASS_BASE = 8                      # per class, then for LARGE: allocs, frees, failed, bytes in use
CLASS_ALLOCS, CLASS_FREES, CLASS_FAILED, CLASS_BYTES = range(4)
CLASS_FIELDS = 4
HINT_BASE = CLASS_BASE + CLASS_FIELDS * (MAX_CLASSES + 1)   # per class: a page to look at first
SIZE_BASE = HINT_BASE + MAX_CLASSES                         # per class: its block size
HEADER = 512
assert SIZE_BASE + MAX_CLASSES <= HEADER

# page states (meta[HEADER + page]): a class index while it serves that class
UNASSIGNED = -1
RUN_HEAD = LARGE                    # first page of a run (large allocation)
RUN_BODY = LARGE + 1                # other pages of a run
# reference counts (meta[HEADER + pages + page])
RUN_MARK = 1 << 40                  # a run owns the page: small reservations back off
RETIRING = -(1 << 40)               # being handed back to UNASSIGNED: reservations back off

# the counters of numba_alloc.policy.counters.DEVICE_HEAP_COUNTERS kept in meta
COUNTER_INDEX = {"bytes_in_use": BYTES_IN_USE, "peak_bytes_in_use": PEAK_BYTES_IN_USE,
                 "num_allocs": NUM_ALLOCS, "num_frees": NUM_FREES, "num_failed": NUM_FAILED,
                 "num_invalid_frees": NUM_INVALID_FREES}

SMALL_TRIES = 4                     # passes over a page's bitmap before giving up


def page_fitted(size):
    """The largest multiple of MIN_BLOCK with as many blocks per page as
    ``size`` (a multiple of MIN_BLOCK, at most PAGE): ``size`` or more."""
    return PAGE // (PAGE // size) // MIN_BLOCK * MIN_BLOCK


def spaced_classes(per_octave, largest):
    """Size classes: every multiple of MIN_BLOCK up to ``per_octave`` of them,
    then ``per_octave`` a doubling, evenly spaced (jemalloc's spacing), up
    to ``largest`` (MIN_BLOCK x ``per_octave`` x a power of two), each
    :func:`page_fitted`; ascending, without repeats."""
    sizes = list(range(MIN_BLOCK, MIN_BLOCK * per_octave + 1, MIN_BLOCK))
    while sizes[-1] < largest:
        step = sizes[-1] // per_octave
        sizes += [sizes[-1] + step * i for i in range(1, per_octave + 1)]
    return tuple(sorted({page_fitted(size) for size in sizes}))


# 54 classes, 16 B ... 8 KiB: above 128 B a request is rounded up by under
# 17% (an eighth, but page fitting widens a gap: 4672 to 5456 bytes); of the
# bytes handed out for log-uniform requests, 4.5% are rounding (27% with
# power-of-two classes); a page's blocks leave under 16 B per block unused
DEFAULT_CLASSES = spaced_classes(8, 8192)


SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)


def _relaxed_load_intrinsic():
    """``load(array, index)``: array[index] of an int64 array as a relaxed
    load at GPU scope (``ld.relaxed.gpu``), for words other threads change
    with atomics: a plain load may be served from an SM's L1 cache, which
    other SMs' writes do not update."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.extending import intrinsic

    @intrinsic
    def load(typingctx, array, index):
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, signature.args[0], ary,
                                               [args[1]])
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), [pointer.type]),
                               "ld.relaxed.gpu.s64 $0, [$1];", "=l,l", side_effect=True)
            return builder.call(asm, [pointer])
        return types.int64(array, types.int64), codegen
    return load


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


if SIMULATOR:
    def _load(array, index):
        return array[index]
else:
    _load = _relaxed_load_intrinsic()


def meta_size(pages):
    """int64 entries of meta for a heap of ``pages`` pages."""
    return HEADER + 3 * pages + pages * WORDS_PER_PAGE


@_device
def _class_of(meta, nbytes):
    """The smallest size class whose blocks hold ``nbytes`` >= 0 bytes, or
    LARGE: a binary search of the ascending class sizes (at most 7 steps)."""
    n = meta[NUM_CLASSES]
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if meta[SIZE_BASE + mid] < nbytes:
            lo = mid + 1
        else:
            hi = mid
    if lo == n:
        return LARGE
    return lo


@_device
def _count(meta, k, n, nbytes, event):
    """Count ``n`` allocations (event 0) or frees (event 1) of ``nbytes``
    bytes in all, of class ``k``."""
    c = CLASS_BASE + CLASS_FIELDS * k
    if event == 0:
        cuda.atomic.add(meta, NUM_ALLOCS, n)
        cuda.atomic.add(meta, c + CLASS_ALLOCS, n)
        cuda.atomic.add(meta, c + CLASS_BYTES, nbytes)
        now = cuda.atomic.add(meta, BYTES_IN_USE, nbytes) + nbytes
        cuda.atomic.max(meta, PEAK_BYTES_IN_USE, now)
    else:
        cuda.atomic.add(meta, NUM_FREES, n)
        cuda.atomic.add(meta, c + CLASS_FREES, n)
        cuda.atomic.add(meta, c + CLASS_BYTES, -nbytes)
        cuda.atomic.add(meta, BYTES_IN_USE, -nbytes)


@_device
def _count_failed(meta, k, n):
    cuda.atomic.add(meta, NUM_FAILED, n)
    cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * k + CLASS_FAILED, n)


@_device
def _unreserve(meta, pages, p, n):
    """Drop ``n`` references to small page ``p``; the last one hands the
    page back (UNASSIGNED) unless someone reserved it meanwhile."""
    used = HEADER + pages + p
    if cuda.atomic.add(meta, used, -n) == n:
        if cuda.atomic.cas(meta, used, 0, RETIRING) == 0:
            cuda.atomic.exch(meta, HEADER + p, UNASSIGNED)
            cuda.threadfence()
            cuda.atomic.add(meta, used, -RETIRING)


@_device
def _reserve(meta, pages, k, p, want, capacity):
    """Reserve up to ``want`` blocks of page ``p`` for class ``k`` (one
    atomic on its reference count, one ``cas`` to claim an unassigned
    page); how many were reserved (0 when the page is full, retiring, owned
    by a run or serving another class)."""
    state = _load(meta, HEADER + p)
    if (state != k and state != UNASSIGNED) or _load(meta, HEADER + pages + p) >= capacity:
        return 0                # a plain read first: a full page costs no atomic
    used = cuda.atomic.add(meta, HEADER + pages + p, want)
    if used < 0 or used >= capacity:
        _unreserve(meta, pages, p, want)
        return 0
    granted = min(want, capacity - used)
    if granted < want:          # cannot reach 0: we hold ``granted``
        cuda.atomic.add(meta, HEADER + pages + p, granted - want)
    # holding references, the page cannot be handed back or change class
    state = cuda.atomic.cas(meta, HEADER + p, UNASSIGNED, k)
    if state != k and state != UNASSIGNED:
        _unreserve(meta, pages, p, granted)
        return 0
    return granted


@_device
def _claim_bit(meta, pages, p, size, salt):
    """The byte offset of a block of page ``p`` (class blocks of ``size``
    bytes) whose bit this thread sets, or -1 (a reservation of ``p`` is
    held, so a clear bit exists; give up after SMALL_TRIES passes)."""
    capacity = PAGE // size
    words = (capacity + BITS - 1) // BITS
    last = capacity - (words - 1) * BITS
    base = HEADER + 3 * pages + p * WORDS_PER_PAGE
    for attempt in range(SMALL_TRIES * words):
        w = (salt + attempt) % words
        full = FULL_WORD
        if w == words - 1:
            full = (1 << last) - 1
        seen = _load(meta, base + w)
        for _ in range(BITS):
            clear = ~seen & full
            if clear == 0:
                break
            mask = 1 << (cuda.ffs(clear) - 1)
            old = cuda.atomic.or_(meta, base + w, mask)
            if old & mask == 0:
                return p * PAGE + (w * BITS + cuda.ffs(mask) - 1) * size
            seen = old | mask
    return -1


@_device
def _malloc_small(meta, pages, k, peers, lane, salt):
    """malloc for the lanes ``peers`` of a warp, which all ask for class
    ``k``: the lowest lane reserves blocks for all of them, a page at a time
    (one atomic per page instead of one per thread), and hands the pages
    out by lane order; then each lane claims its own bit; the lowest lane
    counts the group's allocations and failures with one atomic each."""
    size = meta[SIZE_BASE + k]
    capacity = PAGE // size
    leader = cuda.ffs(peers) - 1
    me = 1 << lane
    remaining = peers & FULL_WORD   # match_any_sync gives an int32: no sign extension
    start = _load(meta, HINT_BASE + k)
    cursor = 0                  # pages the leader is done with
    my_page = -1
    last_page = -1
    for _ in range(WARP + 1):   # each round serves at least one lane, or ends
        page = -1
        granted = 0
        if lane == leader:
            want = cuda.popc(remaining)
            while cursor < pages and granted == 0:
                page = (start + cursor) % pages
                granted = _reserve(meta, pages, k, page, want, capacity)
                if granted < want:
                    cursor += 1
            if granted == 0:
                page = -1
        page = cuda.shfl_sync(peers, page, leader)
        granted = cuda.shfl_sync(peers, granted, leader)
        if page < 0:
            break
        last_page = page
        mine = (remaining & me) != 0 and cuda.popc(remaining & (me - 1)) < granted
        if mine:
            my_page = page
        remaining &= ~cuda.ballot_sync(peers, mine)
        if remaining == 0:
            break
    off = -1
    if my_page >= 0:
        off = _claim_bit(meta, pages, my_page, size, salt)
        if off < 0:
            _unreserve(meta, pages, my_page, 1)
    done = cuda.ballot_sync(peers, off >= 0)
    if lane == leader:
        if last_page >= 0 and last_page != start:
            meta[HINT_BASE + k] = last_page
        n = cuda.popc(done)
        if n > 0:
            _count(meta, k, n, n * size, 0)
        if cuda.popc(peers) > n:
            _count_failed(meta, k, cuda.popc(peers) - n)
    return off


@_device
def _malloc_large(meta, pages, nbytes):
    """A run of whole pages: ``cas`` the counts of consecutive pages from 0
    to RUN_MARK (a plain read first skips busy ones), rolling back on the
    first busy page (dropping RUN_MARK as :func:`_unreserve` drops
    references, so that a page left empty is handed back); from the run
    hint to the end, then from the start."""
    if nbytes > pages * PAGE:           # (also keeps need below from overflowing)
        _count_failed(meta, LARGE, 1)
        return -1
    need = (nbytes + PAGE - 1) // PAGE
    start = _load(meta, RUN_HINT)
    if start < 0 or start + need > pages:
        start = 0
    s = start
    end = pages
    for _ in range(2):
        while s + need <= end:
            got = 0
            for j in range(need):
                at = HEADER + pages + s + j
                if _load(meta, at) != 0 or cuda.atomic.cas(meta, at, 0, RUN_MARK) != 0:
                    break
                got += 1
            if got == need:
                for j in range(1, need):
                    cuda.atomic.exch(meta, HEADER + s + j, RUN_BODY)
                cuda.atomic.exch(meta, HEADER + 2 * pages + s, need)
                cuda.threadfence()
                cuda.atomic.exch(meta, HEADER + s, RUN_HEAD)
                meta[RUN_HINT] = s + need
                _count(meta, LARGE, 1, need * PAGE, 0)
                return s * PAGE
            for j in range(got):
                # as a reference dropped: a page emptied meanwhile (its last
                # block freed, whose hand-back found the page owned and backed
                # off) is handed back here, not left serving its class
                _unreserve(meta, pages, s + j, RUN_MARK)
            s += got + 1
        if start == 0:
            break
        s, end = 0, min(pages, start + need - 1)    # runs that start before the hint
    _count_failed(meta, LARGE, 1)
    return -1


@_device
def heap_malloc(data, meta, nbytes):
    """A 16-byte-aligned byte offset of ``nbytes`` free bytes of the heap,
    or -1 (counted in NUM_FAILED) when none is free or ``nbytes`` < 0. The
    lanes of a warp that call it together and ask for the same class share
    the reservation and counter atomics."""
    pages = data.size // PAGE
    k = LARGE
    if nbytes >= 0:
        k = _class_of(meta, nbytes)
    lane = cuda.laneid
    peers = cuda.match_any_sync(cuda.activemask(), k)
    if k < LARGE:
        return _malloc_small(meta, pages, k, peers, lane, cuda.grid(1))
    if nbytes < 0:
        _count_failed(meta, LARGE, 1)
        return -1
    return _malloc_large(meta, pages, nbytes)


@_device
def heap_free(data, meta, off):
    """Give back the allocation at byte offset ``off``; -1 is ignored. An
    offset that is not the start of a live allocation is counted in
    NUM_INVALID_FREES and otherwise ignored (as far as it is recognised:
    freeing memory that is not yours is not supported). The lanes of a warp
    that free blocks of one class together count them with one atomic each."""
    if off == -1:
        return
    pages = data.size // PAGE
    k = -1                      # the class freed; -1: an invalid free
    size = 0
    if 0 <= off < pages * PAGE:
        p = off // PAGE
        state = _load(meta, HEADER + p)
        if 0 <= state < LARGE:
            size = meta[SIZE_BASE + state]
            rel = off - p * PAGE
            if rel % size == 0:
                block = rel // size
                mask = 1 << (block % BITS)
                at = HEADER + 3 * pages + p * WORDS_PER_PAGE + block // BITS
                if cuda.atomic.and_(meta, at, ~mask & FULL_WORD) & mask != 0:
                    k = state
                    _unreserve(meta, pages, p, 1)
        elif state == RUN_HEAD and off == p * PAGE:
            if cuda.atomic.cas(meta, HEADER + p, RUN_HEAD, RUN_BODY) == RUN_HEAD:
                k = LARGE
                cuda.threadfence()
                need = _load(meta, HEADER + 2 * pages + p)
                size = need * PAGE
                for j in range(need):
                    cuda.atomic.exch(meta, HEADER + p + j, UNASSIGNED)
                cuda.threadfence()
                for j in range(need):
                    cuda.atomic.add(meta, HEADER + pages + p + j, -RUN_MARK)
    if k == LARGE:
        _count(meta, LARGE, 1, size, 1)
        return
    peers = cuda.match_any_sync(cuda.activemask(), k)
    if cuda.laneid == cuda.ffs(peers) - 1:
        n = cuda.popc(peers)
        if k < 0:
            cuda.atomic.add(meta, NUM_INVALID_FREES, n)
        else:
            _count(meta, k, n, n * size, 1)


@_device
def view_bounds(size, off, count, itemsize):
    """(first byte, items) of ``heap.view(off, count, dtype)`` over a heap of
    ``size`` bytes: the bytes [off, off + count * itemsize) as a Python slice
    takes them (negative bounds count from the end, both are clipped to the
    heap), whole items only."""
    start, stop = off, off + count * itemsize
    if start < 0:
        start = max(start + size, 0)
    start = min(start, size)
    if stop < 0:
        stop = max(stop + size, 0)
    stop = min(stop, size)
    return start, max(stop - start, 0) // itemsize


if SIMULATOR:
    cuda = SimulatorCuda()          # noqa: F811 (the device functions' ``cuda``)
