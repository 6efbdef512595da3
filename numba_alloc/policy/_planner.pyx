# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The defragmentation planner's compiled parts, built ahead of time (Cython,
when the package is installed): the best-fit set of free ranges
(free_ranges.pxi, its Python face free_ranges.py), the evacuation that is
compaction_plan's first phase (evacuation.pxi) and the plan itself, its
later phases sliding blocks down (below). compaction.py is their Python
face. Sizes and addresses are int64 bytes. Nothing is compiled at run time.
Not thread safe; the pool plans under its lock.
"""

import numpy as np

from libc.stdint cimport int64_t
from libc.string cimport memcpy, memmove

RADIX_BITS = 11             # a pass of stable_order's radix sort: 2048 counters
cdef int64_t _RADIX_BITS = RADIX_BITS


# -- sorting ---------------------------------------------------------------------
def stable_order(const int64_t[:] keys):
    """The stable argsort of int64 ``keys`` >= 0 (LSD radix sort: a pass of
    RADIX_BITS bits for each significant digit of the largest key, O(n)
    a pass), as an int64 array."""
    cdef int64_t n = keys.shape[0]
    order_array = np.arange(n, dtype=np.int64)
    if n < 2:
        return order_array
    scratch_array = np.empty(n, np.int64)
    cdef int64_t[::1] order = order_array, scratch = scratch_array, swap
    cdef int64_t[::1] counts = np.empty((1 << _RADIX_BITS) + 1, np.int64)
    cdef int64_t mask = (1 << _RADIX_BITS) - 1
    cdef int64_t largest = 0, common = 0, shift = 0
    cdef int64_t i, d, r, digit
    for i in range(n):
        common |= keys[i]
        if keys[i] > largest:
            largest = keys[i]
    while shift < 62 and common and not (common >> shift) & 1:    # bits every key has clear
        shift += 1
    while shift < 63 and (largest >> shift) > 0:
        counts[:] = 0
        for i in range(n):
            counts[((keys[i] >> shift) & mask) + 1] += 1
        for d in range(1 << _RADIX_BITS):
            counts[d + 1] += counts[d]
        for i in range(n):
            r = order[i]
            digit = (keys[r] >> shift) & mask
            scratch[counts[digit]] = r
            counts[digit] += 1
        swap = order
        order = scratch
        scratch = swap
        shift += _RADIX_BITS
    return np.asarray(order)


cdef void _argsort(const int64_t *key, int64_t *idx, int64_t *tmp, int64_t n) noexcept nogil:
    """Sort idx[:n] (indexes into ``key``) by key, stably: a bottom-up merge
    sort, ``tmp`` the same length as scratch."""
    cdef int64_t width = 1, lo, mid, hi, i, j, k
    cdef int64_t *src = idx
    cdef int64_t *dst = tmp
    cdef int64_t *swap
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if key[src[j]] < key[src[i]]:
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < hi:
                dst[k] = src[j]
                j += 1
                k += 1
            lo += 2 * width
        swap = src
        src = dst
        dst = swap
        width *= 2
    if src != idx:
        for i in range(n):
            idx[i] = src[i]


cdef void _sort_rows(int64_t[:, ::1] table, int64_t m, int64_t[:, ::1] scratch,
                     int64_t[::1] key, int64_t[::1] idx, int64_t[::1] tmp) noexcept nogil:
    """Sort the first ``m`` rows of ``table`` (3 columns) by their column 0,
    stably, through the scratch arrays (at least ``m`` long)."""
    cdef int64_t i, c
    for i in range(m):
        key[i] = table[i, 0]
        idx[i] = i
    _argsort(&key[0], &idx[0], &tmp[0], m)
    for i in range(m):
        for c in range(3):
            scratch[i, c] = table[idx[i], c]
    for i in range(m):
        for c in range(3):
            table[i, c] = scratch[i, c]


include "free_ranges.pxi"
include "evacuation.pxi"


# -- the plan ------------------------------------------------------------------
def plan(const int64_t[::1] segment_address, const int64_t[::1] segment_size,
         const int64_t[::1] first, const int64_t[::1] address, const int64_t[::1] size,
         const int64_t[::1] fixed, int64_t max_free, int64_t max_phases,
         bint charge_free, int64_t[:, ::1] moves, int64_t[::1] emptied):
    """compaction_plan's work over a Layout's arrays: writes (phase, src,
    dst, size) rows to ``moves``, phase by phase, and the emptied segments'
    addresses to ``emptied``; returns (moves, emptied) counts. Phase one is
    the evacuation (evacuation.pxi); each later one slides each staying
    segment's blocks, and the blocks that arrived in it, down (_slide_rounds)."""
    cdef int64_t nseg = segment_address.shape[0], n = address.shape[0]
    cdef int64_t[::1] live = np.zeros(nseg, np.int64)
    cdef unsigned char[::1] any_fixed = np.zeros(nseg, np.uint8)
    cdef int64_t most = 0                       # the most blocks in one segment
    cdef int64_t s, i, j, a, r, m, a_lo, a_hi, count, nemptied, narrivals
    for s in range(nseg):
        most = max(most, first[s + 1] - first[s])
        for i in range(first[s], first[s + 1]):
            live[s] += size[i]
            if fixed[i] != 0:
                any_fixed[s] = 1
    cdef unsigned char[::1] gone = np.zeros(nseg, np.uint8)
    cdef int64_t[::1] arrival_owner = np.empty(n, np.int64)
    cdef int64_t[::1] arrival_address = np.empty(n, np.int64)
    cdef int64_t[::1] arrival_size = np.empty(n, np.int64)
    count, nemptied, narrivals = _evacuate(
        segment_address, segment_size, first, address, size, max_free, live, any_fixed,
        most, charge_free, moves, emptied, gone, arrival_owner, arrival_address, arrival_size)
    # later phases: each staying segment's slides, its blocks and arrivals in address order
    cdef int64_t before = 1 if count else 0
    cdef int64_t rounds = max_phases - before
    if rounds <= 0:
        return count, nemptied
    # the arrivals by owner, a counting sort (each segment's table is sorted below)
    cdef int64_t[::1] arrivals_first = np.zeros(nseg + 1, np.int64)
    for a in range(narrivals):
        arrivals_first[arrival_owner[a] + 1] += 1
    for s in range(nseg):
        arrivals_first[s + 1] += arrivals_first[s]
    cdef int64_t[::1] order = np.empty(max(narrivals, 1), np.int64)
    cdef int64_t[::1] cursor = np.empty(nseg + 1, np.int64)
    for s in range(nseg):
        cursor[s] = arrivals_first[s]
    for a in range(narrivals):
        order[cursor[arrival_owner[a]]] = a
        cursor[arrival_owner[a]] += 1
    # scratch for one segment's table at a time, as long as the longest
    cdef int64_t longest = 1
    for s in range(nseg):
        longest = max(longest, first[s + 1] - first[s] + arrivals_first[s + 1] - arrivals_first[s])
    cdef int64_t[:, ::1] table = np.empty((longest, 3), np.int64)
    cdef int64_t[:, ::1] rows = np.empty((longest, 3), np.int64)
    cdef int64_t[::1] key = np.empty(longest, np.int64)
    cdef int64_t[::1] idx = np.empty(longest, np.int64)
    cdef int64_t[::1] tmp = np.empty(longest, np.int64)
    cdef int64_t[::1] gap_start = np.empty(longest + 1, np.int64)
    cdef int64_t[::1] gap_end = np.empty(longest + 1, np.int64)
    cdef int64_t leaves = 1
    while leaves < longest + 1:
        leaves *= 2
    cdef int64_t[::1] tree = np.empty(2 * leaves, np.int64)
    cdef int64_t[:, ::1] slides = moves[count:]     # by segment; put in round order below
    cdef int64_t nslides = 0
    for s in range(nseg):
        if gone[s]:
            continue
        a_lo, a_hi = arrivals_first[s], arrivals_first[s + 1]
        m = first[s + 1] - first[s] + a_hi - a_lo
        if m == 0:
            continue
        r = 0
        for i in range(first[s], first[s + 1]):
            table[r, 0], table[r, 1], table[r, 2] = address[i], size[i], fixed[i] != 0
            r += 1
        for j in range(a_lo, a_hi):             # an arrival has moved: it stays
            a = order[j]
            table[r, 0], table[r, 1], table[r, 2] = arrival_address[a], arrival_size[a], 1
            r += 1
        if a_hi > a_lo:
            _sort_rows(table, m, rows, key, idx, tmp)
        nslides += _slide_rounds(table, m, segment_address[s],
                                 segment_address[s] + segment_size[s], max_free, rounds,
                                 slides[nslides:], gap_start, gap_end, tree,
                                 rows, key, idx, tmp)
    if nslides:
        moves_array = np.asarray(slides)
        moves_array[:nslides] = moves_array[:nslides][stable_order(moves_array[:nslides, 0])]
        moves_array[:nslides, 0] += before
    return count + nslides, nemptied


