"""Making room for a request by moving live blocks: the malloc path's last
resort before out of memory, with the ``defrag`` setting on.

A plan (:class:`Plan`) is made in full, on the layout as it will be,
before anything moves: a hole opened inside a segment; or one segment's
free space gathered at its end (some blocks out, the rest slid down); or a
compaction
whose emptied segments make room to grow (with expandable segments, whose
free pages, unmapped, may); or a sparse segment's few live
blocks moved into a new, smaller segment; or rounds packing sparse
segments into new tight ones (the cached free segments returned first
when a round's new segment needs their room), after that compaction when
it empties some. Every block moves at most once: the rounds pack only
segments the compaction moves no block into, from the blocks' places
before it (their slides dropped).

Carrying it out, a segment goes back to the device only when a new
segment of the plan needs its room, and only while the device still has
the free memory the plan counted on; the emptied segments left go back
once the request is served. A new segment the limit and the device have
room for is reserved before anything goes back. A request that fails
before memory went back undoes the rounds (their blocks move back, their
new segments go back): the pool's segments and reserved bytes are as
before, only blocks moved. When the device has less free memory than the
plan counted on, or refuses a segment after memory went back for it
(another process took it), the pool plans again on what it now holds,
until the request is served or no plan is left. Under the pool's lock,
as every function here.
"""

from typing import NamedTuple

import numpy as np

from . import defrag as _defrag
from . import moves as _moves
from .block import LARGE
from .compaction import Gather, Move, SegmentMap, plan_hole
from .core import H_GEN, H_HIGH, NF, PIN, TABLE
from .errors import DefragmentationRefused
from .sizes import ROUND_LARGE, SMALL_SEGMENT, SMALL_SIZE, own_segment, segment_size

# where planning puts a segment not reserved yet (no device address is this high)
FRESH = 1 << 62


class Plan(NamedTuple):
    """Moves that make room for a request, run in this order: a full
    compaction (phases, emptied segment addresses) or None; a hole's moves
    or None; a :class:`~numba_alloc.policy.compaction.Gather` or None;
    rounds, each (moves, bytes and kind of a new segment that receives
    blocks at FRESH, addresses of the segments that it empties, to return
    to the device). ``device_free``: the device's free bytes the
    plan counts on (None: it reserves no segment)."""
    compaction: tuple = None
    hole: list = None
    gather: Gather = None
    rounds: tuple = ()
    device_free: int = None


def make_room(pool, size, kind, nbytes):
    """The carved block for a ``size``-byte request of ``kind`` (``nbytes``
    asked), once nothing but moving blocks can serve it, or None: then
    the pool's segments and reserved bytes are as before and only blocks
    have moved, unless memory the plan returned to the device was taken
    by another process before the pool could reserve the segment it
    returned it for and no other plan is left. Raises what moving raises
    (DefragmentationError: the pool stays consistent)."""
    plan = plan_for(pool, size, kind)            # on the state as it is
    if plan is None:
        return None
    # quiescing changes the layout only by retiring pending frees and pinning
    # (possibly bringing a reclaimed block back): the plan stands without them
    before = None if pool._pending else _pins_and_blocks(pool)
    try:
        _defrag._quiesce_for_moves(pool)
    except DefragmentationRefused as refusal:
        pool._refusal = str(refusal)
        return None
    if before is None or _pins_and_blocks(pool) != before:
        plan = plan_for(pool, size, kind)        # frees retired, pins taken
    last = None
    while True:
        if plan is None:
            return None
        now = (pool.stats.current("reserved_bytes"), plan.device_free)
        if last is not None and not _less(now, last):
            return None
        last = now
        block = _carry_out(pool, plan, size, kind, nbytes)
        if block is not _AGAIN:
            return block
        block = pool._take(nbytes) or pool._grow(size, kind, nbytes)    # room enough now?
        if block is not None:
            return block
        plan = plan_for(pool, size, kind)


