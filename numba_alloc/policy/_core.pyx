# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The pool's compiled core, built ahead of time (Cython, when the package
is installed): the entry points the pool calls with the core array's
address ``p`` (one integer, not an array: unboxing an array costs more than
the work) and plain integers; the handles it hands out (:class:`Block`), and
malloc's and free's fast paths, which make and retire them in one call.
core.py is the Python face of this module and says what the array holds;
core_blocks.pxi (included below) holds the internals. The layout's
positions are core_layout.py's, read into C globals when this module is
imported, so that they are declared once.

Nothing is compiled at run time. Not thread safe: the pool calls the core
under its lock.
"""

from libc.stdint cimport int64_t, uint64_t, uintptr_t

import numpy as np

from . import core_layout as _layout

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil
    int __builtin_clzll(unsigned long long) nogil


cdef inline int64_t _ctz(int64_t word) noexcept nogil:
    return __builtin_ctzll(<unsigned long long>word)


cdef inline int64_t _clz(int64_t word) noexcept nogil:
    return __builtin_clzll(<unsigned long long>word)


# the layout (core_layout.py), as C values
cdef int64_t SMALL = _layout.SMALL, LARGE = _layout.LARGE
cdef int64_t ROUND = _layout.ROUND, SMALL_SIZE = _layout.SMALL_SIZE
cdef int64_t LARGE_SEGMENT = _layout.LARGE_SEGMENT, MIN_LARGE_ALLOC = _layout.MIN_LARGE_ALLOC
cdef int64_t ROUND_LARGE = _layout.ROUND_LARGE
cdef int64_t H_FREE_ROW = _layout.H_FREE_ROW, H_CAP = _layout.H_CAP, H_HIGH = _layout.H_HIGH
cdef int64_t H_MAX_SPLIT = _layout.H_MAX_SPLIT, H_GROWTH_OFF = _layout.H_GROWTH_OFF
cdef int64_t H_LARGEST = _layout.H_LARGEST, H_NBYTES = _layout.H_NBYTES
cdef int64_t H_COUNT = _layout.H_COUNT, H_HUGE = _layout.H_HUGE, H_AVAIL = _layout.H_AVAIL
cdef int64_t H_OPEN_HEAD = _layout.H_OPEN_HEAD, H_OPEN_TAIL = _layout.H_OPEN_TAIL
cdef int64_t H_OPEN_COUNT = _layout.H_OPEN_COUNT, H_CARVED_FREE = _layout.H_CARVED_FREE
cdef int64_t H_CARVED_REST = _layout.H_CARVED_REST, H_GEN = _layout.H_GEN
cdef int64_t H_BATCH = _layout.H_BATCH, H_KEEP_WHOLE = _layout.H_KEEP_WHOLE
cdef int64_t H_REUSE_FIRST = _layout.H_REUSE_FIRST, H_SPLIT_RESTS = _layout.H_SPLIT_RESTS
cdef int64_t CBASE = _layout.CBASE, CUR = _layout.CUR, INC = _layout.INC, DEC = _layout.DEC
cdef int64_t PEAK = _layout.PEAK, NFIELD = _layout.NFIELD
cdef int64_t NCLS = _layout.NCLS, NW1 = _layout.NW1, NW2 = _layout.NW2
cdef int64_t BM1 = _layout.BM1, BM2 = _layout.BM2, HEADS = _layout.HEADS
cdef int64_t TABLE = _layout.TABLE, NF = _layout.NF
cdef int64_t ADDR = _layout.ADDR, SIZE = _layout.SIZE, REQ = _layout.REQ
cdef int64_t PREV = _layout.PREV, NEXT = _layout.NEXT, STATE = _layout.STATE
cdef int64_t SEG = _layout.SEG, FPREV = _layout.FPREV, FNEXT = _layout.FNEXT
cdef int64_t KIND = _layout.KIND, PIN = _layout.PIN, PNEXT = _layout.PNEXT, GEN = _layout.GEN
cdef int64_t BIG = _layout.BIG, H_BIG_APART = _layout.H_BIG_APART
cdef int64_t UNUSED = _layout.UNUSED, ALLOCATED = _layout.ALLOCATED
cdef int64_t PENDING = _layout.PENDING, FREE = _layout.FREE
cdef int64_t ROW_BITS = _layout.ROW_BITS, ROW_MASK = _layout.ROW_MASK
cdef int64_t GEN_MASK = _layout.GEN_MASK
cdef int64_t F_ALLOCATED_BYTES = _layout.F_ALLOCATED_BYTES
cdef int64_t F_ACTIVE_BYTES = _layout.F_ACTIVE_BYTES
cdef int64_t F_REQUESTED_BYTES = _layout.F_REQUESTED_BYTES
cdef int64_t F_RESERVED_BYTES = _layout.F_RESERVED_BYTES
cdef int64_t F_INACTIVE_SPLIT_BYTES = _layout.F_INACTIVE_SPLIT_BYTES
cdef int64_t F_ALLOCATION = _layout.F_ALLOCATION, F_ACTIVE = _layout.F_ACTIVE
cdef int64_t F_SEGMENT = _layout.F_SEGMENT, F_INACTIVE_SPLIT = _layout.F_INACTIVE_SPLIT
cdef int64_t F_OVERSIZE_ALLOCATIONS = _layout.F_OVERSIZE_ALLOCATIONS
cdef int64_t F_OVERSIZE_SEGMENTS = _layout.F_OVERSIZE_SEGMENTS

include "core_blocks.pxi"


cdef inline int64_t *_view(int64_t p) noexcept nogil:
    return <int64_t *><uintptr_t>p


# -- taking a block ----------------------------------------------------------
cdef inline int64_t _rounded(int64_t nbytes) noexcept nogil:
    """Bytes of the block a request of ``nbytes`` gets (ROUND for 0)."""
    cdef int64_t size = (nbytes + ROUND - 1) // ROUND * ROUND
    return size if size else ROUND


cdef inline int64_t _own_segment(int64_t size) noexcept nogil:
    """Bytes of the segment a large request of ``size`` bytes would reserve
    under PyTorch's rule (sizes.segment_size(size, fitted=False) for sizes
    above SMALL_SIZE): what keep-whole's slack is counted from."""
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


