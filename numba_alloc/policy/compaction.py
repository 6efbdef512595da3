"""Planning defragmentation: which live blocks to move where.

Plain Python over a plain description of one pool kind's segments, so it can
be tested without a device. Every move copies a live block into space that is
free when its phase starts; within a phase no destination overlaps another
destination or any source, so one kernel launch can run a whole phase in
parallel without any copy reading bytes another has overwritten. A block
moves at most once per plan and pinned blocks never move, so the bytes a plan
moves never exceed the live bytes.

Sizes and addresses are ints in bytes. Not thread safe; the pool plans under
its lock.
"""

from bisect import bisect_left, insort
from typing import NamedTuple


class LiveBlock(NamedTuple):
    address: int
    size: int
    pinned: bool


class SegmentMap(NamedTuple):
    """A segment and its live blocks (any order); the rest of it is free."""
    address: int
    size: int
    live: tuple


class Move(NamedTuple):
    src: int
    dst: int
    size: int


def _gaps(segment, live_sorted):
    """Free (start, end) ranges of a segment, in address order."""
    gaps, cursor = [], segment.address
    for address, size, _ in live_sorted:
        if address > cursor:
            gaps.append((cursor, address))
        cursor = address + size
    if cursor < segment.address + segment.size:
        gaps.append((cursor, segment.address + segment.size))
    return gaps


class _SortedRanges:
    """Free ranges as tuples (size, start, ...) in sorted order, kept in
    buckets of at most 2 * LOAD (a sorted list of sorted lists, as
    sortedcontainers' SortedList): adding, removing and taking the smallest
    range of at least n bytes cost O(log n + LOAD) instead of a flat list's
    O(n) (1M ranges: one insort moved 8 MB)."""

    LOAD = 512

    def __init__(self, ranges):
        ranges = sorted(ranges)
        load = self.LOAD
        self._lists = [ranges[i:i + load] for i in range(0, len(ranges), load)]
        self._maxes = [bucket[-1] for bucket in self._lists]

    def add(self, item):
        lists, maxes = self._lists, self._maxes
        if not lists:
            lists.append([item])
            maxes.append(item)
            return
        i = min(bisect_left(maxes, item), len(maxes) - 1)
        bucket = lists[i]
        insort(bucket, item)
        maxes[i] = bucket[-1]
        if len(bucket) > 2 * self.LOAD:
            half = self.LOAD
            lists[i:i + 1] = [bucket[:half], bucket[half:]]
            maxes[i:i + 1] = [bucket[half - 1], bucket[-1]]

    def remove(self, item):
        """Remove ``item``, which is there."""
        i = bisect_left(self._maxes, item)
        bucket = self._lists[i]
        del bucket[bisect_left(bucket, item)]
        self._settle(i)

    def take_at_least(self, size):
        """Remove and return the first range of at least ``size`` bytes (the
        smallest such, then the lowest start), or None."""
        probe = (size,)             # sorts before every (size, start, ...)
        i = bisect_left(self._maxes, probe)
        if i == len(self._maxes):
            return None
        bucket = self._lists[i]
        item = bucket.pop(bisect_left(bucket, probe))
        self._settle(i)
        return item

    def _settle(self, i):
        bucket = self._lists[i]
        if bucket:
            self._maxes[i] = bucket[-1]
        else:
            del self._lists[i], self._maxes[i]


class _FreeSpace:
    """Free ranges by size, for best-fit placement: take the smallest range
    that fits, place at its start, keep the rest."""

    def __init__(self, ranges):
        self._ranges = _SortedRanges((end - start, start) for start, end in ranges)

    def place(self, size):
        """Address for ``size`` bytes, or None."""
        taken = self._ranges.take_at_least(size)
        if taken is None:
            return None
        room, start = taken
        if room > size:
            self._ranges.add((room - size, start + size))
        return start


def _pack(blocks, space):
    """Moves placing every block (largest first) into ``space``; None if one
    does not fit. ``space`` is consumed."""
    moves = []
    for block in sorted(blocks, key=lambda b: b.size, reverse=True):
        dst = space.place(block.size)
        if dst is None:
            return None
        moves.append(Move(block.address, dst, block.size))
    return moves