def _pins_and_blocks(pool):
    """(blocks handed out so far, pins held on the block rows): equal
    before and after a step that frees nothing when it neither pinned nor
    allocated a block."""
    a = pool._core.a
    high = int(a[H_HIGH])
    return int(a[H_GEN]), int(a[TABLE + PIN:TABLE + high * NF:NF].sum())


_AGAIN = object()       # _carry_out's answer: plan again, on the pool as it now is


def _less(now, last):
    """Whether a plan made with ``now`` (the pool's reserved bytes, the
    device's free bytes the plan counts on, None when it reserves
    nothing) comes of less memory than one made with ``last``: so that
    make_room plans again only a finite number of times (a plan that
    reserves nothing ends make_room or returns memory)."""
    return now[0] < last[0] or now[1] is None or last[1] is not None and now[1] < last[1]


def _carry_out(pool, plan, size, kind, nbytes):
    """Run ``plan``: the block; or _AGAIN when the device refused a new
    segment after memory went back to it, or has less free memory than
    the plan counts on; or None, nothing returned to the device (the
    rounds undone)."""
    attempt = _Attempt(pool, plan)
    if plan.compaction:
        phases, emptied = plan.compaction
        _moves.execute(pool, phases)
        attempt.idle += emptied
    if plan.hole:
        _moves.execute(pool, [plan.hole])
    if plan.gather:
        _moves.run_gather(pool, plan.gather)
    block = None
    for moves, fresh, fresh_kind, emptied in plan.rounds:
        segment = attempt.new_segment(fresh, fresh_kind)
        if segment is None:
            break
        moves = [Move(m.src, m.dst - FRESH + segment.address, m.size)
                 if m.dst >= FRESH else m for m in moves]
        try:
            _moves.execute(pool, [moves])
        except BaseException:
            if pool._wholly_free(segment):      # the moves kept their old places: give it back
                pool._release_segment(segment)
            raise                               # else they completed, in it
        attempt.rounds.append((segment, moves))
        attempt.idle += emptied
    else:
        block = pool._take(nbytes)
        if block is None and attempt.may_return(pool.backend.memory_info()[0]):
            block = pool._grow(size, kind, nbytes) or pool._reclaim_and_grow(size, kind, nbytes)
    if block is not None:
        _return_idle(pool, attempt.idle)
        return block
    if attempt.returned:
        return _AGAIN
    changed = not attempt.as_planned(pool.backend.memory_info()[0])
    attempt.undo()
    return _AGAIN if changed else None


class _Attempt:
    """A plan being carried out: ``idle``, the addresses of the segments
    it emptied that are still in the pool; ``rounds``, (new segment, its
    moves as run) of the rounds done."""

    def __init__(self, pool, plan):
        self.pool, self.plan = pool, plan
        self.idle, self.rounds = [], []
        self._frees = pool.stats.num_device_free

    @property
    def returned(self):
        """Whether memory has gone back to the device since it began."""
        return self.pool.stats.num_device_free != self._frees

    def as_planned(self, device_free):
        """Whether the device's ``device_free`` bytes are at least those
        the plan counts on by now (nothing returned yet)."""
        reserved = sum(segment.size for segment, _ in self.rounds)
        return self.plan.device_free is None or device_free >= self.plan.device_free - reserved

    def may_return(self, device_free):
        """Whether memory may go back to the device now: it has already,
        or the device (``device_free`` bytes) is as the plan counted on, so
        that what is returned will be there for the plan's next segment
        (but for what another process takes in between)."""
        return self.returned or self.as_planned(device_free)

    def new_segment(self, nbytes, kind):
        """A new segment of ``nbytes`` for a round, or None: reserved at
        once when the limit and the device have room for it, else once the
        wholly free segments (the idle ones, and those cached before) are
        returned, when that makes room."""
        pool = self.pool
        reserved, device_free = pool.stats.current("reserved_bytes"), pool.backend.memory_info()[0]
        if reserved + nbytes > pool._limit or device_free < nbytes:
            segments = pool._free_segments()
            released = sum(segment.size for segment in segments)
            if (reserved - released + nbytes > pool._limit or device_free + released < nbytes
                    or not self.may_return(device_free)):
                return None
            for segment in segments:
                pool._release_segment(segment)
        return pool._add_segment(nbytes, kind, False)

    def undo(self):
        """Move the rounds' blocks back into the segments they emptied
        (nothing has been returned) and give their new segments back. When
        moving back fails part way (a copy: DefragmentationError), the new
        segments that hold no block are still given back (a round whose
        blocks stayed keeps its segment, counted) and the error is raised."""
        pool, rounds = self.pool, list(reversed(self.rounds))
        try:
            for segment, moves in rounds:
                _moves.execute(pool, [[Move(m.dst, m.src, m.size) for m in moves]])
                pool._release_segment(segment)
        except BaseException:
            for segment, _ in rounds:
                if segment.address in pool._segments and pool._wholly_free(segment):
                    try:
                        pool._release_segment(segment)
                    except Exception:       # noqa: BLE001 - the first error is raised
                        pass
            raise