cdef int64_t _take_of(int64_t *a, int64_t nbytes, int64_t size, int64_t k,
                      int64_t reuse_first) noexcept nogil:
    cdef int64_t row, r
    if a[H_AVAIL] < 1:
        return -2
    row = _fit(a, size, k)
    if row < 0:
        return -1
    r = TABLE + row * NF
    if size > SMALL_SIZE and reuse_first and a[H_OPEN_COUNT] and a[r + SIZE] != size:
        return -3
    if _kept_whole(a, row, size, k):
        return -1
    _index_remove(a, row)
    return _carve(a, row, size, k, nbytes)


cdef inline int64_t _fit(int64_t *a, int64_t size, int64_t k) noexcept nogil:
    """The free row take() carves ``size`` bytes of kind k from, or -1: the
    best fit below _max_run; while H_BIG_APART is set, for a large request
    below MIN_LARGE_ALLOC, the best fit outside big segments."""
    if k == LARGE and size < MIN_LARGE_ALLOC and a[H_BIG_APART]:
        return _best_fit_apart(a, size, k, _max_run(a, size))
    return _best_fit(a, size, k, _max_run(a, size))


cdef int64_t _best_fit_apart(int64_t *a, int64_t size, int64_t k, int64_t limit) noexcept nogil:
    """_best_fit among the free blocks whose BIG is 0: the bins from the
    best fit up, each walked for such a block, then the list of huge
    blocks. Costs a bitmap search per bin that holds only big segments'
    blocks."""
    cdef int64_t s = size
    cdef int64_t row, t
    cdef int64_t best = -1
    cdef int64_t best_size = 0
    while True:
        row = _best_fit(a, s, k, limit)
        if row < 0:
            return -1
        t = a[TABLE + row * NF + SIZE]
        if t >= NCLS << 9:              # past the bins: a huge block
            break
        while row >= 0:                 # the bin's blocks are all t bytes
            if not a[TABLE + row * NF + BIG]:
                return row
            row = a[TABLE + row * NF + FNEXT]
        s = t + ROUND
    row = a[H_HUGE + k]
    while row >= 0:
        t = a[TABLE + row * NF + SIZE]
        if (size <= t < limit and not a[TABLE + row * NF + BIG]
                and (best < 0 or t < best_size)):
            best, best_size = row, t
        row = a[TABLE + row * NF + FNEXT]
    return best


