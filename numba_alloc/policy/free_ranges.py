"""A compiled set of free ranges in (size, start) order, for best fit.

The compaction planner's free space: take the smallest range of at least n
bytes (the lowest start among equal sizes), add a range, remove one, each
in O(log n + LOAD). A sorted list of sorted buckets, as sortedcontainers'
SortedList, kept in NumPy arrays so that compiled code can use it: a
bucket holds up to CAPACITY ranges, splits in two when it fills and goes
when it empties. Ranges are disjoint, so a range's start identifies it;
each carries an owner (the planner's segment number).

The set is a tuple of arrays made by :func:`make` and changed in place by
the ``@njit`` functions below. Sizes and starts are int64 bytes. Not
thread safe.
"""

import numpy as np
from numba import njit

LOAD = 128                  # ranges per bucket after a split
CAPACITY = 2 * LOAD         # a bucket that reaches this splits

# meta fields
_POSITIONS = 0              # buckets in use, in key order
_NEXT_ID = 1                # bucket ids never used so far start here
_SPARE_IDS = 2              # ids of emptied buckets, on the spare stack


RADIX_BITS = 11            # a pass of the radix sort: 2048 counters


@njit(cache=True)
def stable_order(keys):
    """The stable argsort of int64 ``keys`` >= 0 (LSD radix sort: a pass of
    RADIX_BITS bits for each significant digit of the largest key, O(n)
    a pass)."""
    n = len(keys)
    order = np.arange(n)
    if n < 2:
        return order
    scratch = np.empty(n, np.int64)
    counts = np.empty((1 << RADIX_BITS) + 1, np.int64)
    mask = (1 << RADIX_BITS) - 1
    largest = keys.max()
    common = 0                  # bits every key has clear, from the lowest
    for i in range(n):
        common |= keys[i]
    shift = 0
    while shift < 62 and common and not (common >> shift) & 1:
        shift += 1
    while shift < 63 and (largest >> shift) > 0:
        counts[:] = 0
        for i in range(n):
            counts[((keys[i] >> shift) & mask) + 1] += 1
        for d in range(1 << RADIX_BITS):
            counts[d + 1] += counts[d]
        for i in range(n):
            r = order[i]
            digit = (keys[r] >> shift) & mask
            scratch[counts[digit]] = r
            counts[digit] += 1
        order, scratch = scratch, order
        shift += RADIX_BITS
    return order


@njit(cache=True)
def make(sizes, starts, owners, insertions):
    """The set of the ranges given (disjoint; in any order, though one by
    start saves a sort), with room for ``insertions`` more adds over its
    life."""
    n = len(sizes)
    order = np.arange(n)
    for i in range(1, n):
        if starts[i] < starts[i - 1]:
            order = stable_order(starts - starts.min())
            break
    order = order[stable_order(sizes[order])]
    # a bucket splits only after LOAD adds to it; one more for an empty set
    buckets = (n + LOAD - 1) // LOAD + insertions // LOAD + 2
    # left unwritten: a bucket's rows are written before they are read, and
    # the pages of buckets never used are never touched
    size = np.empty((buckets, CAPACITY), np.int64)
    start = np.empty((buckets, CAPACITY), np.int64)
    owner = np.empty((buckets, CAPACITY), np.int64)
    count = np.zeros(buckets, np.int64)
    ids = np.zeros(buckets, np.int64)           # bucket id at each position
    top_size = np.zeros(buckets, np.int64)      # each position's largest key
    top_start = np.zeros(buckets, np.int64)
    spare = np.zeros(buckets, np.int64)
    meta = np.zeros(3, np.int64)
    b = 0
    for i in range(0, n, LOAD):
        m = min(LOAD, n - i)
        for j in range(m):
            r = order[i + j]
            size[b, j], start[b, j], owner[b, j] = sizes[r], starts[r], owners[r]
        count[b], ids[b] = m, b
        top_size[b], top_start[b] = size[b, m - 1], start[b, m - 1]
        b += 1
    meta[_POSITIONS], meta[_NEXT_ID] = b, b
    return size, start, owner, count, ids, top_size, top_start, spare, meta


@njit(cache=True)
def _less(size_a, start_a, size_b, start_b):
    return size_a < size_b or (size_a == size_b and start_a < start_b)


