# The compiled core's internals, included by _core.pyx: the counters, the
# rows, the free index (its one gateway in and one out, which also keep the
# split-block counters) and block surgery (carve, coalesce). ``a`` is the
# core array (int64 *); its layout is core_layout.py's, read into _core.pyx's
# C globals at import. Not thread safe: the pool calls the core under its
# lock.


# -- counters --------------------------------------------------------------
cdef inline void _up(int64_t *a, int64_t f, int64_t k, int64_t amount) noexcept nogil:
    cdef int64_t base = CBASE + f * NFIELD
    a[base + CUR + k] += amount
    a[base + INC + k] += amount


cdef inline void _down(int64_t *a, int64_t f, int64_t k, int64_t amount) noexcept nogil:
    """Settle the family's peaks, then decrease it (see stats.py)."""
    cdef int64_t base = CBASE + f * NFIELD
    cdef int64_t both = a[base + CUR] + a[base + CUR + 1]
    if both > a[base + PEAK + 2]:
        a[base + PEAK + 2] = both
    if a[base + CUR + k] > a[base + PEAK + k]:
        a[base + PEAK + k] = a[base + CUR + k]
    a[base + CUR + k] -= amount
    a[base + DEC + k] += amount


cdef inline void _unup(int64_t *a, int64_t f, int64_t k, int64_t amount) noexcept nogil:
    """Undo an _up: as if it had never happened (no peak is settled)."""
    cdef int64_t base = CBASE + f * NFIELD
    a[base + CUR + k] -= amount
    a[base + INC + k] -= amount


# -- rows ------------------------------------------------------------------
cdef inline int64_t _new_row(int64_t *a) noexcept nogil:
    cdef int64_t row = a[H_FREE_ROW]
    if row >= 0:
        a[H_FREE_ROW] = a[TABLE + row * NF + NEXT]
    else:
        row = a[H_HIGH]
        a[H_HIGH] = row + 1
    a[H_AVAIL] -= 1
    a[TABLE + row * NF + PIN] = 0
    return row


cdef inline void _kill_row(int64_t *a, int64_t row) noexcept nogil:
    cdef int64_t r = TABLE + row * NF
    a[r + STATE] = UNUSED
    a[r + PREV] = -1
    a[r + NEXT] = a[H_FREE_ROW]
    a[H_FREE_ROW] = row
    a[H_AVAIL] += 1


cdef inline bint _is_split(int64_t *a, int64_t r) noexcept nogil:
    return a[r + PREV] >= 0 or a[r + NEXT] >= 0


# -- the free index: the one gateway in and the one out --------------------
cdef void _index_add(int64_t *a, int64_t row) noexcept nogil:
    """Index free ``row``; keeps the split-block counters."""
    cdef int64_t r = TABLE + row * NF
    cdef int64_t k = a[r + KIND]
    cdef int64_t size = a[r + SIZE]
    cdef int64_t c = size >> 9
    cdef int64_t h, head, w
    a[r + STATE] = FREE
    a[r + FPREV] = -1
    if c < NCLS:
        h = HEADS + k * NCLS + c
        head = a[h]
        a[r + FNEXT] = head
        if head >= 0:
            a[TABLE + head * NF + FPREV] = row
        else:
            w = c >> 5
            a[BM1 + k * NW1 + w] |= (<int64_t>1) << (c & 31)
            a[BM2 + k * NW2 + (w >> 5)] |= (<int64_t>1) << (w & 31)
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