cdef inline bint _kept_whole(int64_t *a, int64_t row, int64_t size, int64_t k) noexcept nogil:
    """Whether free ``row`` stays whole rather than serve ``size`` bytes of
    kind k: while H_KEEP_WHOLE is set (growth on), a wholly free large
    segment more than LARGE_SEGMENT bytes larger than the request's own
    (_own_segment)."""
    cdef int64_t r
    if k != LARGE or not a[H_KEEP_WHOLE] or a[H_GROWTH_OFF]:
        return False
    r = TABLE + row * NF
    return a[r + PREV] < 0 and a[r + NEXT] < 0 and a[r + SIZE] > _own_segment(size) + LARGE_SEGMENT


cdef inline int64_t _take(int64_t *a, int64_t nbytes, int64_t reuse_first) noexcept nogil:
    cdef int64_t size = _rounded(nbytes)
    cdef int64_t k = LARGE if a[H_GROWTH_OFF] or size > SMALL_SIZE else SMALL
    return _take_of(a, nbytes, size, k, reuse_first)


def take(int64_t p, int64_t nbytes):
    """A block of ``nbytes`` (0 <= nbytes < 2**62) carved from the
    best-fitting free block: its ticket; -1 when none fits, -2 when the
    table needs more rows, -3 (with H_REUSE_FIRST set) when a request of
    more than SMALL_SIZE bytes (also in one arena, growth off) would split a
    free block while freed blocks are still open: blocks
    freed since, once their work has completed, may fit better, so the
    pool closes their batch, retires what has completed and takes again
    (on -2 and -3 nothing has changed). While H_KEEP_WHOLE is set, a wholly
    free segment more than LARGE_SEGMENT bytes larger than PyTorch's segment
    for a large request (_own_segment) does not serve it (-1):
    splitting it would leave its free rest stuck behind a live block, where
    a segment of the request's own size keeps the big one whole and
    returnable to the device (the slow path reserves one, returning cached
    free segments to the device first when it must)."""
    cdef int64_t *a = _view(p)
    return _take(a, nbytes, a[H_REUSE_FIRST])


def take_large(int64_t p, int64_t nbytes):
    """take() from the large pool's free blocks, for a small request (at
    most SMALL_SIZE bytes) the small pool can neither serve nor grow for:
    the block is the large pool's."""
    cdef int64_t *a = _view(p)
    return _take_of(a, nbytes, _rounded(nbytes), LARGE, a[H_REUSE_FIRST])


def take_now(int64_t p, int64_t nbytes, bint large):
    """take() (``large``: take_large()) that never answers -3: carves from
    the best fit found even while frees are open."""
    cdef int64_t *a = _view(p)
    if large:
        return _take_of(a, nbytes, _rounded(nbytes), LARGE, 0)
    return _take(a, nbytes, 0)


def take_row(int64_t p, int64_t row, int64_t size, int64_t k, int64_t nbytes):
    """Carve free ``row`` (still in the index) for a ``size``-byte block;
    its ticket (a spare row must exist)."""
    cdef int64_t *a = _view(p)
    _index_remove(a, row)
    return _carve(a, row, size, k, nbytes)


def fits(int64_t p, int64_t size, int64_t k):
    """Whether take() would find a free block for ``size`` bytes of kind k
    (the best fit, outside big segments while H_BIG_APART passes them over,
    and one keep-whole does not keep whole)."""
    cdef int64_t *a = _view(p)
    cdef int64_t row = _fit(a, size, k)
    return row >= 0 and not _kept_whole(a, row, size, k)