def _elements(segment, live_sorted):
    """(start, end, block or None) for every live block and gap, in order."""
    elements, cursor = [], segment.address
    for block in live_sorted:
        if block.address > cursor:
            elements.append((cursor, block.address, None))
        elements.append((block.address, block.address + block.size, block))
        cursor = block.address + block.size
    if cursor < segment.address + segment.size:
        elements.append((cursor, segment.address + segment.size, None))
    return elements


def _windows(elements, nbytes):
    """(live bytes, start, end, live blocks) for the shortest run of whole
    elements spanning at least ``nbytes`` from each element, skipping runs
    that hold a pinned block."""
    ends = [end for _, end, _ in elements]
    live = [0]
    pinned = [0]
    for _, _, block in elements:
        live.append(live[-1] + (block.size if block else 0))
        pinned.append(pinned[-1] + (1 if block and block.pinned else 0))
    for i, (start, _, _) in enumerate(elements):
        j = bisect_left(ends, start + nbytes, lo=i)
        if j == len(elements):
            return
        if pinned[j + 1] == pinned[i]:
            blocks = [b for _, _, b in elements[i:j + 1] if b is not None]
            yield live[j + 1] - live[i], start, ends[j], blocks


def plan_hole(segments, nbytes, max_run=None, max_free=None):
    """Moves (one phase) that open a free range of at least ``nbytes`` in one
    segment, moving the fewest live bytes: the run of blocks with the least
    live bytes whose live blocks all fit in free space outside it. With
    ``max_run``, the free range opened, joined with the free space beside
    it, must also be shorter than that (a pool may not split a longer free
    block for this request). Free ranges of ``max_free`` bytes or more never
    receive a block (a pool never splits them). None when no run can be
    cleared (pinned blocks, not enough free space)."""
    gaps, candidates = [], []
    for segment in segments:
        elements = _elements(segment, sorted(segment.live))
        gaps.extend((start, end) for start, end, block in elements if block is None)
        if segment.size >= nbytes:
            for live, start, end, blocks in _windows(elements, nbytes):
                candidates.append((live, end - start, start, end, blocks))
    total_free = sum(end - start for start, end in gaps)
    largest_free = max((end - start for start, end in gaps), default=0)
    gap_ending = {end: start for start, end in gaps}
    gap_starting = {start: end for start, end in gaps}
    candidates.sort(key=lambda c: c[:3])
    for live, span, start, end, blocks in candidates:
        if not blocks:
            if max_run is None or span < max_run:
                return []
            continue
        free_outside = total_free - (span - live)
        if free_outside < live or largest_free < max(b.size for b in blocks):
            continue
        space = _FreeSpace([g for g in gaps if (g[1] <= start or g[0] >= end)
                            and (max_free is None or g[1] - g[0] < max_free)])
        moves = _pack(blocks, space)
        if moves is None:
            continue
        if max_run is not None:
            # blocks are packed at the start of a free range: the gap before
            # the hole keeps its unused tail, the gap after joins only if unused
            left, right = gap_ending.get(start, start), gap_starting.get(end, end)
            before = start - left - sum(m.size for m in moves if left <= m.dst < start)
            after = 0 if any(end <= m.dst < right for m in moves) else right - end
            if before + span + after >= max_run:
                continue
        return moves
    return None


