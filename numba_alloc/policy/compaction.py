"""Planning defragmentation: which live blocks to move where.

Over a plain description of one pool kind's segments, so it is tested
without a device: :func:`plan_hole` and :func:`plan_gather` in Python,
:func:`compaction_plan` over arrays (a :class:`Layout`), its work compiled
ahead of time (_planner.pyx, with evacuation.pxi and free_ranges.pxi).
Every move copies a live block into space that is free when its phase
starts; within a phase no destination overlaps another destination or any
source, so one kernel launch can run a whole phase in parallel without any
copy reading bytes another has overwritten (a gather's slide over a
block's own bytes is a sequence of such copies, :func:`slide_pieces`). A
block moves at most once per plan and pinned blocks never move, so the
bytes a plan moves never exceed the live bytes.

Sizes and addresses are ints in bytes. Not thread safe; the pool plans under
its lock.
"""

from bisect import bisect_left, insort
from typing import NamedTuple

import numpy as np

from ._planner import plan


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


# the most copies a gather's slides may take (a slide over its own bytes
# goes in pieces, one copy each, one after another)
MAX_SLIDE_COPIES = 64


class Gather(NamedTuple):
    """A segment's free space gathered at its end: first ``opening``
    slides the blocks of the segments that receive some of its blocks in
    their gathered free space; ``evictions`` (one phase) move some of its
    blocks into free space of other segments; then ``slides`` move the
    rest down end to end. A slide moves a block to a lower address of its
    own segment (possibly over its own bytes: :func:`slide_pieces`); the
    slides of a segment are in address order."""
    opening: list
    evictions: list
    slides: list


def slide_pieces(move):
    """The copies, in order, that slide ``move``'s block down to its
    destination when the two overlap: pieces of the distance moved, from
    the lowest, each into bytes the one before has left (a piece never
    overlaps its own destination). One copy when they do not overlap."""
    step = move.src - move.dst
    if step <= 0:
        raise ValueError(f"a slide moves a block down, got {move}")
    if step >= move.size:
        return [move]
    return [Move(move.src + at, move.dst + at, min(step, move.size - at))
            for at in range(0, move.size, step)]