# -- freeing -------------------------------------------------------------------
cdef int64_t _release(int64_t *a, int64_t row, int64_t gen) noexcept nogil:
    cdef int64_t r = TABLE + row * NF
    cdef int64_t k, size, tail, count
    if a[r + STATE] != ALLOCATED or a[r + GEN] != gen:
        return 0
    a[r + STATE] = PENDING
    k = a[r + KIND]
    size = a[r + SIZE]
    _down(a, F_ALLOCATION, k, 1)
    _down(a, F_ALLOCATED_BYTES, k, size)
    if size >= a[H_MAX_SPLIT]:
        _down(a, F_OVERSIZE_ALLOCATIONS, LARGE, 1)
    a[r + PNEXT] = -1
    tail = a[H_OPEN_TAIL]
    if tail >= 0:
        a[TABLE + tail * NF + PNEXT] = row
    else:
        a[H_OPEN_HEAD] = row
    a[H_OPEN_TAIL] = row
    count = a[H_OPEN_COUNT] + 1
    a[H_OPEN_COUNT] = count
    return 2 if count >= a[H_BATCH] else 1


def release(int64_t p, int64_t row, int64_t gen):
    """A user's free of the block of ``row`` handed out as generation
    ``gen``: it becomes pending, joins the open frees, and its allocation
    counters drop; 1, or 2 when the open frees now fill a batch. 0 (nothing
    changed) when that block is not allocated."""
    return _release(_view(p), row, gen)


def untake(int64_t p, int64_t row, int64_t gen, int64_t carved_free, int64_t carved_rest,
           int64_t largest):
    """Give back the block of ``row`` handed out as generation ``gen`` and
    never freed, as if it had never been taken: it joins its free
    neighbours and the index at once; the allocation counters and their
    running totals drop back, the split-block running totals lose what its
    carve added (``carved_free``, ``carved_rest``: H_CARVED_FREE and
    H_CARVED_REST read right after that carve) and gain nothing from the
    coalescing (exactly so when nothing changed its neighbours since; else
    they count the difference), largest_alloc_size becomes ``largest``. No
    peak is settled.
    1, or 0 (nothing changed) when that block is not allocated."""
    cdef int64_t *a = _view(p)
    cdef int64_t r = TABLE + row * NF
    cdef int64_t k, size, split, split_bytes, n, i, count, count_net, nbytes, nbytes_net
    cdef int64_t kept[32]                # 2 * (NFIELD - INC) running totals and peaks
    if a[r + STATE] != ALLOCATED or a[r + GEN] != gen:
        return 0
    k = a[r + KIND]
    size = a[r + SIZE]
    _unup(a, F_ALLOCATION, k, 1)
    _unup(a, F_ACTIVE, k, 1)
    _unup(a, F_ALLOCATED_BYTES, k, size)
    _unup(a, F_ACTIVE_BYTES, k, size)
    _unup(a, F_REQUESTED_BYTES, k, a[r + REQ])
    if size >= a[H_MAX_SPLIT]:
        _unup(a, F_OVERSIZE_ALLOCATIONS, LARGE, 1)
    a[H_LARGEST] = largest
    a[r + REQ] = 0
    a[r + PIN] = 0
    split = CBASE + F_INACTIVE_SPLIT * NFIELD
    split_bytes = CBASE + F_INACTIVE_SPLIT_BYTES * NFIELD
    n = NFIELD - INC                     # the running totals and peaks (after the currents)
    for i in range(n):
        kept[i] = a[split + INC + i]
        kept[n + i] = a[split_bytes + INC + i]
    count, count_net = a[split + CUR + k], a[split + INC + k] - a[split + DEC + k]
    nbytes, nbytes_net = a[split_bytes + CUR + k], a[split_bytes + INC + k] - a[split_bytes + DEC + k]
    _coalesce(a, row)
    for i in range(n):
        a[split + INC + i] = kept[i]
        a[split_bytes + INC + i] = kept[n + i]
    if carved_free:
        a[split + DEC + k] -= 1
        a[split_bytes + DEC + k] -= carved_free
    if carved_rest:
        a[split + INC + k] -= 1
        a[split_bytes + INC + k] -= carved_rest
    # what another operation changed meanwhile (its free neighbours were
    # indexed otherwise than they would have been without the block)
    _take_drift(a, split, k, count, count_net)
    _take_drift(a, split_bytes, k, nbytes, nbytes_net)
    return 1


cdef inline void _take_drift(int64_t *a, int64_t base, int64_t k, int64_t current,
                             int64_t net) noexcept nogil:
    """Make family ``base``'s running totals of kind ``k`` count the change
    of its current value since it was ``current`` that their own change
    since their difference was ``net`` does not (relative: a
    reset_accumulated zeroes the totals, not the current value)."""
    cdef int64_t drift = (a[base + CUR + k] - current) - (a[base + INC + k] - a[base + DEC + k]
                                                          - net)
    if drift > 0:
        a[base + INC + k] += drift
    else:
        a[base + DEC + k] -= drift


