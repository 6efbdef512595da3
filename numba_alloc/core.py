"""The pool's compiled core: block table, free index and counters in one
NumPy int64 array, operated on by ``@njit(cache=True)`` functions that the
pool calls with the array's address (one integer argument, not an array:
unboxing an array costs more than the work).

Layout:

* a header (free-row stack, capacity, max_split_size, growth off, free-index
  bytes and counts per kind, heads of the lists of huge free blocks, the
  list of open frees, the last carve's record (for untake), the block
  generation, the batch size);
* the counters: per family (numba_alloc.counters.FAMILIES), current, allocated and
  freed per kind, and the peak per kind and for both;
* the free index per kind: exact-size bins (doubly linked through the rows,
  newest first) for sizes below 32 MiB with a two-level bitmap over them,
  and one list for larger free blocks (scanned: they are few);
* the block table: one row of NF int64 fields per block (a row's fields
  share a cache line), rows linked by index in address order within their
  segment, and pending rows linked by PNEXT in the order they were freed.

Block surgery (carve, coalesce, untake, rebuild) and every free-index change (the
gateways ``_index_add``/``_index_remove``, which also keep the split-block
counters) live here. A segment's first row never changes except when
defragmentation rebuilds it: carving keeps the free row for the handed-out
block and puts the rest in a new row; coalescing keeps the lower row.

Compiled lazily (at a pool's first use, never at import), cached on disk:
Numba writes the cache next to this file, or when the package's folder is
read-only in its user-wide fallback (``$NUMBA_CACHE_DIR``, else
``~/.cache/numba``). Not thread safe: the pool calls it under its lock.
"""

import numpy as np
from numba import carray, njit, types
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros
from numba.extending import intrinsic

from .counters import FAMILIES, family_index

SMALL, LARGE = 0, 1
ROUND = 512
SMALL_SIZE = 1 << 20
LARGE_SEGMENT = 20 << 20

# header
H_FREE_ROW = 0        # head of the stack of unused rows (-1: none)
H_CAP = 1             # rows in the table
H_HIGH = 2            # rows ever used (rows >= H_HIGH are unused and not stacked)
H_MAX_SPLIT = 3       # max_split_size in bytes (1 << 62: none)
H_GROWTH_OFF = 4      # 1: every request comes from the large pool (one arena)
H_LARGEST = 5         # largest_alloc_size
H_NBYTES = 6          # + kind: bytes in the free index
H_COUNT = 8           # + kind: blocks in the free index
H_HUGE = 10           # + kind: head of the list of free blocks of >= 32 MiB
H_AVAIL = 12          # rows available without growing
H_OPEN_HEAD = 13      # the freed rows no event covers yet, linked by PNEXT
H_OPEN_TAIL = 14
H_OPEN_COUNT = 15
H_CARVED_FREE = 16    # the last carve: bytes of the free block it took out of the
                      # index when that block was split (counted in inactive_split), else 0
H_CARVED_REST = 17    # the last carve: bytes of the rest it indexed as a free block, else 0
H_GEN = 18            # blocks handed out so far: each block's generation
H_BATCH = 19          # open frees that fill a batch (release() then returns 2)
# counters: per family NFIELD slots
CBASE = 32
CUR, INC, DEC, PEAK = 0, 2, 4, 6
NFIELD = 9
NFAMILIES = len(FAMILIES)
MAX_FAMILIES = 16                 # slots reserved: adding a family moves nothing below
# free index
NCLS = 1 << 16                    # size classes of 512 bytes: below 32 MiB
NW1 = NCLS >> 5                   # 32-bit bitmap words per kind
NW2 = NW1 >> 5
BM1 = CBASE + MAX_FAMILIES * NFIELD
BM2 = BM1 + 2 * NW1
HEADS = BM2 + 2 * NW2
TABLE = HEADS + 2 * NCLS
# block rows
ADDR, SIZE, REQ, PREV, NEXT, STATE, SEG, FPREV, FNEXT, KIND, PIN, PNEXT, GEN = range(13)
NF = 13
UNUSED, ALLOCATED, PENDING, FREE = 0, 1, 2, 3      # STATE
BATCH = 64            # frees an event covers at most (see pending.py)
# a block's ticket (what its handle keeps): its row, and its generation above
# ROW_BITS, so that a handle of a row handed out again is told apart
ROW_BITS = 27
ROW_MASK = (1 << ROW_BITS) - 1
GEN_MASK = (1 << (63 - ROW_BITS)) - 1   # generations wrap: a ticket stays positive

