"""Making room by moving live blocks in segments of mapped pages (the
expandable_segments setting, expandable.py), with the ``defrag`` setting on:
the malloc path's try before room.py's plans. Sliding each segment's blocks
down to its start leaves its free bytes in whole pages at its end, which
go back to the device; the request then maps its own pages. When that is
not enough, the runs first move together by remapping their pages (no
bytes copied), so that the slides pack across them, and the small pool's
blocks leave the segments that hold the fewest, which go back. Under the
pool's lock, as every function here.
"""

import bisect

import numpy as np

from . import defrag as _defrag
from . import moves as _moves
from .block import LARGE, SMALL
from .compaction import Layout, Move, compaction_plan
from .errors import DefragmentationError, DefragmentationRefused

# a block slides down only in at most this many copies (a slide by less than
# its size copies it piece by piece, each piece the distance moved)
MAX_SLIDE_PIECES = 16


def make_page_room(pool, size, kind, nbytes):
    """With expandable segments, the carved block for a large request of
    ``size`` bytes (``nbytes`` asked) once nothing but moving blocks can
    serve it, or None (nothing unmapped; blocks moved only when the
    device's free memory shrank while they moved): slide the blocks
    of each mapped segment down to its start (those not movable stay, and
    so do those a slide would copy in more than MAX_SLIDE_PIECES pieces)
    when the pages the live blocks then touch, with the other segments
    that hold live blocks, leave room under the limit and on the device
    for the request's pages; else first move each run whose blocks all
    move down against the run below it by remapping its pages
    (:func:`_run_moves`), when the slides then pack across runs into
    fewer pages; and when that still leaves no room, also move the small
    pool's blocks out of the segments that hold the fewest
    (:func:`_small_evacuation`), when the segments that empties, returned,
    make room. Then return every free page and free segment and map the
    request's. Raises what moving raises, and DefragmentationError when
    giving back or mapping fails after the moves (the pool stays
    consistent)."""
    if kind != LARGE or pool._range is None:
        return None
    try:
        _defrag._quiesce_for_moves(pool)
    except DefragmentationRefused as refusal:
        pool._refusal = str(refusal)
        return None
    layout = _defrag._layout(pool, LARGE, frozen=[s.address for s in pool._segments.values()
                                                  if not pool._mapped(s)])
    page = pool.backend.page_size
    # what the pool reserves once the slides are done and every free page
    # and free segment went back (_release_all_free): the pages the live
    # blocks touch, and the segments of its own with live blocks
    kept = sum(segment.size for segment in pool._segments.values()
               if not pool._mapped(segment) and not pool._wholly_free(segment))
    need = -(-size // page) * page
    room = min(pool._limit, pool.backend.memory_info()[0] + pool.stats.current("reserved_bytes"))
    slides, touched = _page_slides(layout, page)
    moves = evacuation = small_slides = ()
    emptied = 0
    if not slides or kept + touched + need > room:
        moves, joined = _run_moves(layout)
        if moves:
            joined_slides, joined_touched = _page_slides(joined, page)
            if joined_touched < touched or not slides:
                slides, touched = joined_slides, joined_touched
            else:
                moves = ()
        if kept + touched + need > room:
            small_slides, evacuation, emptied = _small_evacuation(pool)
            if kept - emptied + touched + need > room:
                return None
        if not (slides or evacuation):
            return None
    if moves:           # first: all or nothing, so that a refusal leaves the pool as before
        _move_runs(pool, moves)
    _copy_all(pool, small_slides, evacuation, slides)
    if not _still_room(pool, kept - emptied + touched + need):
        return None
    what = "giving back the free pages and segments"
    try:
        pool._release_all_free()
        what = "mapping the request's pages"
        return pool._grow(size, kind, nbytes)
    except Exception as e:
        raise DefragmentationError(
            f"making room for {nbytes} bytes moved blocks, then {what} failed ({e}): the "
            "blocks keep their new places and their data, what was given back stays given "
            "back, the rest stays mapped, free, and the pool is consistent") from e


def _copy_all(pool, small_slides, evacuation, slides):
    """Slide the small pool's receiving blocks, move its evacuated ones,
    then slide the large pool's: one defragmentation (counted once, told
    to the observers once, with what completed, also when a copy fails)."""
    done, first = [0, 0], 1             # blocks and bytes moved
    try:
        if small_slides:
            done[1] += _moves.slide(pool, small_slides, first)
            done[0] += len(small_slides)
            first = 0
        if evacuation:
            done[1] += _moves.execute(pool, evacuation, first, tell=False)
            done[0] += sum(map(len, evacuation))
            first = 0
        if slides:
            done[1] += _moves.slide(pool, slides, first)
            done[0] += len(slides)
    finally:
        if done[0]:
            for observer in pool._observers:
                observer.on_defragment(pool, *done)


def _still_room(pool, nbytes):
    """Whether the pool may still reserve ``nbytes`` in all once its blocks
    have moved: another process may have taken device memory meanwhile,
    and then nothing goes back (the plans after this one see the pool as
    it now is). A device that fails the query is taken to have what the
    plan counted on (the blocks have moved; growing asks it again)."""
    try:
        device_free = pool.backend.memory_info()[0]
    except Exception:
        return True
    return nbytes <= min(pool._limit, device_free + pool.stats.current("reserved_bytes"))


def _small_evacuation(pool):
    """(slides, phases, bytes of the segments they empty) of moving the
    small pool's blocks out of the segments that hold the fewest live bytes,
    so that those go back: into the others' free ranges as they are (a
    compaction's first phase), or, when that empties fewer, into the free
    ends the others' blocks leave once slid down (:func:`_small_packing`)."""
    layout = _defrag._layout(pool, SMALL)
    phases, emptied = compaction_plan(layout, max_phases=1, max_free=pool._max_split)
    slides, moves, packed = _small_packing(layout, pool._max_split)
    if len(packed) > len(emptied):
        phases, emptied = [moves], packed
    else:
        slides = []
    if not len(emptied):
        return [], (), 0
    return slides, phases, sum(pool._segments[address].size for address in emptied)


def _small_packing(layout, max_free):
    """(slides, moves, emptied segment addresses) that empty the segments
    of ``layout`` holding the fewest live bytes, as many as a bisection
    finds room for (a packing that fits k segments mostly fits fewer): the other
    segments' blocks slide down to their starts (as :func:`_page_slides`
    slides them), and the emptied segments' blocks, largest first, go into
    the smallest free end that holds them (none of ``max_free`` bytes or
    more). A segment with a fixed block neither empties nor takes blocks;
    only the segments that take blocks slide. ``moves``: an int64 array of
    rows (src, dst, size)."""
    address, sizes, fixed, first = (layout.address.tolist(), layout.size.tolist(),
                                    layout.fixed.tolist(), layout.first.tolist())
    starts, ends = layout.segment_address.tolist(), (layout.segment_address
                                                     + layout.segment_size).tolist()
    live = [sum(sizes[first[i]:first[i + 1]]) for i in range(len(starts))]
    movable = [i for i in range(len(starts))
               if first[i + 1] > first[i] and not any(fixed[first[i]:first[i + 1]])]
    movable.sort(key=live.__getitem__)
    ends_after = {}                 # segment: (its free end's address, its slides)
    for i in movable:
        cursor, slides = starts[i], []
        for b in range(first[i], first[i + 1]):
            at, n = address[b], sizes[b]
            step = at - cursor
            if _slides(n, step):
                slides.append(Move(at, cursor, n))
                at = cursor
            cursor = at + n
        ends_after[i] = (cursor, slides)
    # the number emptied: a bisection over what fits (the k emptiest's live
    # bytes within the others' free ends), each try a packing: O(n log n log
    # segments) in the n blocks, not one try per segment
    load = np.cumsum([0] + [live[i] for i in movable]).tolist()
    room = np.cumsum([0] + [ends[i] - ends_after[i][0] for i in reversed(movable)]).tolist()
    count = len(movable)
    low, high = 0, max([0] + [k for k in range(count) if load[k] <= room[count - k]])
    best = ([], np.empty((0, 3), np.int64), [])
    while low < high:
        k = (low + high + 1) // 2
        placed = _placed([b for i in movable[:k] for b in range(first[i], first[i + 1])],
                         movable[k:], ends_after, ends, sizes, address, max_free)
        if placed is None:
            high = k - 1
            continue
        moves, takers = placed
        best = ([m for i in takers for m in ends_after[i][1]], moves,
                [starts[i] for i in movable[:k]])
        low = k
    return best


def _placed(blocks, takers, ends_after, ends, sizes, address, max_free):
    """(moves, the segments that take blocks) of ``blocks`` (row indices),
    largest first, each into the smallest free end of the ``takers`` that
    holds it; None when one does not fit."""
    free = sorted((ends[i] - ends_after[i][0], ends_after[i][0], i) for i in takers
                  if max_free is None or ends[i] - ends_after[i][0] < max_free)
    moves, used = [], set()
    for b in sorted(blocks, key=sizes.__getitem__, reverse=True):
        n = sizes[b]
        j = bisect.bisect_left(free, (n,))
        if j == len(free):
            return None
        room, at, i = free.pop(j)
        moves.append((address[b], at, n))
        used.add(i)
        if room > n:
            bisect.insort(free, (room - n, at + n, i))
    return np.array(moves, np.int64).reshape(-1, 3), sorted(used)


def _run_moves(layout):
    """(moves, the layout after them) of the runs of ``layout`` (mapped
    segments) in address order: each run with live blocks, none fixed,
    moves down against the run below it (the end of that one after its
    own move): moves (address, to) by address; in the layout after them
    each run moved is one segment with the run below it."""
    starts, sizes = layout.segment_address.tolist(), layout.segment_size.tolist()
    first, fixed = layout.first.tolist(), layout.fixed
    address = layout.address.copy()
    moves, groups = [], []          # groups: [start, bytes, block indices]
    for i in sorted(range(len(starts)), key=starts.__getitem__):
        at, low, high = starts[i], first[i], first[i + 1]
        if groups and high > low and not fixed[low:high].any():
            group = groups[-1]
            to = group[0] + group[1]
            moves.append((at, to))
            address[low:high] -= at - to
            group[1] += sizes[i]
            group[2].extend(range(low, high))
        else:
            groups.append([at, sizes[i], list(range(low, high))])
    if not moves:
        return (), layout
    order = np.array([b for group in groups for b in group[2]], np.int64)
    bounds = np.zeros(len(groups) + 1, np.int64)
    np.cumsum([len(group[2]) for group in groups], out=bounds[1:])
    return moves, Layout(np.array([g[0] for g in groups], np.int64),
                         np.array([g[1] for g in groups], np.int64), bounds,
                         address[order], layout.size[order], fixed[order])


def _move_runs(pool, moves):
    """Carry out :func:`_run_moves`' ``moves`` and join each run moved to
    the segment below it. All or nothing: when the backend refuses a
    remap, the runs moved before it go back (DefragmentationError: the
    pool as before, or, when moving back fails too, consistent with those
    runs at their new addresses)."""
    done = []
    for number, (address, to) in enumerate(moves, 1):
        try:
            pool._move_run(pool._segments[address], to)
        except Exception as e:
            what = (f"remapping run {number} of {len(moves)} ({address:#x} to {to:#x}) "
                    f"failed ({e})")
            try:
                for old, new in reversed(done):
                    pool._move_run(pool._segments[new], old)
            except Exception as again:
                raise DefragmentationError(
                    f"{what}; moving the runs before it back failed too ({again}): the pool "
                    "is consistent, those runs at their new addresses") from again
            raise DefragmentationError(f"{what}; the runs moved before it went back: the "
                                       "pool is as before") from e
        done.append((address, to))
    for _, to in moves:
        run = pool._segments[to]
        below = next(s for s in pool._segments.values()
                     if pool._mapped(s) and s.address + s.size == to)
        pool._join(below, run)


def _slides(size, step):
    """Whether a block of ``size`` bytes slides down by ``step`` bytes: in
    at most MAX_SLIDE_PIECES copies (pieces of ``step`` bytes when it slides
    over its own bytes)."""
    return step > 0 and -(-size // min(step, size)) <= MAX_SLIDE_PIECES


def _page_slides(layout, page):
    """(the slides packing each segment of ``layout`` from its start, bytes
    of the pages its live blocks then touch): a fixed block stays, and the
    blocks after it pack from its end; a block that would slide in more
    than MAX_SLIDE_PIECES copies stays too."""
    slides, touched = [], 0
    address, sizes, fixed, first = (layout.address.tolist(), layout.size.tolist(),
                                    layout.fixed.tolist(), layout.first.tolist())
    for i, start in enumerate(layout.segment_address.tolist()):
        cursor, last_page = start, -1
        for b in range(first[i], first[i + 1]):
            at, n = address[b], sizes[b]
            step = at - cursor
            if not fixed[b] and _slides(n, step):
                slides.append(Move(at, cursor, n))
                at = cursor
            low, high = at // page, (at + n - 1) // page
            touched += high - max(low, last_page + 1) + 1 if high > last_page else 0
            last_page = max(last_page, high)
            cursor = at + n
    return slides, touched * page