def close_open(int64_t p):
    """The open frees' first row (their count is H_OPEN_COUNT), which now
    form a batch; the open list is empty again."""
    cdef int64_t *a = _view(p)
    cdef int64_t head = a[H_OPEN_HEAD]
    a[H_OPEN_HEAD] = -1
    a[H_OPEN_TAIL] = -1
    a[H_OPEN_COUNT] = 0
    return head


def retire(int64_t p, int64_t head, int64_t count):
    """Make the ``count`` pending rows linked from ``head`` reusable."""
    cdef int64_t *a = _view(p)
    cdef int64_t row = head
    cdef int64_t r, following, k, j
    for j in range(count):
        r = TABLE + row * NF
        following = a[r + PNEXT]
        k = a[r + KIND]
        _down(a, F_ACTIVE, k, 1)
        _down(a, F_ACTIVE_BYTES, k, a[r + SIZE])
        _down(a, F_REQUESTED_BYTES, k, a[r + REQ])
        a[r + REQ] = 0
        a[r + PIN] = 0
        _coalesce(a, row)
        row = following


# -- reading -------------------------------------------------------------------
def largest(int64_t p):
    """Bytes of the largest free block of either kind, 0 when none."""
    cdef int64_t *a = _view(p)
    cdef int64_t best = 0
    cdef int64_t k, row, w2, w, word
    for k in range(2):
        row = a[H_HUGE + k]
        while row >= 0:
            best = max(best, a[TABLE + row * NF + SIZE])
            row = a[TABLE + row * NF + FNEXT]
        for w2 in range(NW2 - 1, -1, -1):
            if a[BM2 + k * NW2 + w2]:
                for w in range((w2 << 5) + 31, (w2 << 5) - 1, -1):
                    word = a[BM1 + k * NW1 + w]
                    if word:
                        best = max(best, ((w << 5) + 63 - _clz(word)) << 9)
                        break
                break
    return best


# -- segments ----------------------------------------------------------------
def add_segment(int64_t p, int64_t address, int64_t nbytes, int64_t k, bint oversize,
                bint big):
    """Index a new segment's one free block; its row (a spare must exist).
    ``big``: a segment reserved for a request of MIN_LARGE_ALLOC or more."""
    cdef int64_t *a = _view(p)
    cdef int64_t row = _new_row(a)
    cdef int64_t r = TABLE + row * NF
    a[r + BIG] = big
    a[r + ADDR] = address
    a[r + SIZE] = nbytes
    a[r + REQ] = 0
    a[r + PREV] = -1
    a[r + NEXT] = -1
    a[r + SEG] = address
    a[r + KIND] = k
    _up(a, F_SEGMENT, k, 1)
    _up(a, F_RESERVED_BYTES, k, nbytes)
    if oversize:
        _up(a, F_OVERSIZE_SEGMENTS, LARGE, 1)
    _index_add(a, row)
    return row


def segments(int64_t p, int64_t k):
    """Every segment of kind ``k`` (of both kinds when ``k`` is -1) as the
    core knows it: an int64 array of rows (address, bytes, first row), in
    the order of the first rows. A segment's first row is a live row with
    no row before it; its bytes are its rows'. One pass over the table in
    C (defragmentation's view of the pool, instead of a walk over its
    Segment objects)."""
    cdef int64_t *a = _view(p)
    cdef int64_t high = a[H_HIGH], row, r, n = 0, i = 0, nbytes
    for row in range(high):
        r = TABLE + row * NF
        if a[r + STATE] != UNUSED and a[r + PREV] < 0 and (k < 0 or a[r + KIND] == k):
            n += 1
    found_array = np.empty((n, 3), np.int64)
    cdef int64_t[:, ::1] found = found_array
    for row in range(high):
        r = TABLE + row * NF
        if a[r + STATE] != UNUSED and a[r + PREV] < 0 and (k < 0 or a[r + KIND] == k):
            found[i, 0], found[i, 2] = a[r + ADDR], row
            nbytes = 0
            while r >= 0:
                nbytes += a[r + SIZE]
                r = a[r + NEXT]
                if r >= 0:
                    r = TABLE + r * NF
            found[i, 1] = nbytes
            i += 1
    return found_array