# families: their positions in numba_alloc.counters.FAMILIES. Written out,
# not computed, so that the compiled functions cached on disk cannot disagree
# with the table: Numba's cache follows this file, not counters.py (changing
# the order of the families there means changing these, which a check below
# enforces at import; families added after these need no change here).
F_ALLOCATED_BYTES, F_ACTIVE_BYTES, F_REQUESTED_BYTES, F_RESERVED_BYTES, \
    F_INACTIVE_SPLIT_BYTES, F_ALLOCATION, F_ACTIVE, F_SEGMENT, F_INACTIVE_SPLIT, \
    F_OVERSIZE_ALLOCATIONS, F_OVERSIZE_SEGMENTS = range(11)
_CORE_FAMILIES = ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes",
                  "inactive_split_bytes", "allocation", "active", "segment", "inactive_split",
                  "oversize_allocations", "oversize_segments")
if tuple(family_index(name) for name in _CORE_FAMILIES) != tuple(range(11)) \
        or NFAMILIES > MAX_FAMILIES:
    raise ImportError("numba_alloc.core: its family positions disagree with "
                      "numba_alloc.counters.FAMILIES (or there are more than MAX_FAMILIES)")
_WHOLE = 1 << 40                  # the length _view gives a core (never bounds checked)


def new_state(rows=1024):
    """A fresh core array with room for ``rows`` block rows."""
    a = np.zeros(TABLE + rows * NF, dtype=np.int64)
    a[H_FREE_ROW] = -1
    a[H_CAP] = rows
    a[H_AVAIL] = rows
    a[H_HUGE] = a[H_HUGE + 1] = -1
    a[H_OPEN_HEAD] = a[H_OPEN_TAIL] = -1
    a[H_BATCH] = BATCH
    a[HEADS:TABLE] = -1
    return a


def grown(a, rows):
    """A copy of core array ``a`` with room for at least ``rows`` more rows.
    MemoryError past the ROW_MASK + 1 rows a ticket can name."""
    cap = int(a[H_CAP])
    new_cap = min(max(cap * 2, cap + rows), ROW_MASK + 1)
    if new_cap < cap + rows:
        raise MemoryError(f"the pool's block table is full: {cap} rows, the most a "
                          "block handle can name")
    b = np.zeros(TABLE + new_cap * NF, dtype=np.int64)
    b[:a.shape[0]] = a
    b[H_CAP] = new_cap
    b[H_AVAIL] = a[H_AVAIL] + new_cap - cap
    return b


@intrinsic
def _pointer(typingctx, address):
    sig = types.CPointer(types.int64)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int64)))
    return sig, codegen


@njit(cache=True)
def _view(p):
    return carray(_pointer(p), (_WHOLE,))


@njit(cache=True)
def _rows(p, m):
    return carray(_pointer(p), (m,))


# -- counters --------------------------------------------------------------
@njit(cache=True)
def _up(a, f, k, amount):
    base = CBASE + f * NFIELD
    a[base + CUR + k] += amount
    a[base + INC + k] += amount


@njit(cache=True)
def _down(a, f, k, amount):
    """Settle the family's peaks, then decrease it (see stats.py)."""
    base = CBASE + f * NFIELD
    both = a[base + CUR] + a[base + CUR + 1]
    if both > a[base + PEAK + 2]:
        a[base + PEAK + 2] = both
    if a[base + CUR + k] > a[base + PEAK + k]:
        a[base + PEAK + k] = a[base + CUR + k]
    a[base + CUR + k] -= amount
    a[base + DEC + k] += amount


# -- rows ------------------------------------------------------------------
@njit(cache=True)
def _new_row(a):
    row = a[H_FREE_ROW]
    if row >= 0:
        a[H_FREE_ROW] = a[TABLE + row * NF + NEXT]
    else:
        row = a[H_HIGH]
        a[H_HIGH] = row + 1
    a[H_AVAIL] -= 1
    a[TABLE + row * NF + PIN] = 0
    return row


@njit(cache=True)
def _kill_row(a, row):
    r = TABLE + row * NF
    a[r + STATE] = UNUSED
    a[r + PREV] = -1
    a[r + NEXT] = a[H_FREE_ROW]
    a[H_FREE_ROW] = row
    a[H_AVAIL] += 1


@njit(cache=True)
def _is_split(a, r):
    return a[r + PREV] >= 0 or a[r + NEXT] >= 0