@njit(cache=True)
def _position(ranges, size, start):
    """The first position whose largest key is at least (size, start)."""
    top_size, top_start, meta = ranges[5], ranges[6], ranges[8]
    lo, hi = 0, meta[_POSITIONS]
    while lo < hi:
        mid = (lo + hi) // 2
        if _less(top_size[mid], top_start[mid], size, start):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _index(ranges, b, size, start):
    """The first index in bucket ``b`` whose key is at least (size, start)."""
    sizes, starts, count = ranges[0], ranges[1], ranges[3]
    lo, hi = 0, count[b]
    while lo < hi:
        mid = (lo + hi) // 2
        if _less(sizes[b, mid], starts[b, mid], size, start):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _new_bucket(ranges):
    spare, meta = ranges[7], ranges[8]
    if meta[_SPARE_IDS]:
        meta[_SPARE_IDS] -= 1
        return spare[meta[_SPARE_IDS]]
    meta[_NEXT_ID] += 1
    return meta[_NEXT_ID] - 1


@njit(cache=True)
def _open_position(ranges, pos, b):
    """Put bucket ``b`` at position ``pos``, moving the later ones up."""
    ids, top_size, top_start, meta = ranges[4], ranges[5], ranges[6], ranges[8]
    for p in range(meta[_POSITIONS], pos, -1):
        ids[p], top_size[p], top_start[p] = ids[p - 1], top_size[p - 1], top_start[p - 1]
    ids[pos] = b
    meta[_POSITIONS] += 1


@njit(cache=True)
def add(ranges, size, start, owner):
    """Add the range [start, start + size) of ``owner``."""
    sizes, starts, owners, count, ids, top_size, top_start, _, meta = ranges
    if meta[_POSITIONS] == 0:
        b = _new_bucket(ranges)
        sizes[b, 0], starts[b, 0], owners[b, 0], count[b] = size, start, owner, 1
        _open_position(ranges, 0, b)
        top_size[0], top_start[0] = size, start
        return
    pos = min(_position(ranges, size, start), meta[_POSITIONS] - 1)
    b = ids[pos]
    i = _index(ranges, b, size, start)
    for j in range(count[b], i, -1):
        sizes[b, j], starts[b, j], owners[b, j] = sizes[b, j - 1], starts[b, j - 1], owners[b, j - 1]
    sizes[b, i], starts[b, i], owners[b, i] = size, start, owner
    count[b] += 1
    if i == count[b] - 1:
        top_size[pos], top_start[pos] = size, start
    if count[b] == CAPACITY:                    # split: the upper half to a new bucket
        upper = _new_bucket(ranges)
        for j in range(LOAD):
            sizes[upper, j] = sizes[b, LOAD + j]
            starts[upper, j] = starts[b, LOAD + j]
            owners[upper, j] = owners[b, LOAD + j]
        count[b], count[upper] = LOAD, LOAD
        _open_position(ranges, pos + 1, upper)
        top_size[pos + 1], top_start[pos + 1] = top_size[pos], top_start[pos]
        top_size[pos], top_start[pos] = sizes[b, LOAD - 1], starts[b, LOAD - 1]


@njit(cache=True)
def _remove_at(ranges, pos, i):
    sizes, starts, owners, count, ids, top_size, top_start, spare, meta = ranges
    b = ids[pos]
    count[b] -= 1
    for j in range(i, count[b]):
        sizes[b, j], starts[b, j], owners[b, j] = sizes[b, j + 1], starts[b, j + 1], owners[b, j + 1]
    if count[b] == 0:                           # the bucket goes
        spare[meta[_SPARE_IDS]] = b
        meta[_SPARE_IDS] += 1
        meta[_POSITIONS] -= 1
        for p in range(pos, meta[_POSITIONS]):
            ids[p], top_size[p], top_start[p] = ids[p + 1], top_size[p + 1], top_start[p + 1]
    elif i == count[b]:
        top_size[pos], top_start[pos] = sizes[b, i - 1], starts[b, i - 1]


@njit(cache=True)
def remove(ranges, size, start):
    """Remove the range (size, start), which is in the set."""
    pos = _position(ranges, size, start)
    _remove_at(ranges, pos, _index(ranges, ranges[4][pos], size, start))


@njit(cache=True)
def largest(ranges):
    """The size of the largest range (0 when the set is empty)."""
    positions = ranges[8][_POSITIONS]
    return ranges[5][positions - 1] if positions else 0


@njit(cache=True)
def take_at_least(ranges, size):
    """Remove the smallest range of at least ``size`` bytes (the lowest
    start among equals): (its size, start, owner), or (-1, -1, -1) when
    none is that large."""
    sizes, starts, owners, _, ids, top_size, _, _, meta = ranges
    lo, hi = 0, meta[_POSITIONS]
    while lo < hi:                              # the first bucket holding one
        mid = (lo + hi) // 2
        if top_size[mid] < size:
            lo = mid + 1
        else:
            hi = mid
    if lo == meta[_POSITIONS]:
        return -1, -1, -1
    b = ids[lo]
    i = _index(ranges, b, size, -1)             # (size, -1) precedes (size, any start)
    taken = sizes[b, i], starts[b, i], owners[b, i]
    _remove_at(ranges, lo, i)
    return taken