def release_segment(int64_t p, int64_t row, int64_t k, int64_t nbytes, bint oversize):
    """Forget a fully free segment whose one free block is ``row``."""
    cdef int64_t *a = _view(p)
    _index_remove(a, row)
    _kill_row(a, row)
    _down(a, F_SEGMENT, k, 1)
    _down(a, F_RESERVED_BYTES, k, nbytes)
    if oversize:
        _down(a, F_OVERSIZE_SEGMENTS, LARGE, 1)


cdef inline int64_t _free_row(int64_t *a, int64_t row, int64_t address, int64_t size,
                              int64_t k, int64_t big) noexcept nogil:
    """Make ``row`` a free block of ``size`` bytes at ``address`` (kind
    ``k``, BIG ``big``), not yet linked nor indexed; its offset in ``a``."""
    cdef int64_t q = TABLE + row * NF
    a[q + ADDR] = address
    a[q + SIZE] = size
    a[q + REQ] = 0
    a[q + STATE] = FREE
    a[q + KIND] = k
    a[q + BIG] = big
    return q


def join(int64_t p, int64_t left, int64_t first):
    """Make the segment whose first row is ``first`` part of the segment
    whose first row is ``left``, which ends where it begins (pages mapped
    beside a segment, expandable.py): its rows take that segment's SEG and
    BIG, and the two free blocks at the seam, if free, become one. One
    segment is counted as freed (neither may be oversize). Returns the row that was the first
    segment's last (the block at the seam when both were free)."""
    cdef int64_t *a = _view(p)
    cdef int64_t last = left
    cdef int64_t l, f, k, nxt
    cdef int64_t row = first
    cdef bint left_free, right_free
    while a[TABLE + last * NF + NEXT] >= 0:
        last = a[TABLE + last * NF + NEXT]
    l, f = TABLE + last * NF, TABLE + first * NF
    k = a[l + KIND]
    left_free, right_free = a[l + STATE] == FREE, a[f + STATE] == FREE
    while row >= 0:
        a[TABLE + row * NF + SEG] = a[l + SEG]
        a[TABLE + row * NF + BIG] = a[l + BIG]
        row = a[TABLE + row * NF + NEXT]
    if left_free:
        _index_remove(a, last)
    if right_free:
        _index_remove(a, first)
    if left_free and right_free:
        a[l + SIZE] += a[f + SIZE]
        nxt = a[f + NEXT]
        _kill_row(a, first)
    else:
        nxt = first
    a[l + NEXT] = nxt
    if nxt >= 0:
        a[TABLE + nxt * NF + PREV] = last
    if left_free:
        _index_add(a, last)
    elif right_free:
        _index_add(a, first)
    _down(a, F_SEGMENT, k, 1)
    return last


def cut(int64_t p, int64_t row, int64_t start, int64_t end):
    """Take ``[start, end)`` out of free ``row``'s block and its segment
    (its pages unmapped, expandable.py), which must keep a block on at
    least one side: what lies above ``end`` becomes a segment at ``end``
    (its rows' SEG). The reserved bytes go down by ``end - start``; one
    segment is counted as allocated when both sides keep blocks. Returns the first
    row of the segment above, -1 when none (a spare row must exist)."""
    cdef int64_t *a = _view(p)
    cdef int64_t r = TABLE + row * NF
    cdef int64_t k = a[r + KIND]
    cdef int64_t low = a[r + ADDR]
    cdef int64_t high = low + a[r + SIZE]
    cdef int64_t prev = a[r + PREV]
    cdef int64_t nxt = a[r + NEXT]
    cdef bint left = start > low
    cdef bint right = end < high
    cdef int64_t tail, head, q, walk
    _index_remove(a, row)
    if left:
        a[r + SIZE] = start - low
        a[r + NEXT] = -1
        tail = row
    else:
        tail = prev
        if prev >= 0:
            a[TABLE + prev * NF + NEXT] = -1
    if right:
        head = _new_row(a) if left else row
        q = _free_row(a, head, end, high - end, k, a[r + BIG])
        a[q + PREV] = -1
        a[q + NEXT] = nxt
        if nxt >= 0:
            a[TABLE + nxt * NF + PREV] = head
    else:
        head = nxt
        if nxt >= 0:
            a[TABLE + nxt * NF + PREV] = -1
        if not left:
            _kill_row(a, row)
    walk = head
    while walk >= 0:
        a[TABLE + walk * NF + SEG] = end
        walk = a[TABLE + walk * NF + NEXT]
    if left:
        _index_add(a, row)
    if right:
        _index_add(a, head)
    _down(a, F_RESERVED_BYTES, k, end - start)
    if tail >= 0 and head >= 0:
        _up(a, F_SEGMENT, k, 1)
    return head


