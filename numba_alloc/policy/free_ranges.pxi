# The compaction planner's best-fit set of free ranges, in (size, start)
# order (included by _planner.pyx; free_ranges.py is its Python face): take
# the smallest range of at least n bytes (the lowest start among equal
# sizes), add a range, remove one, each in O(log n + LOAD). A sorted list of
# sorted buckets, as sortedcontainers' SortedList, in NumPy arrays: a bucket
# holds up to CAPACITY ranges, splits in two when it fills and goes when it
# empties. Ranges are disjoint, so a range's start identifies it; each
# carries an owner (the planner's segment number). Not thread safe.

LOAD = 128                  # ranges per bucket after a split
CAPACITY = 2 * LOAD         # a bucket that reaches this splits
cdef int64_t _LOAD = LOAD, _CAPACITY = CAPACITY


cdef inline bint _less(int64_t size_a, int64_t start_a, int64_t size_b,
                       int64_t start_b) noexcept nogil:
    return size_a < size_b or (size_a == size_b and start_a < start_b)


cdef class FreeRanges:
    """A set of free ranges (size, start, owner), made by :func:`make`."""

    cdef int64_t[:, ::1] sizes, starts, owners     # [bucket id, index]
    cdef int64_t[::1] count                         # ranges in each bucket
    cdef int64_t[::1] ids                           # the bucket id at each position
    cdef int64_t[::1] top_size, top_start           # each position's largest key
    cdef int64_t[::1] spare                         # ids of emptied buckets (a stack)
    cdef int64_t positions, next_id, spare_ids      # buckets in use; ids never used start
                                                    # at next_id; spare ids stacked

    cdef int64_t _position(self, int64_t size, int64_t start) noexcept nogil:
        """The first position whose largest key is at least (size, start)."""
        cdef int64_t lo = 0, hi = self.positions, mid
        while lo < hi:
            mid = (lo + hi) // 2
            if _less(self.top_size[mid], self.top_start[mid], size, start):
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef int64_t _index(self, int64_t b, int64_t size, int64_t start) noexcept nogil:
        """The first index in bucket ``b`` whose key is at least (size, start)."""
        cdef int64_t lo = 0, hi = self.count[b], mid
        while lo < hi:
            mid = (lo + hi) // 2
            if _less(self.sizes[b, mid], self.starts[b, mid], size, start):
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef void _shift(self, int64_t b, int64_t to, int64_t frm, int64_t n) noexcept nogil:
        """Move ``n`` ranges of bucket ``b`` from index ``frm`` to ``to``
        (overlapping: memmove)."""
        if n > 0:
            memmove(&self.sizes[b, to], &self.sizes[b, frm], n * sizeof(int64_t))
            memmove(&self.starts[b, to], &self.starts[b, frm], n * sizeof(int64_t))
            memmove(&self.owners[b, to], &self.owners[b, frm], n * sizeof(int64_t))

    cdef int64_t _new_bucket(self) noexcept nogil:
        if self.spare_ids:
            self.spare_ids -= 1
            return self.spare[self.spare_ids]
        self.next_id += 1
        return self.next_id - 1

    cdef void _open_position(self, int64_t pos, int64_t b) noexcept nogil:
        """Put bucket ``b`` at position ``pos``, moving the later ones up."""
        cdef size_t n = (self.positions - pos) * sizeof(int64_t)
        memmove(&self.ids[pos + 1], &self.ids[pos], n)
        memmove(&self.top_size[pos + 1], &self.top_size[pos], n)
        memmove(&self.top_start[pos + 1], &self.top_start[pos], n)
        self.ids[pos] = b
        self.positions += 1

    cdef void add_range(self, int64_t size, int64_t start, int64_t owner) noexcept nogil:
        """Add the range [start, start + size) of ``owner``."""
        cdef int64_t b, pos, i, upper
        if self.positions == 0:
            b = self._new_bucket()
            self.sizes[b, 0], self.starts[b, 0], self.owners[b, 0] = size, start, owner
            self.count[b] = 1
            self._open_position(0, b)
            self.top_size[0], self.top_start[0] = size, start
            return
        pos = min(self._position(size, start), self.positions - 1)
        b = self.ids[pos]
        i = self._index(b, size, start)
        self._shift(b, i + 1, i, self.count[b] - i)
        self.sizes[b, i], self.starts[b, i], self.owners[b, i] = size, start, owner
        self.count[b] += 1
        if i == self.count[b] - 1:
            self.top_size[pos], self.top_start[pos] = size, start
        if self.count[b] == _CAPACITY:          # split: the upper half to a new bucket
            upper = self._new_bucket()
            memcpy(&self.sizes[upper, 0], &self.sizes[b, _LOAD], _LOAD * sizeof(int64_t))
            memcpy(&self.starts[upper, 0], &self.starts[b, _LOAD], _LOAD * sizeof(int64_t))
            memcpy(&self.owners[upper, 0], &self.owners[b, _LOAD], _LOAD * sizeof(int64_t))
            self.count[b] = _LOAD
            self.count[upper] = _LOAD
            self._open_position(pos + 1, upper)
            self.top_size[pos + 1], self.top_start[pos + 1] = self.top_size[pos], self.top_start[pos]
            self.top_size[pos] = self.sizes[b, _LOAD - 1]
            self.top_start[pos] = self.starts[b, _LOAD - 1]

    cdef void _remove_at(self, int64_t pos, int64_t i) noexcept nogil:
        cdef int64_t b = self.ids[pos]
        cdef size_t n
        self.count[b] -= 1
        self._shift(b, i, i + 1, self.count[b] - i)
        if self.count[b] == 0:                  # the bucket goes
            self.spare[self.spare_ids] = b
            self.spare_ids += 1
            self.positions -= 1
            n = (self.positions - pos) * sizeof(int64_t)
            memmove(&self.ids[pos], &self.ids[pos + 1], n)
            memmove(&self.top_size[pos], &self.top_size[pos + 1], n)
            memmove(&self.top_start[pos], &self.top_start[pos + 1], n)
        elif i == self.count[b]:
            self.top_size[pos] = self.sizes[b, i - 1]
            self.top_start[pos] = self.starts[b, i - 1]

    cdef void remove_range(self, int64_t size, int64_t start) noexcept nogil:
        """Remove the range (size, start), which is in the set."""
        cdef int64_t pos = self._position(size, start)
        self._remove_at(pos, self._index(self.ids[pos], size, start))

    cdef int64_t largest_range(self) noexcept nogil:
        """The size of the largest range (0 when the set is empty)."""
        return self.top_size[self.positions - 1] if self.positions else 0

    cdef bint take_range(self, int64_t size, int64_t *taken) noexcept nogil:
        """Remove the smallest range of at least ``size`` bytes (the lowest
        start among equals) and write its (size, start, owner) to ``taken``;
        False (nothing written) when none is that large."""
        cdef int64_t lo = 0, hi = self.positions, mid, b, i
        while lo < hi:                          # the first bucket holding one
            mid = (lo + hi) // 2
            if self.top_size[mid] < size:
                lo = mid + 1
            else:
                hi = mid
        if lo == self.positions:
            return False
        b = self.ids[lo]
        i = self._index(b, size, -1)            # (size, -1) precedes (size, any start)
        taken[0], taken[1], taken[2] = self.sizes[b, i], self.starts[b, i], self.owners[b, i]
        self._remove_at(lo, i)
        return True

    # -- from Python (tests) ---------------------------------------------------
    def add(self, int64_t size, int64_t start, int64_t owner):
        """Add the range [start, start + size) of ``owner``."""
        self.add_range(size, start, owner)

    def remove(self, int64_t size, int64_t start):
        """Remove the range (size, start), which is in the set."""
        self.remove_range(size, start)

    def largest(self):
        """The size of the largest range (0 when the set is empty)."""
        return self.largest_range()

    def take_at_least(self, int64_t size):
        """Remove the smallest range of at least ``size`` bytes (the lowest
        start among equals): (its size, start, owner), or (-1, -1, -1) when
        none is that large."""
        cdef int64_t taken[3]
        if not self.take_range(size, taken):
            return -1, -1, -1
        return taken[0], taken[1], taken[2]

    def buckets(self):
        """[(size, start, owner) of each bucket, in order], with each
        position's largest key: what the invariants are checked on."""
        cdef int64_t pos, b, i
        return [([(self.sizes[b, i], self.starts[b, i], self.owners[b, i])
                  for i in range(self.count[b])], (self.top_size[pos], self.top_start[pos]))
                for pos in range(self.positions) for b in [self.ids[pos]]]