def _return_idle(pool, idle):
    """Return the emptied segments still in the pool, once the request
    is served: a backend that fails a release ends it there (that segment
    stays, free and counted) and raises nothing."""
    try:
        for address in idle:
            segment = pool._segments.get(address)
            if segment is not None and pool._wholly_free(segment):
                pool._release_segment(segment)
    except Exception:      # noqa: BLE001 - the request is served; as the trim after growing
        pass


def plan_for(pool, size, kind):
    """The :class:`Plan` that would make room for a ``size``-byte block of
    ``kind``, or None: a hole in a segment; else a segment's free space
    gathered; else a compaction whose
    emptied segments, returned, make room to grow (with expandable
    segments, any compaction when the pool's free bytes could make room:
    the free pages it leaves inside runs are unmapped too); else a segment's live
    blocks moved into a new, smaller one; else sparse segments packed into
    new ones, round by round, after that compaction when it empties some."""
    layouts = _Layouts(pool)
    maps = None
    whole_over = pool._kept_whole_above(size, kind)
    if pool._free_bytes(kind) >= size and any(
            seg.size >= size for seg in pool._segments.values() if seg.kind == kind):
        maps = layouts[kind].segment_maps()
        moves, gather = _defrag._room_inside(pool, maps, size, kind)
        if moves:
            return Plan(hole=moves)
        if gather is not None:
            return Plan(gather=gather)
    if pool._growth_off:
        return None
    device_free = pool.backend.memory_info()[0]
    released, compaction = 0, None
    if pool._room_after_release(size, pool._free_bytes(), device_free):
        phases, emptied = compaction = _defrag._plan_full_compaction(pool, layouts=layouts)
        released = sum(pool._segments[address].size for address in emptied)
        if released and pool._room_after_release(size, released, device_free):
            return Plan(compaction=compaction, device_free=device_free)
        if pool._range is not None and phases:
            # expandable segments: growing after it unmaps the whole pages the
            # compaction leaves free inside the runs, not only the runs it
            # empties, so it may make room where no run is emptied
            return Plan(compaction=compaction, device_free=device_free)
    maps = maps if maps is not None else layouts[kind].segment_maps()
    reserved, cached = pool.stats.current("reserved_bytes"), pool._releasable_bytes()
    large = maps if kind == LARGE else layouts[LARGE].segment_maps()
    plan = (_plan_into_fresh(pool, size, kind, device_free, maps, whole_over)
            or _plan_repack(pool, size, reserved, device_free, cached, large))
    if plan is None and released:
        plan = _repack_after(pool, size, reserved, device_free, large, compaction)
    return plan and plan._replace(device_free=device_free)


class _Layouts:
    """The pool's layout of each kind (defrag._layout), made when first
    asked for: one plan reads each once."""

    def __init__(self, pool):
        self._pool, self._made = pool, {}

    def __getitem__(self, kind):
        layout = self._made.get(kind)
        if layout is None:
            layout = self._made[kind] = _defrag._layout(self._pool, kind)
        return layout


