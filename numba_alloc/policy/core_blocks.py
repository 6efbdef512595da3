"""The compiled core's internals: the view of a core array from its address,
the counters, the rows, the free index (its one gateway in and one out,
which also keep the split-block counters) and block surgery (carve,
coalesce). Compiled lazily, cached on disk; core.py's entry points call
them. Not thread safe: the pool calls the core under its lock."""

from numba import carray, njit, types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from .core_layout import *  # noqa: F403 (the layout the functions are compiled with)


@intrinsic
def _pointer(typingctx, address):
    sig = types.CPointer(types.int64)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int64)))
    return sig, codegen


@njit(cache=True)
def _view(p):
    return carray(_pointer(p), (WHOLE,))


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