def _copies(slides):
    """How many copies ``slides`` take (len of their slide_pieces)."""
    return sum(-(-m.size // min(m.src - m.dst, m.size)) for m in slides)


def _packed(segment, blocks):
    """Slides putting ``blocks`` (of ``segment``, address order) end to end
    from its start, and where they end."""
    slides, cursor = [], segment.address
    for block in blocks:
        if block.address != cursor:
            slides.append(Move(block.address, cursor, block.size))
        cursor += block.size
    return slides, cursor


class _Space:
    """The free space of one kind's segments as :func:`plan_gather` reads
    it: the free ranges (size, start, segment index), sorted, and the
    segments without pinned blocks, by free bytes, that could gather
    theirs to receive a block (free ranges of ``max_free`` bytes or more,
    and receivers that would gather as much, receive none)."""

    def __init__(self, segments, max_free):
        self.segments = segments
        self.live = [sorted(segment.live) for segment in segments]
        self.free = [segment.size - sum(b.size for b in live)
                     for segment, live in zip(segments, self.live)]
        self.pinned = [any(b.pinned for b in live) for live in self.live]
        ranges = []
        for i, (segment, live) in enumerate(zip(segments, self.live)):
            ranges.extend((end - start, start, i) for start, end, block in _elements(segment, live)
                          if block is None and (max_free is None or end - start < max_free))
        self.ranges = sorted(ranges)
        self.sizes = [size for size, _, _ in self.ranges]
        # gathered, a receiver's free space is one range: below max_free
        self.receivers = sorted((free, i) for i, free in enumerate(self.free)
                                if not self.pinned[i] and 0 < free
                                and (max_free is None or free < max_free))
        self.gathered = {}      # segment index -> (its slides, where its free space starts)

    def gathering(self, i):
        """(slides, free start) that gather segment ``i``'s free space."""
        if i not in self.gathered:
            self.gathered[i] = _packed(self.segments[i], self.live[i])
        return self.gathered[i]

    def evict(self, target, need, budget):
        """(opening, moves) sending the largest blocks of segment
        ``target`` into free space elsewhere until ``need`` bytes have
        left, or None: each block into the smallest free range outside it
        that fits (at the start of what is left of it), else into the
        gathered free space of the segment with the least that fits (its
        slides in ``opening``, at most ``budget`` copies in all)."""
        used, opened, moves, opening = {}, {}, [], []
        for block in sorted(self.live[target], key=lambda b: b.size, reverse=True):
            best = None                 # (room, range index) of a free range
            for j, taken in used.items():
                room = self.ranges[j][0] - taken
                if room >= block.size and (best is None or room < best[0]):
                    best = (room, j)
            i = bisect_left(self.sizes, block.size)
            while i < len(self.ranges) and (best is None or self.ranges[i][0] < best[0]):
                owner = self.ranges[i][2]
                if i not in used and owner != target and owner not in opened:
                    best = (self.ranges[i][0], i)
                    break
                i += 1
            if best is not None:
                j = best[1]
                taken = used.get(j, 0)
                moves.append(Move(block.address, self.ranges[j][1] + taken, block.size))
                used[j] = taken + block.size
            else:
                dst = self._open(block.size, target, used, opened, opening, budget)
                if dst is None:
                    continue
                moves.append(Move(block.address, dst, block.size))
            need -= block.size
            if need <= 0:
                return opening, moves
        return None

    def _open(self, size, target, used, opened, opening, budget):
        """Where a ``size``-byte block goes in a gathered segment's free
        space (one already opened, else the one with the least free bytes
        that fits, none of whose free ranges this eviction uses), or None."""
        best = None
        for i, taken in opened.items():
            room = self.free[i] - taken
            if room >= size and (best is None or room < best[0]):
                best = (room, i)
        if best is None:
            in_use = {self.ranges[j][2] for j in used}
            for free, i in self.receivers[bisect_left(self.receivers, (size, -1)):]:
                if i == target or i in opened or i in in_use:
                    continue
                slides, _ = self.gathering(i)
                if _copies(opening) + _copies(slides) > budget:
                    continue
                opening.extend(slides)
                opened[i] = 0
                best = (free, i)
                break
        if best is None:
            return None
        i = best[1]
        start = self.gathering(i)[1] + opened[i]
        opened[i] += size
        return start


def plan_gather(segments, nbytes, max_run=None, max_free=None, whole_over=None):
    """A :class:`Gather` opening a free range of at least ``nbytes`` at the
    end of one segment, or None: for the segment where it moves the fewest
    bytes, its largest blocks leave until its free bytes reach ``nbytes``
    (each into the smallest free range of another segment that fits it,
    else into the free space of another segment gathered first), and its
    other blocks slide down together. Where :func:`plan_hole` needs a free
    range outside the segment for every block between its free ranges,
    this needs room elsewhere only for the blocks that leave. Segments
    with a pinned block neither gather nor receive; ``max_run``,
    ``max_free`` and ``whole_over`` as plan_hole's. All its slides take at
    most MAX_SLIDE_COPIES copies."""
    space = _Space(segments, max_free)
    best = None
    for t, segment in enumerate(segments):
        if segment.size < nbytes or space.pinned[t]:
            continue
        need = nbytes - space.free[t]
        opening, evictions = [], []
        if need > 0:
            evicted = space.evict(t, need, MAX_SLIDE_COPIES)
            if evicted is None:
                continue
            opening, evictions = evicted
        leaving = {move.src for move in evictions}
        slides, end = _packed(segment, [b for b in space.live[t] if b.address not in leaving])
        if end == segment.address and whole_over is not None and segment.size > whole_over:
            continue                    # left wholly free: the pool keeps it whole
        if max_run is not None and segment.address + segment.size - end >= max_run:
            continue
        if not (slides or opening) or _copies(opening) + _copies(slides) > MAX_SLIDE_COPIES:
            continue                    # nothing to gather (plan_hole's case), or too slow
        cost = sum(m.size for m in opening + evictions + slides)
        if best is None or cost < best[0]:
            best = (cost, Gather(opening, evictions, slides))
    return None if best is None else best[1]


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


def plan_compaction(segments, max_phases=8, max_free=None, charge_free=False):
    """:func:`compaction_plan` of :class:`SegmentMap` s, its phases as
    lists of :class:`Move`."""
    phases, emptied = compaction_plan(Layout.of(segments), max_phases, max_free, charge_free)
    return [list(map(Move._make, phase.tolist())) for phase in phases], emptied


def compaction_plan(layout, max_phases=8, max_free=None, charge_free=False):
    """Phases of moves that empty whole segments and pack the rest, for a
    :class:`Layout`. Free ranges of ``max_free`` bytes or more never
    receive a block (a pool never splits them).

    Phase one evacuates segments, the least live bytes first, into the
    smallest fitting free ranges of the fullest segments, of those with
    pinned blocks and of those with none, which stay (evacuation.pxi). With
    ``charge_free`` (the caller gives back the segments with no live block
    that stay so, or keeps them whole), a segment's blocks go into those
    with none only while their sizes together are below its own. Later
    phases slide each staying segment's live blocks, from the top, into the
    lowest free range below them that fits. Returns (phases, emptied
    segment addresses, in the order emptied); a phase is an int64 array of
    rows (src, dst, size). Compiled (_planner.pyx), O(n log n) in the blocks.
    """
    n = len(layout.address)
    moves = np.empty((n, 4), np.int64)
    emptied = np.empty(len(layout.segment_address), np.int64)
    limit = -1 if max_free is None or max_free >= 1 << 62 else max_free   # (no range is 2**62 bytes)
    count, nemptied = plan(*layout, limit, max_phases, charge_free, moves, emptied)
    moves = moves[:count]
    bounds = np.searchsorted(moves[:, 0], np.arange(max_phases + 1))
    phases = [moves[bounds[k]:bounds[k + 1], 1:] for k in range(max_phases)
              if bounds[k + 1] > bounds[k]]
    return phases, emptied[:nemptied].tolist()
