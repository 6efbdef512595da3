"""Best-fit index of free blocks.

Free blocks are bucketed by exact size (a dict of address -> block per size)
and the distinct sizes are kept in a sorted list. An exact-size hit is a dict
lookup; otherwise ``bisect`` finds the smallest size that fits in
O(log n) comparisons. Adding or removing a block is O(1) unless its size
bucket appears or empties, which inserts into or deletes from the sorted
list (a C-level memmove over the distinct sizes). Not thread safe: the pool
calls it under its lock.
"""

from bisect import bisect_left, insort


class FreeIndex:
    __slots__ = ("_bins", "_sizes", "nbytes", "count")

    def __init__(self):
        self._bins = {}
        self._sizes = []
        self.nbytes = 0
        self.count = 0

    def add(self, block):
        size = block.allocated_size
        bucket = self._bins.get(size)
        if bucket is None:
            bucket = self._bins[size] = {}
            insort(self._sizes, size)
        bucket[block.address] = block
        self.nbytes += size
        self.count += 1

    def remove(self, block):
        size = block.allocated_size
        bucket = self._bins[size]
        del bucket[block.address]
        if not bucket:
            del self._bins[size]
            sizes = self._sizes
            del sizes[bisect_left(sizes, size)]
        self.nbytes -= size
        self.count -= 1

    def best_fit(self, size, limit=None):
        """The size of the smallest free blocks of at least ``size`` bytes and
        below ``limit`` (when given), or 0 when there is none."""
        if size in self._bins:
            return size
        sizes = self._sizes
        i = bisect_left(sizes, size)
        if i == len(sizes):
            return 0
        found = sizes[i]
        if limit is not None and found >= limit:
            return 0
        return found

    def pop(self, size):
        """Remove and return a free block of exactly ``size`` bytes, which
        must exist (as returned by :meth:`best_fit`)."""
        bucket = self._bins[size]
        block = bucket.popitem()[1]
        if not bucket:
            del self._bins[size]
            sizes = self._sizes
            del sizes[bisect_left(sizes, size)]
        self.nbytes -= size
        self.count -= 1
        return block

    def largest(self):
        """Size in bytes of the largest free block, 0 when empty."""
        return self._sizes[-1] if self._sizes else 0