def make(sizes, starts, owners, int64_t insertions):
    """The set of the ranges given (int64 arrays, disjoint; in any order,
    though one by start saves a sort), with room for ``insertions`` more
    adds over its life."""
    sizes, starts, owners = (np.ascontiguousarray(x, np.int64) for x in (sizes, starts, owners))
    cdef int64_t n = len(sizes)
    order = np.arange(n)
    if n > 1 and (starts[1:] < starts[:-1]).any():
        order = stable_order(starts - starts.min())
    order = order[stable_order(sizes[order])]
    cdef int64_t[::1] by_key = np.ascontiguousarray(order, np.int64)
    cdef const int64_t[::1] size_of = sizes, start_of = starts, owner_of = owners
    # a bucket splits only after LOAD adds to it; one more for an empty set
    cdef int64_t buckets = (n + _LOAD - 1) // _LOAD + insertions // _LOAD + 2
    cdef FreeRanges ranges = FreeRanges.__new__(FreeRanges)
    # left unwritten: a bucket's rows are written before they are read, and
    # the pages of buckets never used are never touched
    ranges.sizes = np.empty((buckets, _CAPACITY), np.int64)
    ranges.starts = np.empty((buckets, _CAPACITY), np.int64)
    ranges.owners = np.empty((buckets, _CAPACITY), np.int64)
    ranges.count = np.zeros(buckets, np.int64)
    ranges.ids = np.zeros(buckets, np.int64)
    ranges.top_size = np.zeros(buckets, np.int64)
    ranges.top_start = np.zeros(buckets, np.int64)
    ranges.spare = np.zeros(buckets, np.int64)
    cdef int64_t b = 0, i, j, m, r
    for i in range(0, n, _LOAD):
        m = min(_LOAD, n - i)
        for j in range(m):
            r = by_key[i + j]
            ranges.sizes[b, j] = size_of[r]
            ranges.starts[b, j] = start_of[r]
            ranges.owners[b, j] = owner_of[r]
        ranges.count[b], ranges.ids[b] = m, b
        ranges.top_size[b], ranges.top_start[b] = ranges.sizes[b, m - 1], ranges.starts[b, m - 1]
        b += 1
    ranges.positions = ranges.next_id = b
    return ranges