def _repack_after(pool, size, reserved, device_free, large, compaction):
    """:func:`_plan_repack`'s rounds after a compaction, as a
    :class:`Plan`, or None. The rounds pack only segments the compaction
    moves no block into (moved once, a block moves no more), from the
    blocks' places before it: their slides are dropped. When the rounds
    would rather pack segments ``compaction`` fills, the compaction is
    planned again without those segments first."""
    plan = _rounds_after(pool, size, reserved, device_free, large, compaction, False)
    if plan is None:
        return None
    filled = _receivers(large, compaction[0]) & {address for *_, gone in plan.rounds
                                                 for address in gone}
    if not filled:
        return plan
    again = _defrag._plan_full_compaction(pool, frozen=filled)
    return (again[1] and _rounds_after(pool, size, reserved, device_free, large, again, True)
            or _rounds_after(pool, size, reserved, device_free, large, compaction, True))


def _rounds_after(pool, size, reserved, device_free, large, compaction, settled):
    """The :class:`Plan` of the ``compaction`` (phases, emptied) and
    :func:`_plan_repack`'s rounds after it over the ``large`` segment
    maps, the slides of the segments they pack dropped, or None. With
    ``settled``, the rounds do not pack a segment the compaction moves
    blocks into; without, they may (the plan is then only a guess)."""
    phases, emptied = compaction
    bases = np.array(sorted(pool._segments), np.int64)
    taken = set(emptied).union(*(_starts(bases, phase[:, 1]).tolist() for phase in phases))
    cached = sum(segment.size for segment in pool._free_segments()
                 if segment.address not in taken)      # still free once compacted
    released = sum(pool._segments[address].size for address in emptied)
    rounds = _plan_repack(pool, size, reserved - released, device_free + released, cached,
                          _compacted(large, phases, emptied, settled))
    if rounds is None:
        return None
    packed = np.array([address for *_, gone in rounds.rounds for address in gone], np.int64)
    phases = [kept for phase in phases
              if len(kept := phase[~np.isin(_starts(bases, phase[:, 0]), packed)])]
    return Plan(compaction=(phases, emptied), rounds=rounds.rounds)


def _starts(bases, addresses):
    """The start, among the sorted segment ``bases`` (an int64 array), of
    the segment holding each of ``addresses``, each at or above the first."""
    return bases[np.searchsorted(bases, addresses, "right") - 1]


def _receivers(maps, phases):
    """Addresses of the segments of ``maps`` that the compaction
    ``phases`` (int64 arrays of rows src, dst, size; those of other kinds
    are skipped) move blocks into from another segment."""
    bases = np.array(sorted(m.address for m in maps), np.int64)
    ours = np.array([b.address for m in maps for b in m.live], np.int64)
    found = set()
    for phase in phases:
        phase = phase[np.isin(phase[:, 0], ours)]
        src, dst = _starts(bases, phase[:, 0]), _starts(bases, phase[:, 1])
        found.update(dst[src != dst].tolist())
    return found


def _compacted(maps, phases, emptied, settled):
    """``maps`` as the rounds after the compaction ``phases`` see them
    (moves of other kinds skipped): the ``emptied`` segments gone; a
    segment the compaction moves blocks into from another with its blocks
    where the compaction leaves them, the moved ones pinned when
    ``settled``; any other as before the compaction (the slides inside it
    are dropped when a round packs it)."""
    bases = np.array(sorted(m.address for m in maps), np.int64)
    receivers = _receivers(maps, phases)
    blocks = {b.address: b for m in maps for b in m.live}
    for phase in phases:
        for src, dst in phase[:, :2].tolist():
            block = blocks.pop(src, None)
            if block is not None:       # one of these maps' (other kinds' are skipped)
                blocks[dst] = block._replace(address=dst, pinned=settled)
    live = {base: [] for base in receivers}
    owners = _starts(bases, np.fromiter(blocks, np.int64, len(blocks))).tolist()
    for base, block in zip(owners, blocks.values()):
        if base in receivers:
            live[base].append(block)
    gone = set(emptied)
    return [SegmentMap(m.address, m.size, tuple(live[m.address])) if m.address in receivers
            else m for m in maps if m.address not in gone]


