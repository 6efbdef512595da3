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

import numpy as np
from numba import njit


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
    rounds = max_phases - len(phases)
    slid = []                   # per segment: its slides' moves, each a list
    gone = set(emptied)
    for segment in segments:
        if segment.address not in gone and rounds > 0:
            slid.append(_slides(segment, live_sorted[segment.address], moved, max_free,
                                rounds))
    for k in range(rounds):     # phase k: every segment's k-th slide (none: done)
        phase = [move for slides in slid if k < len(slides) for move in slides[k]]
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


def _slides(segment, blocks, moved, max_free, rounds):
    """Up to ``rounds`` slides of a segment (its live ``blocks``, sorted),
    each a list of moves (none after the first without a move): in each,
    every unpinned block that has not moved yet (its address not in
    ``moved``), from the top, goes into the lowest free range below it that
    fits (ranges of ``max_free`` bytes or more excluded). O(n log n) a
    slide, compiled (_slide_rounds)."""
    n = len(blocks)
    table = np.empty((n, 3), np.int64)
    for i, (address, size, pinned) in enumerate(blocks):
        table[i, 0], table[i, 1] = address, size
        table[i, 2] = pinned or address in moved
    out = np.empty((max(n, 1) * rounds, 4), np.int64)
    count = _slide_rounds(table, segment.address, segment.address + segment.size,
                          -1 if max_free is None or max_free >= 1 << 62 else max_free,
                          rounds, out)              # (no range is 2**62 bytes)
    slides = []
    for k, src, dst, size in out[:count].tolist():
        if k == len(slides):
            slides.append([])
        slides[k].append(Move(src, dst, size))
    return slides


@njit(cache=True)
def _slide_rounds(table, start, end, max_free, rounds, out):
    """The slides of _slides over ``table`` (rows address, size, fixed: 1
    for a block that never moves), sorted by address and kept so; writes
    (slide, src, dst, size) rows to ``out``; returns how many. A tree of
    the largest free size under each node finds the lowest range of at
    least n bytes, and takes a range's shrinking, in O(log ranges)."""
    n = table.shape[0]
    count = 0
    gap_start = np.empty(n + 1, np.int64)
    gap_end = np.empty(n + 1, np.int64)
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
        tree = np.full(2 * leaves, -1, np.int64)   # -1: no range
        for g in range(ngaps):
            tree[leaves + g] = gap_end[g] - gap_start[g]
        for node in range(leaves - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
        first = count
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
        if count == first:
            break
        order = np.argsort(table[:, 0], kind="mergesort")
        table[:] = table[order]
    return count
