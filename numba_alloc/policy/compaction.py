"""Planning defragmentation: which live blocks to move where.

Over a plain description of one pool kind's segments, so it is tested
without a device: :func:`plan_hole` in Python, :func:`compaction_plan`
compiled over arrays (a :class:`Layout`). Every move copies a live block into space that is
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

from . import free_ranges
from .evacuation import evacuate


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


def plan_hole(segments, nbytes, max_run=None, max_free=None, whole_over=None):
    """Moves (one phase) that open a free range of at least ``nbytes`` in one
    segment, moving the fewest live bytes: the run of blocks with the least
    live bytes whose live blocks all fit in free space outside it. With
    ``max_run``, the free range opened, joined with the free space beside
    it, must also be shorter than that (a pool may not split a longer free
    block for this request). Free ranges of ``max_free`` bytes or more never
    receive a block (a pool never splits them). With ``whole_over``, a
    segment of more bytes than that which would be left wholly free is no
    hole (the pool keeps it whole: keep_whole_segments). None when no run
    can be cleared (pinned blocks, not enough free space)."""
    gaps, candidates = [], []
    for segment in segments:
        elements = _elements(segment, sorted(segment.live))
        gaps.extend((start, end) for start, end, block in elements if block is None)
        if segment.size >= nbytes:
            # a window holding all its live blocks may leave it wholly free
            kept = whole_over is not None and segment.size > whole_over
            for live, start, end, blocks in _windows(elements, nbytes):
                whole = (segment.address, segment.address + segment.size) \
                    if kept and len(blocks) == len(segment.live) else None
                candidates.append((live, end - start, start, end, blocks, whole))
    total_free = sum(end - start for start, end in gaps)
    largest_free = max((end - start for start, end in gaps), default=0)
    gap_ending = {end: start for start, end in gaps}
    gap_starting = {start: end for start, end in gaps}
    candidates.sort(key=lambda c: c[:3])
    for live, span, start, end, blocks, whole in candidates:
        if not blocks:
            if whole is None and (max_run is None or span < max_run):
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
        if whole is not None and not any(whole[0] <= m.dst < whole[1] for m in moves):
            continue                    # left wholly free: the pool keeps it whole
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


class Layout(NamedTuple):
    """Segments and their live blocks as int64 arrays: segment i lies at
    ``segment_address[i]``, ``segment_size[i]`` bytes, and its live blocks
    are rows ``first[i]`` to ``first[i + 1]`` of ``address``, ``size`` and
    ``fixed`` (1: the block never moves), in address order."""
    segment_address: np.ndarray
    segment_size: np.ndarray
    first: np.ndarray
    address: np.ndarray
    size: np.ndarray
    fixed: np.ndarray

    @classmethod
    def of(cls, segments):
        """The layout of :class:`SegmentMap` s (blocks in any order)."""
        counts = np.array([len(s.live) for s in segments], np.int64)
        first = np.zeros(len(segments) + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        rows = np.array([b for s in segments for b in s.live], np.int64).reshape(-1, 3)
        owner = np.repeat(np.arange(len(segments)), counts)
        rows = rows[np.lexsort((rows[:, 0], owner))]
        return cls(np.array([s.address for s in segments], np.int64),
                   np.array([s.size for s in segments], np.int64), first,
                   rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy())

    def segment_maps(self):
        """The layout as :class:`SegmentMap` s."""
        blocks = list(map(LiveBlock._make, zip(self.address.tolist(), self.size.tolist(),
                                               (self.fixed != 0).tolist())))
        bounds = self.first.tolist()
        return [SegmentMap(address, size, tuple(blocks[bounds[i]:bounds[i + 1]]))
                for i, (address, size) in enumerate(zip(self.segment_address.tolist(),
                                                        self.segment_size.tolist()))]


def plan_compaction(segments, max_phases=8, max_free=None):
    """:func:`compaction_plan` of :class:`SegmentMap` s, its phases as
    lists of :class:`Move`."""
    phases, emptied = compaction_plan(Layout.of(segments), max_phases, max_free)
    return [list(map(Move._make, phase.tolist())) for phase in phases], emptied


def compaction_plan(layout, max_phases=8, max_free=None):
    """Phases of moves that empty whole segments and pack the rest, for a
    :class:`Layout`. Free ranges of ``max_free`` bytes or more never
    receive a block (a pool never splits them).

    Phase one evacuates segments, the least live bytes first, into the
    smallest fitting free ranges of the fullest segments, of those with
    pinned blocks and of those with none, which stay (evacuation.py). Later
    phases slide each staying segment's live blocks, from the top, into the
    lowest free range below them that fits. Returns (phases, emptied
    segment addresses, in the order emptied); a phase is an int64 array of
    rows (src, dst, size). Compiled, O(n log n) in the blocks (_plan).
    """
    n = len(layout.address)
    moves = np.empty((n, 4), np.int64)
    emptied = np.empty(len(layout.segment_address), np.int64)
    limit = -1 if max_free is None or max_free >= 1 << 62 else max_free   # (no range is 2**62 bytes)
    count, nemptied = _plan(*layout, limit, max_phases, moves, emptied)
    moves = moves[:count]
    bounds = np.searchsorted(moves[:, 0], np.arange(max_phases + 1))
    phases = [moves[bounds[k]:bounds[k + 1], 1:] for k in range(max_phases)
              if bounds[k + 1] > bounds[k]]
    return phases, emptied[:nemptied].tolist()


@njit(cache=True)
def _plan(segment_address, segment_size, first, address, size, fixed, max_free, max_phases,
          moves, emptied):
    """compaction_plan's work: writes (phase, src, dst, size) rows to
    ``moves``, phase by phase, and the emptied segments' addresses to
    ``emptied``; returns (moves, emptied) counts."""
    nseg, n = len(segment_address), len(address)
    live = np.zeros(nseg, np.int64)
    any_fixed = np.zeros(nseg, np.bool_)
    most = 0                                    # the most blocks in one segment
    for s in range(nseg):
        most = max(most, first[s + 1] - first[s])
        for i in range(first[s], first[s + 1]):
            live[s] += size[i]
            any_fixed[s] = any_fixed[s] or fixed[i] != 0
    gone = np.zeros(nseg, np.bool_)
    arrival_owner = np.empty(n, np.int64)
    arrival_address = np.empty(n, np.int64)
    arrival_size = np.empty(n, np.int64)
    count, nemptied, narrivals = evacuate(segment_address, segment_size, first, address, size,
                                          max_free, live, any_fixed, most, moves, emptied,
                                          gone, arrival_owner, arrival_address, arrival_size)
    # later phases: each staying segment's slides, its blocks and arrivals in address order
    before = 1 if count else 0
    rounds = max_phases - before
    if rounds <= 0:
        return count, nemptied
    # the arrivals by owner, a counting sort (each segment's table is sorted below)
    arrivals_first = np.zeros(nseg + 1, np.int64)
    for a in range(narrivals):
        arrivals_first[arrival_owner[a] + 1] += 1
    for s in range(nseg):
        arrivals_first[s + 1] += arrivals_first[s]
    order = np.empty(narrivals, np.int64)
    cursor = arrivals_first[:-1].copy()
    for a in range(narrivals):
        order[cursor[arrival_owner[a]]] = a
        cursor[arrival_owner[a]] += 1
    slides = moves[count:]                      # by segment; put in round order below
    nslides = 0
    for s in range(nseg):
        if gone[s]:
            continue
        a_lo, a_hi = arrivals_first[s], arrivals_first[s + 1]
        m = first[s + 1] - first[s] + a_hi - a_lo
        if m == 0:
            continue
        table = np.empty((m, 3), np.int64)
        r = 0
        for i in range(first[s], first[s + 1]):
            table[r, 0], table[r, 1], table[r, 2] = address[i], size[i], fixed[i] != 0
            r += 1
        for j in range(a_lo, a_hi):             # an arrival has moved: it stays
            a = order[j]
            table[r, 0], table[r, 1], table[r, 2] = arrival_address[a], arrival_size[a], 1
            r += 1
        if a_hi > a_lo:
            table[:] = table[np.argsort(table[:, 0], kind="mergesort")]
        nslides += _slide_rounds(table, segment_address[s], segment_address[s] + segment_size[s],
                                 max_free, rounds, slides[nslides:])
    slides[:nslides] = slides[:nslides][free_ranges.stable_order(slides[:nslides, 0])]
    slides[:nslides, 0] += before
    return count + nslides, nemptied


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