# -- the free index: the one gateway in and the one out --------------------
@njit(cache=True)
def _index_add(a, row):
    """Index free ``row``; keeps the split-block counters."""
    r = TABLE + row * NF
    k = a[r + KIND]
    size = a[r + SIZE]
    a[r + STATE] = FREE
    a[r + FPREV] = -1
    c = size >> 9
    if c < NCLS:
        h = HEADS + k * NCLS + c
        head = a[h]
        a[r + FNEXT] = head
        if head >= 0:
            a[TABLE + head * NF + FPREV] = row
        else:
            w = c >> 5
            a[BM1 + k * NW1 + w] |= 1 << (c & 31)
            a[BM2 + k * NW2 + (w >> 5)] |= 1 << (w & 31)
        a[h] = row
    else:
        head = a[H_HUGE + k]
        a[r + FNEXT] = head
        if head >= 0:
            a[TABLE + head * NF + FPREV] = row
        a[H_HUGE + k] = row
    a[H_NBYTES + k] += size
    a[H_COUNT + k] += 1
    if _is_split(a, r):
        _up(a, F_INACTIVE_SPLIT, k, 1)
        _up(a, F_INACTIVE_SPLIT_BYTES, k, size)


@njit(cache=True)
def _index_remove(a, row):
    """Take free ``row`` out of the index (its state is then the caller's to
    set); keeps the split-block counters."""
    r = TABLE + row * NF
    k = a[r + KIND]
    size = a[r + SIZE]
    prev, nxt = a[r + FPREV], a[r + FNEXT]
    if nxt >= 0:
        a[TABLE + nxt * NF + FPREV] = prev
    c = size >> 9
    if prev >= 0:
        a[TABLE + prev * NF + FNEXT] = nxt
    elif c < NCLS:
        a[HEADS + k * NCLS + c] = nxt
        if nxt < 0:
            w = c >> 5
            word = a[BM1 + k * NW1 + w] & ~(1 << (c & 31))
            a[BM1 + k * NW1 + w] = word
            if word == 0:
                a[BM2 + k * NW2 + (w >> 5)] &= ~(1 << (w & 31))
    else:
        a[H_HUGE + k] = nxt
    a[r + STATE] = UNUSED
    a[H_NBYTES + k] -= size
    a[H_COUNT + k] -= 1
    if _is_split(a, r):
        _down(a, F_INACTIVE_SPLIT, k, 1)
        _down(a, F_INACTIVE_SPLIT_BYTES, k, size)


@njit(cache=True)
def _best_fit(a, size, k, limit):
    """The row of a smallest free block of at least ``size`` bytes (newest
    first among equals) and below ``limit`` bytes, or -1."""
    c = size >> 9
    found = -1
    if c < NCLS:
        w = c >> 5
        word = a[BM1 + k * NW1 + w] & (0xFFFFFFFF ^ ((1 << (c & 31)) - 1))
        if word:
            found = (w << 5) + trailing_zeros(word)
        else:
            w += 1
            if w < NW1:
                w2 = w >> 5
                word = a[BM2 + k * NW2 + w2] & (0xFFFFFFFF ^ ((1 << (w & 31)) - 1))
                while True:
                    if word:
                        w = (w2 << 5) + trailing_zeros(word)
                        found = (w << 5) + trailing_zeros(a[BM1 + k * NW1 + w])
                        break
                    w2 += 1
                    if w2 >= NW2:
                        break
                    word = a[BM2 + k * NW2 + w2]
    if found >= 0:
        if found << 9 >= limit:
            return -1
        return a[HEADS + k * NCLS + found]
    best, best_size = -1, 0
    row = a[H_HUGE + k]
    while row >= 0:
        s = a[TABLE + row * NF + SIZE]
        if s >= size and (best < 0 or s < best_size):
            best, best_size = row, s
        row = a[TABLE + row * NF + FNEXT]
    if best < 0 or best_size >= limit:
        return -1
    return best


@njit(cache=True)
def _max_run(a, size):
    """Free blocks of this many bytes or more do not serve ``size`` bytes."""
    max_split = a[H_MAX_SPLIT]
    return max_split if size < max_split else size + LARGE_SEGMENT