def edges(int64_t p, int64_t first):
    """(bytes of the segment's first block, of its last block), each 0
    when that block is not free; ``first``: the segment's first row."""
    cdef int64_t *a = _view(p)
    cdef int64_t row = first
    cdef int64_t head = a[TABLE + first * NF + SIZE] if a[TABLE + first * NF + STATE] == FREE else 0
    while a[TABLE + row * NF + NEXT] >= 0:
        row = a[TABLE + row * NF + NEXT]
    return head, a[TABLE + row * NF + SIZE] if a[TABLE + row * NF + STATE] == FREE else 0


def free_pages(int64_t p, int64_t first, int64_t page):
    """The whole pages of ``page`` bytes inside the free blocks of the
    segment whose first row is ``first``: (row, start, end) in address
    order, one per free block that holds at least one."""
    cdef int64_t *a = _view(p)
    cdef int64_t row = first
    cdef int64_t low, high
    found = []
    while row >= 0:
        if a[TABLE + row * NF + STATE] == FREE:
            low = (a[TABLE + row * NF + ADDR] + page - 1) // page * page
            high = (a[TABLE + row * NF + ADDR] + a[TABLE + row * NF + SIZE]) // page * page
            if high > low:
                found.append((row, low, high))
        row = a[TABLE + row * NF + NEXT]
    return found


def drop_free(int64_t p, int64_t rp, int64_t m):
    """Take the ``m`` free rows at address ``rp`` (int64) out of the index
    and counters; the rows die."""
    cdef int64_t *a = _view(p)
    cdef int64_t *rows = _view(rp)
    cdef int64_t i
    for i in range(m):
        _index_remove(a, rows[i])
        _kill_row(a, rows[i])


def rebuild(int64_t p, int64_t seg_address, int64_t seg_size, int64_t k, bint big,
            int64_t rp, int64_t m):
    """Relink a ``k``-kind segment (``big``: see add_segment) from the
    ``m`` rows at address ``rp`` (int64), its non-free blocks sorted by
    address (their ADDR/SEG already set; its old free rows dropped by
    drop_free); every row gets the segment's BIG. New free rows fill the
    gaps (spares must exist). Returns the new first row."""
    cdef int64_t *a = _view(p)
    cdef int64_t *rows = _view(rp)
    cdef int64_t head = -1, last = -1, cursor = seg_address
    cdef int64_t end = seg_address + seg_size
    cdef int64_t i, row, start, gap, g
    for i in range(m + 1):
        if i < m:
            row = rows[i]
            start = a[TABLE + row * NF + ADDR]
        else:
            row = -1
            start = end
        if start > cursor:
            gap = _new_row(a)
            g = _free_row(a, gap, cursor, start - cursor, k, big)   # indexed below, once linked
            a[g + SEG] = seg_address
            a[g + PREV] = last
            if last >= 0:
                a[TABLE + last * NF + NEXT] = gap
            else:
                head = gap
            last = gap
        if row >= 0:
            a[TABLE + row * NF + BIG] = big
            a[TABLE + row * NF + PREV] = last
            if last >= 0:
                a[TABLE + last * NF + NEXT] = row
            else:
                head = row
            last = row
            cursor = start + a[TABLE + row * NF + SIZE]
    a[TABLE + last * NF + NEXT] = -1
    row = head
    while row >= 0:
        if a[TABLE + row * NF + STATE] == FREE:
            _index_add(a, row)
        row = a[TABLE + row * NF + NEXT]
    return head


include "core_handles.pxi"
include "core_uses.pxi"