cdef int64_t _slide_rounds(int64_t[:, ::1] table, int64_t n, int64_t start, int64_t end,
                           int64_t max_free, int64_t rounds, int64_t[:, ::1] out,
                           int64_t[::1] gap_start, int64_t[::1] gap_end, int64_t[::1] tree,
                           int64_t[:, ::1] rows, int64_t[::1] key, int64_t[::1] idx,
                           int64_t[::1] tmp) noexcept nogil:
    """The slides of the first ``n`` rows of ``table`` (address, size,
    fixed: 1 for a block that never moves), sorted by address and kept so,
    round after round: each movable block, from the top, into the lowest
    free range below it that fits; writes (round, src, dst, size) rows to
    ``out``; returns how many. A tree of the largest free size under each
    node finds the lowest range of at least n bytes, and takes a range's
    shrinking, in O(log ranges). The other arrays are scratch."""
    cdef int64_t count = 0
    cdef int64_t k, ngaps, cursor, i, leaves, g, node, size, before_round
    for k in range(rounds):
        ngaps, cursor = 0, start
        for i in range(n):
            if table[i, 0] > cursor and (max_free < 0 or table[i, 0] - cursor < max_free):
                gap_start[ngaps], gap_end[ngaps] = cursor, table[i, 0]
                ngaps += 1
            cursor = table[i, 0] + table[i, 1]
        if cursor < end and (max_free < 0 or end - cursor < max_free):
            gap_start[ngaps], gap_end[ngaps] = cursor, end
            ngaps += 1
        leaves = 1
        while leaves < ngaps:
            leaves *= 2
        for node in range(2 * leaves):
            tree[node] = -1                     # -1: no range
        for g in range(ngaps):
            tree[leaves + g] = gap_end[g] - gap_start[g]
        for node in range(leaves - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
        before_round = count
        for i in range(n - 1, -1, -1):
            size = table[i, 1]
            if table[i, 2] or size > tree[1]:
                continue
            node = 1
            while node < leaves:
                node = 2 * node if tree[2 * node] >= size else 2 * node + 1
            g = node - leaves
            # the lowest range that fits lies above the block: so does every other
            if gap_end[g] > table[i, 0]:
                continue
            out[count, 0], out[count, 1], out[count, 2], out[count, 3] = \
                k, table[i, 0], gap_start[g], size
            count += 1
            table[i, 0], table[i, 2] = gap_start[g], 1
            gap_start[g] += size
            tree[node] = gap_end[g] - gap_start[g]
            node //= 2
            while node:
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
                node //= 2
        if count == before_round:
            break
        _sort_rows(table, n, rows, key, idx, tmp)
    return count