# -- block surgery ----------------------------------------------------------
@njit(cache=True)
def _carve(a, row, size, k, nbytes):
    """Hand out the first ``size`` bytes of free ``row`` (out of the index)
    as the block of ``row``; the rest stays free in a new row if worth
    keeping (a spare row must exist). Returns the block's ticket."""
    r = TABLE + row * NF
    total = a[r + SIZE]
    rest = total - size
    max_split = a[H_MAX_SPLIT]
    if k == SMALL or a[H_GROWTH_OFF]:
        split = rest >= ROUND
    else:
        split = rest > SMALL_SIZE and total < max_split
    a[H_CARVED_FREE] = total if _is_split(a, r) else 0
    a[H_CARVED_REST] = rest if split else 0
    a[r + STATE] = ALLOCATED
    a[r + REQ] = nbytes
    a[r + PIN] = 0
    gen = (a[H_GEN] + 1) & GEN_MASK
    a[H_GEN] = gen
    a[r + GEN] = gen
    if split:
        new = _new_row(a)
        q = TABLE + new * NF
        nxt = a[r + NEXT]
        a[q + ADDR] = a[r + ADDR] + size
        a[q + SIZE] = rest
        a[q + REQ] = 0
        a[q + PREV] = row
        a[q + NEXT] = nxt
        a[q + SEG] = a[r + SEG]
        a[q + KIND] = k
        if nxt >= 0:
            a[TABLE + nxt * NF + PREV] = new
        a[r + NEXT] = new
        a[r + SIZE] = size
        _index_add(a, new)
    allocated = a[r + SIZE]
    _up(a, F_ALLOCATION, k, 1)
    _up(a, F_ACTIVE, k, 1)
    _up(a, F_ALLOCATED_BYTES, k, allocated)
    _up(a, F_ACTIVE_BYTES, k, allocated)
    _up(a, F_REQUESTED_BYTES, k, nbytes)
    if allocated > a[H_LARGEST]:
        a[H_LARGEST] = allocated
    if allocated >= max_split:
        _up(a, F_OVERSIZE_ALLOCATIONS, LARGE, 1)
    return row | (gen << ROW_BITS)


@njit(cache=True)
def _unup(a, f, k, amount):
    """Undo an _up: as if it had never happened (no peak is settled)."""
    base = CBASE + f * NFIELD
    a[base + CUR + k] -= amount
    a[base + INC + k] -= amount


@njit(cache=True)
def _coalesce(a, row):
    """Free the retired ``row``: it joins a free neighbour (the lower row
    is kept) or becomes a free block, then enters the index."""
    r = TABLE + row * NF
    allocated = a[r + SIZE]
    prev, nxt = a[r + PREV], a[r + NEXT]
    if prev >= 0 and a[TABLE + prev * NF + STATE] == FREE:
        _index_remove(a, prev)
        free = prev
        a[TABLE + free * NF + SIZE] += allocated
        _kill_row(a, row)
    else:
        free = row
    f = TABLE + free * NF
    if nxt >= 0 and a[TABLE + nxt * NF + STATE] == FREE:
        _index_remove(a, nxt)
        a[f + SIZE] += a[TABLE + nxt * NF + SIZE]
        after = a[TABLE + nxt * NF + NEXT]
        _kill_row(a, nxt)
        nxt = after
    a[f + NEXT] = nxt
    if nxt >= 0:
        a[TABLE + nxt * NF + PREV] = free
    _index_add(a, free)


# -- what the pool calls (p: the core array's address) ----------------------
@njit(cache=True)
def _take(a, nbytes):
    size = (nbytes + ROUND - 1) // ROUND * ROUND
    if size == 0:
        size = ROUND
    k = LARGE if a[H_GROWTH_OFF] or size > SMALL_SIZE else SMALL
    if a[H_AVAIL] < 1:
        return -2
    row = _best_fit(a, size, k, _max_run(a, size))
    if row < 0:
        return -1
    _index_remove(a, row)
    return _carve(a, row, size, k, nbytes)


@njit(cache=True)
def take(p, nbytes):
    """A block of ``nbytes`` (0 <= nbytes < 2**62) carved from the
    best-fitting free block: its ticket; -1 when none fits, -2 when the
    table needs more rows (then nothing has changed)."""
    return _take(_view(p), nbytes)


@njit(cache=True)
def take_row(p, row, size, k, nbytes):
    """Carve free ``row`` (still in the index) for a ``size``-byte block;
    its ticket (a spare row must exist)."""
    a = _view(p)
    _index_remove(a, row)
    return _carve(a, row, size, k, nbytes)


@njit(cache=True)
def _release(a, row, gen):
    r = TABLE + row * NF
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


