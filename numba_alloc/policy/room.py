"""Making room for a request by moving live blocks: the malloc path's last
resort before out of memory, with the ``defrag`` setting on.

A plan (:class:`Plan`) is made in full, on the layout as it will be,
before anything moves: a hole opened inside a segment; or a compaction
whose emptied segments make room to grow; or a sparse segment's few live
blocks moved into a new, smaller segment; or rounds packing sparse
segments into new tight ones (the cached free segments returned first
when a round's new segment needs their room), after that compaction when
it empties some. Every block moves at most once: the rounds pack only
segments the compaction moves no block into, from the blocks' places
before it (their slides dropped). Under the pool's lock, as every
function here.
"""

from typing import NamedTuple

from . import defrag as _defrag
from .block import LARGE
from .compaction import Move, SegmentMap, plan_hole
from .errors import DefragmentationRefused
from .sizes import SMALL_SEGMENT, SMALL_SIZE, segment_size

# where planning puts a segment not reserved yet (no device address is this high)
FRESH = 1 << 62


def make_room(pool, size, kind, nbytes):
    """The malloc path, once nothing else has made room: when the kind's
    free bytes would hold the request, open a hole in a segment; when no
    hole can be opened, compact, return the emptied segments to the
    device and grow into that memory, if the plan shows that growing
    then fits the limit and the device; failing that, move a segment's few
    live blocks into a new, smaller segment the limit and the device still
    have room for, so that the request fits where they were; failing that,
    pack the live blocks of several sparse segments into new tight ones,
    round by round, returning the emptied segments, until growing fits.
    The carved block, or None when moving cannot help: then nothing has
    moved (unless the device refused a new segment the plan counted on,
    memory another process took meanwhile: the rounds done stay done)."""
    if plan_for(pool, size, kind) is None:      # on the state as it is
        return None
    try:
        _defrag._quiesce_for_moves(pool)
    except DefragmentationRefused as refusal:
        pool._refusal = str(refusal)
        return None
    plan = plan_for(pool, size, kind)           # frees retired, pins taken
    if plan is None:
        return None
    if plan.compaction:
        _defrag._compact(pool, *plan.compaction)
    if plan.hole:
        _defrag._execute(pool, [plan.hole])
    for moves, fresh, fresh_kind, emptied in plan.rounds:
        if (pool.stats.current("reserved_bytes") + fresh > pool._limit
                or pool.backend.memory_info()[0] < fresh):
            for segment in pool._free_segments():       # the plan counts on their room
                pool._release_segment(segment)
        segment = pool._add_segment(fresh, fresh_kind, False)
        if segment is None:
            return None
        try:
            _defrag._execute(pool, [[Move(m.src, m.dst - FRESH + segment.address, m.size)
                             if m.dst >= FRESH else m for m in moves]])
        except BaseException:           # the moves kept their old places: give it back
            pool._release_segment(segment)
            raise
        for address in emptied:
            pool._release_segment(pool._segments[address])
    return (pool._take(nbytes) or pool._grow(size, kind, nbytes)
            or pool._reclaim_and_grow(size, kind, nbytes))


class Plan(NamedTuple):
    """Moves that make room for a request, run in this order: a full
    compaction (phases, emptied segment addresses) or None; a hole's moves
    or None; rounds, each (moves, bytes and kind of a new segment that
    receives blocks at FRESH, addresses of the segments that it empties,
    to return to the device)."""
    compaction: tuple = None
    hole: list = None
    rounds: tuple = ()


def plan_for(pool, size, kind):
    """The :class:`Plan` that would make room for a ``size``-byte block of
    ``kind``, or None: a hole in a segment; else a compaction whose
    emptied segments, returned, make room to grow; else a segment's live
    blocks moved into a new, smaller one; else sparse segments packed into
    new ones, round by round, after that compaction when it empties some."""
    maps = None
    whole_over = pool._kept_whole_above(size, kind)
    if pool._free_bytes(kind) >= size and any(
            seg.size >= size for seg in pool._segments.values() if seg.kind == kind):
        maps = _defrag._segment_maps(pool, kind)
        moves = plan_hole(maps, size, pool._max_run(size), pool._max_split, whole_over)
        if moves:
            return Plan(hole=moves)
    if pool._growth_off:
        return None
    device_free = pool.backend.memory_info()[0]
    released, compaction = 0, None
    if pool._room_after_release(size, pool._free_bytes(), device_free):
        phases, emptied = compaction = _defrag._plan_full_compaction(pool)
        released = sum(pool._segments[address].size for address in emptied)
        if released and pool._room_after_release(size, released, device_free):
            return Plan(compaction=compaction)
    maps = maps if maps is not None else _defrag._segment_maps(pool, kind)
    reserved, cached = pool.stats.current("reserved_bytes"), pool._releasable_bytes()
    large = maps if kind == LARGE else _defrag._segment_maps(pool, LARGE)
    plan = (_plan_into_fresh(pool, size, kind, device_free, maps, whole_over)
            or _plan_repack(pool, size, reserved, device_free, cached, large))
    if plan is None and released:
        plan = _repack_after(pool, size, reserved, device_free, large, compaction)
    return plan


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
    bases = sorted(pool._segments)
    taken = set(emptied) | {_defrag._start_of(bases, move.dst)
                            for phase in phases for move in phase}
    cached = sum(segment.size for segment in pool._free_segments()
                 if segment.address not in taken)      # still free once compacted
    released = sum(pool._segments[address].size for address in emptied)
    rounds = _plan_repack(pool, size, reserved - released, device_free + released, cached,
                          _compacted(large, phases, emptied, settled))
    if rounds is None:
        return None
    packed = {address for *_, gone in rounds.rounds for address in gone}
    phases = [kept for phase in phases
              if (kept := [m for m in phase if _defrag._start_of(bases, m.src) not in packed])]
    return Plan(compaction=(phases, emptied), rounds=rounds.rounds)


def _receivers(maps, phases):
    """Addresses of the segments of ``maps`` that the compaction
    ``phases`` move blocks into from another segment."""
    start_of, bases = _defrag._start_of, sorted(m.address for m in maps)
    ours = {b.address for m in maps for b in m.live}
    return {start_of(bases, move.dst) for phase in phases for move in phase
            if move.src in ours and start_of(bases, move.src) != start_of(bases, move.dst)}


def _compacted(maps, phases, emptied, settled):
    """``maps`` as the rounds after the compaction ``phases`` see them
    (moves of other kinds skipped): the ``emptied`` segments gone; a
    segment the compaction moves blocks into from another with its blocks
    where the compaction leaves them, the moved ones pinned when
    ``settled``; any other as before the compaction (the slides inside it
    are dropped when a round packs it)."""
    start_of, bases = _defrag._start_of, sorted(m.address for m in maps)
    receivers = _receivers(maps, phases)
    blocks = {b.address: b for m in maps for b in m.live}
    for phase in phases:
        for move in phase:
            block = blocks.pop(move.src, None)
            if block is not None:       # one of these maps' (other kinds' are skipped)
                blocks[move.dst] = block._replace(address=move.dst, pinned=settled)
    live = {base: [] for base in receivers}
    for address, block in blocks.items():
        if (base := start_of(bases, address)) in receivers:
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
            fresh = segment_size(max(live + candidate[1], SMALL_SIZE + 1))
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