def plan_compaction(segments, max_phases=8, max_free=None):
    """Phases of moves that empty whole segments and pack the rest. Free
    ranges of ``max_free`` bytes or more never receive a block (a pool
    never splits them).

    Phase one evacuates segments, the least live bytes first, into the
    smallest fitting free ranges of other segments (a segment that receives
    blocks stays). Later phases slide each staying segment's live blocks,
    from the top, into the lowest free range below them that fits. Returns
    (phases, emptied segment addresses); a phase is a list of :class:`Move`.
    """
    live_sorted = {s.address: sorted(s.live) for s in segments}
    def usable(start, end):
        return max_free is None or end - start < max_free

    free = _SortedRanges((end - start, start, seg.address) for seg in segments
                         for start, end in _gaps(seg, live_sorted[seg.address])
                         if usable(start, end))
    stays, emptied, first = set(), [], []
    for segment in sorted(segments, key=lambda s: sum(b.size for b in s.live)):
        blocks = live_sorted[segment.address]
        if segment.address in stays or not blocks or any(b.pinned for b in blocks):
            continue
        own = [(end - start, start, segment.address)
               for start, end in _gaps(segment, blocks) if usable(start, end)]
        for entry in own:
            free.remove(entry)
        taken = _take_ranges(free, blocks)
        if taken is None:
            for entry in own:
                free.add(entry)
            continue
        emptied.append(segment.address)
        live_sorted[segment.address] = []
        for block, (_, dst, target) in taken:
            first.append(Move(block.address, dst, block.size))
            stays.add(target)
            live_sorted[target].append(LiveBlock(dst, block.size, False))   # sorted below
    for target in stays:
        live_sorted[target].sort()
    phases = [first] if first else []
    moved = {m.dst for m in first}
    while len(phases) < max_phases:
        phase = []
        for segment in segments:
            if segment.address not in emptied:
                phase.extend(_slide(segment, live_sorted, moved, max_free))
        if not phase:
            break
        phases.append(phase)
    return phases, emptied


def _take_ranges(free, blocks):
    """Best-fit every block (largest first) into ``free``, the
    :class:`_SortedRanges` of (size, start, segment) ranges: [(block, range
    taken)], or None, leaving ``free`` as it was, when one does not fit."""
    taken = []
    for block in sorted(blocks, key=lambda b: b.size, reverse=True):
        entry = free.take_at_least(block.size)
        if entry is None:
            _undo(free, taken)
            return None
        size, start, target = entry
        if size > block.size:
            free.add((size - block.size, start + block.size, target))
        taken.append((block, entry))
    return taken


def _undo(free, taken):
    for block, (size, start, target) in reversed(taken):
        if size > block.size:
            free.remove((size - block.size, start + block.size, target))
        free.add((size, start, target))


class _LowestFit:
    """Free ranges in address order, for "the lowest one of at least n
    bytes": a tree of the largest size under each node, so that a query and
    a range's shrinking each take O(log ranges)."""

    def __init__(self, sizes):
        n = 1
        while n < len(sizes):
            n *= 2
        tree = [-1] * (2 * n)           # -1: no range (a query asks for 0 bytes or more)
        tree[n:n + len(sizes)] = sizes
        for i in range(n - 1, 0, -1):
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
        self._n, self._tree = n, tree

    @property
    def largest(self):
        """The largest range's size (-1 when there is none)."""
        return self._tree[1]

    def lowest(self, size):
        """Index of the lowest range of at least ``size`` bytes, or -1."""
        tree = self._tree
        if tree[1] < size:
            return -1
        i = 1
        while i < self._n:
            i = 2 * i if tree[2 * i] >= size else 2 * i + 1
        return i - self._n

    def resize(self, index, size):
        tree, i = self._tree, index + self._n
        tree[i] = size
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2


def _slide(segment, live_sorted, moved, max_free):
    """One phase of moves into the lowest fitting free range below each
    unmoved, unpinned block, from the top; updates ``live_sorted`` and
    ``moved`` (the addresses of blocks that have moved). O(n log n)."""
    blocks = live_sorted[segment.address]
    gaps = [list(g) for g in _gaps(segment, blocks)
            if max_free is None or g[1] - g[0] < max_free]
    fits = _LowestFit([end - start for start, end in gaps])
    moves, kept = [], []
    for block in reversed(blocks):
        address, size, pinned = block
        i = -1
        if size <= fits.largest and not pinned and address not in moved:
            i = fits.lowest(size)
            # the lowest range that fits lies above the block: so does every other
            if gaps[i][1] > address:
                i = -1
        if i < 0:
            kept.append(block)
            continue
        target = gaps[i]
        moves.append(Move(address, target[0], size))
        kept.append(LiveBlock(target[0], size, False))
        target[0] += size
        fits.resize(i, target[1] - target[0])
    kept.reverse()                  # nearly in order already: a cheap sort
    kept.sort()
    live_sorted[segment.address] = kept
    moved.update(m.dst for m in moves)
    return moves