@njit(cache=True)
def release(p, row, gen):
    """A user's free of the block of ``row`` handed out as generation
    ``gen``: it becomes pending, joins the open frees, and its allocation
    counters drop; 1, or 2 when the open frees now fill a batch. 0 (nothing
    changed) when that block is not allocated."""
    return _release(_view(p), row, gen)


@njit(cache=True)
def untake(p, row, gen, carved_free, carved_rest, largest):
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
    a = _view(p)
    r = TABLE + row * NF
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
    kept = np.empty(2 * n, np.int64)
    for i in range(n):
        kept[i] = a[split + INC + i]
        kept[n + i] = a[split_bytes + INC + i]
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
    for base in (split, split_bytes):   # what another operation changed meanwhile
        drift = a[base + CUR + k] - (a[base + INC + k] - a[base + DEC + k])
        if drift > 0:                   # (its free neighbours were indexed otherwise
            a[base + INC + k] += drift  # than they would have been without the block)
        else:
            a[base + DEC + k] -= drift
    return 1


@njit(cache=True)
def close_open(p):
    """The open frees' first row (their count is H_OPEN_COUNT), which now
    form a batch; the open list is empty again."""
    a = _view(p)
    head = a[H_OPEN_HEAD]
    a[H_OPEN_HEAD] = a[H_OPEN_TAIL] = -1
    a[H_OPEN_COUNT] = 0
    return head


@njit(cache=True)
def retire(p, head, count):
    """Make the ``count`` pending rows linked from ``head`` reusable."""
    a = _view(p)
    row = head
    for _ in range(count):
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


@njit(cache=True)
def fits(p, size, k):
    """Whether take() would find a free block for ``size`` bytes of kind k."""
    a = _view(p)
    return _best_fit(a, size, k, _max_run(a, size)) >= 0


@njit(cache=True)
def largest(p):
    """Bytes of the largest free block of either kind, 0 when none."""
    a = _view(p)
    best = 0
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
                        best = max(best, ((w << 5) + 63 - leading_zeros(word)) << 9)
                        break
                break
    return best


@njit(cache=True)
def add_segment(p, address, nbytes, k, oversize):
    """Index a new segment's one free block; its row (a spare must exist)."""
    a = _view(p)
    row = _new_row(a)
    r = TABLE + row * NF
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


@njit(cache=True)
def release_segment(p, row, k, nbytes, oversize):
    """Forget a fully free segment whose one free block is ``row``."""
    a = _view(p)
    _index_remove(a, row)
    _kill_row(a, row)
    _down(a, F_SEGMENT, k, 1)
    _down(a, F_RESERVED_BYTES, k, nbytes)
    if oversize:
        _down(a, F_OVERSIZE_SEGMENTS, LARGE, 1)


@njit(cache=True)
def drop_free(p, rp, m):
    """Take the ``m`` free rows at address ``rp`` out of the index and
    counters; the rows die."""
    a = _view(p)
    rows = _rows(rp, m)
    for i in range(m):
        _index_remove(a, rows[i])
        _kill_row(a, rows[i])


@njit(cache=True)
def rebuild(p, seg_address, seg_size, k, rp, m):
    """Relink a ``k``-kind segment from the ``m`` rows at address ``rp``,
    its non-free blocks sorted by address (their ADDR/SEG already set; its
    old free rows dropped by drop_free). New free rows fill the gaps
    (spares must exist). Returns the new first row."""
    a = _view(p)
    rows = _rows(rp, m)
    head, last, cursor = -1, -1, seg_address
    end = seg_address + seg_size
    for i in range(m + 1):
        if i < m:
            row = rows[i]
            start = a[TABLE + row * NF + ADDR]
        else:
            row = -1
            start = end
        if start > cursor:
            gap = _new_row(a)
            g = TABLE + gap * NF
            a[g + ADDR] = cursor
            a[g + SIZE] = start - cursor
            a[g + REQ] = 0
            a[g + SEG] = seg_address
            a[g + KIND] = k
            a[g + STATE] = FREE           # indexed below, once linked
            a[g + PREV] = last
            if last >= 0:
                a[TABLE + last * NF + NEXT] = gap
            else:
                head = gap
            last = gap
        if row >= 0:
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


# compiled on a pool's first use
ENTRY_POINTS = (take, take_row, release, close_open, retire, fits, largest, add_segment,
                release_segment, drop_free, rebuild, untake)
