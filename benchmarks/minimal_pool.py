"""The yardstick for the pool's hot path: a minimal pure-Python best-fit pool.

Same size rules as :class:`numba_alloc.Pool` (512-byte rounding; small
requests up to 1 MiB from 2 MiB segments; large ones from 20 MiB segments
below 10 MiB and from segments of their own size rounded to 2 MiB above;
best fit; split when the rest is at least 512 B in the small pool and more
than 1 MiB in the large pool; coalescing with free neighbours), and nothing
else: no stats, no lock, no pending frees (a free is reusable at once), no
observers, no device (segment addresses are just numbers), no limit.

Its free index is the one a careful pure-Python allocator would use: a dict
of exact-size buckets plus a sorted list of the distinct sizes (``bisect``).
"""

from bisect import bisect_left, insort

KiB, MiB = 1 << 10, 1 << 20
ROUND = 512
SMALL_SIZE = 1 * MiB
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


class _Block:
    __slots__ = ("address", "size", "kind", "prev", "next", "free")

    def __init__(self, address, size, kind, prev, nxt, free):
        self.address = address
        self.size = size
        self.kind = kind
        self.prev = prev
        self.next = nxt
        self.free = free


class _Index:
    __slots__ = ("bins", "sizes")

    def __init__(self):
        self.bins = {}
        self.sizes = []

    def add(self, block):
        bucket = self.bins.get(block.size)
        if bucket is None:
            bucket = self.bins[block.size] = {}
            insort(self.sizes, block.size)
        bucket[block.address] = block

    def remove(self, block):
        size = block.size
        bucket = self.bins[size]
        del bucket[block.address]
        if not bucket:
            del self.bins[size]
            del self.sizes[bisect_left(self.sizes, size)]

    def take(self, size):
        bins = self.bins
        bucket = bins.get(size)
        if bucket is None:
            sizes = self.sizes
            i = bisect_left(sizes, size)
            if i == len(sizes):
                return None
            size = sizes[i]
            bucket = bins[size]
        block = bucket.popitem()[1]
        if not bucket:
            del bins[size]
            del self.sizes[bisect_left(self.sizes, size)]
        return block


class MinimalPool:
    def __init__(self):
        self._index = (_Index(), _Index())
        self._next_address = 1 << 40

    def malloc(self, nbytes):
        size = ((nbytes + ROUND - 1) // ROUND * ROUND) or ROUND
        kind = 1 if size > SMALL_SIZE else 0
        free = self._index[kind].take(size)
        if free is None:
            if kind == 0:
                seg = SMALL_SEGMENT
            elif size < MIN_LARGE_ALLOC:
                seg = LARGE_SEGMENT
            else:
                seg = -(-size // ROUND_LARGE) * ROUND_LARGE
            free = _Block(self._next_address, seg, kind, None, None, True)
            self._next_address += seg
        rest = free.size - size
        if rest >= ROUND if kind == 0 else rest > SMALL_SIZE:
            block = _Block(free.address, size, kind, free.prev, free, False)
            if free.prev is not None:
                free.prev.next = block
            free.prev = block
            free.address += size
            free.size = rest
            self._index[kind].add(free)
            return block
        free.free = False
        return free

    def free(self, block):
        index = self._index[block.kind]
        block.free = True
        prev, nxt = block.prev, block.next
        if prev is not None and prev.free:
            index.remove(prev)
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block.prev = block.next = None
            block = prev
            nxt = block.next
        if nxt is not None and nxt.free:
            index.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            nxt.prev = nxt.next = None
        index.add(block)