cdef void _index_remove(int64_t *a, int64_t row) noexcept nogil:
    """Take free ``row`` out of the index (its state is then the caller's to
    set); keeps the split-block counters."""
    cdef int64_t r = TABLE + row * NF
    cdef int64_t k = a[r + KIND]
    cdef int64_t size = a[r + SIZE]
    cdef int64_t prev = a[r + FPREV]
    cdef int64_t nxt = a[r + FNEXT]
    cdef int64_t c = size >> 9
    cdef int64_t w, word
    if nxt >= 0:
        a[TABLE + nxt * NF + FPREV] = prev
    if prev >= 0:
        a[TABLE + prev * NF + FNEXT] = nxt
    elif c < NCLS:
        a[HEADS + k * NCLS + c] = nxt
        if nxt < 0:
            w = c >> 5
            word = a[BM1 + k * NW1 + w] & ~((<int64_t>1) << (c & 31))
            a[BM1 + k * NW1 + w] = word
            if word == 0:
                a[BM2 + k * NW2 + (w >> 5)] &= ~((<int64_t>1) << (w & 31))
    else:
        a[H_HUGE + k] = nxt
    a[r + STATE] = UNUSED
    a[H_NBYTES + k] -= size
    a[H_COUNT + k] -= 1
    if _is_split(a, r):
        _down(a, F_INACTIVE_SPLIT, k, 1)
        _down(a, F_INACTIVE_SPLIT_BYTES, k, size)


cdef int64_t _best_fit(int64_t *a, int64_t size, int64_t k, int64_t limit) noexcept nogil:
    """The row of a smallest free block of at least ``size`` bytes (newest
    first among equals) and below ``limit`` bytes, or -1."""
    cdef int64_t c = size >> 9
    cdef int64_t found = -1
    cdef int64_t w, w2, word, row, s
    cdef int64_t best = -1
    cdef int64_t best_size = 0
    if c < NCLS:
        w = c >> 5
        word = a[BM1 + k * NW1 + w] & (<int64_t>0xFFFFFFFF ^ (((<int64_t>1) << (c & 31)) - 1))
        if word:
            found = (w << 5) + _ctz(word)
        else:
            w += 1
            if w < NW1:
                w2 = w >> 5
                word = a[BM2 + k * NW2 + w2] & (<int64_t>0xFFFFFFFF ^ (((<int64_t>1) << (w & 31)) - 1))
                while True:
                    if word:
                        w = (w2 << 5) + _ctz(word)
                        found = (w << 5) + _ctz(a[BM1 + k * NW1 + w])
                        break
                    w2 += 1
                    if w2 >= NW2:
                        break
                    word = a[BM2 + k * NW2 + w2]
    if found >= 0:
        if found << 9 >= limit:
            return -1
        return a[HEADS + k * NCLS + found]
    row = a[H_HUGE + k]
    while row >= 0:
        s = a[TABLE + row * NF + SIZE]
        if s >= size and (best < 0 or s < best_size):
            best, best_size = row, s
        row = a[TABLE + row * NF + FNEXT]
    if best < 0 or best_size >= limit:
        return -1
    return best


cdef inline int64_t _max_run(int64_t *a, int64_t size) noexcept nogil:
    """Free blocks of this many bytes or more do not serve ``size`` bytes."""
    cdef int64_t max_split = a[H_MAX_SPLIT]
    return max_split if size < max_split else size + LARGE_SEGMENT


# -- block surgery ----------------------------------------------------------
cdef int64_t _carve(int64_t *a, int64_t row, int64_t size, int64_t k,
                    int64_t nbytes) noexcept nogil:
    """Hand out the first ``size`` bytes of free ``row`` (out of the index)
    as the block of ``row``; the rest stays free in a new row if worth
    keeping (a spare row must exist). Returns the block's ticket."""
    cdef int64_t r = TABLE + row * NF
    cdef int64_t total = a[r + SIZE]
    cdef int64_t rest = total - size
    cdef int64_t max_split = a[H_MAX_SPLIT]
    cdef bint split
    cdef int64_t gen, new, q, nxt, allocated
    if k == SMALL or a[H_GROWTH_OFF]:
        split = rest >= ROUND
    else:
        split = (rest >= ROUND if a[H_SPLIT_RESTS] else rest > SMALL_SIZE) and total < max_split
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
        a[q + BIG] = a[r + BIG]
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


cdef void _coalesce(int64_t *a, int64_t row) noexcept nogil:
    """Free the retired ``row``: it joins a free neighbour (the lower row
    is kept) or becomes a free block, then enters the index."""
    cdef int64_t r = TABLE + row * NF
    cdef int64_t allocated = a[r + SIZE]
    cdef int64_t prev = a[r + PREV]
    cdef int64_t nxt = a[r + NEXT]
    cdef int64_t free, f, after
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