def _movable(maps):
    """(live bytes, map) of each segment of ``maps`` whose live blocks can
    all move (it has some, none pinned)."""
    return [(sum(b.size for b in m.live), m) for m in maps
            if m.live and not any(b.pinned for b in m.live)]


def _plan_into_fresh(pool, size, kind, device_free, maps, whole_over):
    """A :class:`Plan` of one round: the hole that moving the live blocks
    of the segment that holds the fewest (one at least ``size`` bytes,
    none pinned) into a new segment (at FRESH in the moves) would
    open, when the pool's limit and the device have room for that segment;
    or None. ``maps``: the kind's segments as plan_hole takes them."""
    candidates = [(live, m.address) for live, m in _movable(maps) if m.size >= size]
    if not candidates:
        return None
    live = min(candidates)[0]
    fresh = segment_size(max(live, SMALL_SIZE + 1)) if kind == LARGE else SMALL_SEGMENT
    if (fresh >= pool._max_split or fresh > device_free
            or pool.stats.current("reserved_bytes") + fresh > pool._limit):
        return None
    moves = plan_hole(maps + [SegmentMap(FRESH, fresh, ())], size, pool._max_run(size),
                      pool._max_split, whole_over)
    return Plan(rounds=[(moves, fresh, kind, ())]) if moves else None


def _packed_segment(live):
    """Bytes of a new large segment that receives ``live`` bytes of blocks
    packed end to end and nothing else: ``live`` rounded up to ROUND_LARGE."""
    return max(own_segment(live), ROUND_LARGE)


def _plan_repack(pool, size, reserved, device_free, cached, maps):
    """A :class:`Plan` of rounds: each packs the live blocks of some of
    the large segments ``maps`` (none pinned; most free bytes first) end to
    end into one new segment that the device and the limit have room for
    at that round (a segment that would make it too big is passed over),
    and returns those segments to the device: each round gains room for
    the next, until returning them (and the cached free segments) makes
    room to grow for a ``size``-byte block of either kind. ``reserved``,
    ``device_free``, ``cached``: the pool's reserved bytes, the device's
    free bytes and the bytes of wholly free cached segments before the
    first round (returned first when a new segment needs their room).
    None when rounds cannot get there."""
    candidates = [(m.size - live, live, m.address, m) for live, m in _movable(maps)]
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    need = min(size, segment_size(size))
    rounds = []
    while reserved - cached + need > pool._limit or device_free + cached < need:
        taken, best = [], None      # best: (bytes gained, segments taken, new segment's bytes)
        live = emptied = 0
        for candidate in candidates:
            fresh = _packed_segment(live + candidate[1])
            if (fresh >= pool._max_split or fresh > device_free + cached
                    or reserved - cached + fresh > pool._limit):
                continue                # too big with the others: try a smaller one
            taken.append(candidate)
            live += candidate[1]
            emptied += candidate[3].size
            if best is None or emptied - fresh > best[0]:
                best = (emptied - fresh, len(taken), fresh)
        if best is None or best[0] <= 0:
            return None
        gained, count, fresh = best
        chosen = [m for *_, m in taken[:count]]
        moves, offset = [], FRESH
        for m in chosen:
            for b in sorted(m.live):
                moves.append(Move(b.address, offset, b.size))
                offset += b.size
        rounds.append((moves, fresh, LARGE, [m.address for m in chosen]))
        gone = set(map(id, chosen))
        candidates = [c for c in candidates if id(c[3]) not in gone]
        if fresh > device_free or reserved + fresh > pool._limit:
            reserved, device_free, cached = reserved - cached, device_free + cached, 0
        reserved -= gained
        device_free += gained
    return Plan(rounds=rounds) if rounds else None
