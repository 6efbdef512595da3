"""Defragmentation: moving live blocks so that free memory becomes one
range, orchestrated over a :class:`~numba_alloc.policy.pool.Pool`.

The planner (:mod:`numba_alloc.policy.compaction`) decides the moves from the
pool's block table; :mod:`numba_alloc.policy.moves` runs them (the copy
kernel, the block table and the handles, and through the Numba glue's
relocator every Numba object that holds an address). A block moves only when it is
allocated, not pinned, and its handle is registered; pending frees stay.
:func:`defragment` is the request of a user; the malloc path's is
:mod:`numba_alloc.policy.room`'s make_room, over the same moves.

Every function here is called with the pool's lock held.
"""

from typing import NamedTuple

import numpy as np

from . import core as _core
from . import moves as _moves
from .block import LARGE, SMALL
from .compaction import Layout, compaction_plan, plan_gather, plan_hole
from .core import NF, TABLE
from .errors import DefragmentationError, DefragmentationRefused
from .sizes import own_segment
from ..validate import as_flag, request_size

_ADDR, _SIZE, _STATE, _PIN, _GEN = (_core.ADDR, _core.SIZE, _core.STATE, _core.PIN,
                                   _core.GEN)


class Defragmentation(NamedTuple):
    """What one defragmentation did: bytes and blocks moved, bytes of emptied
    segments returned to the device, and whether a hole of the size asked
    for now exists (always True for a full compaction)."""
    bytes_moved: int
    blocks_moved: int
    bytes_released: int
    hole: bool


def defragment(pool, nbytes=None, release=True):
    """Move live blocks together. With ``nbytes``: open a free range of at
    least that many bytes (in the pool a request of that size uses),
    moving the fewest live bytes (a hole cleared of its blocks, else one
    segment's free space gathered at its end); ``hole`` is True exactly when
    ``malloc(nbytes)`` would then succeed without reserving memory.
    Without: compact every segment and return the segments left free to
    the device, those it empties and those already free, as empty_cache()
    does (with expandable segments, every whole page left free in a run
    too; with growth off, the arena stays); with ``release=False`` they
    stay in the pool, free and cached (reused with no driver call;
    empty_cache() gives them back), and ``bytes_released`` is 0.
    Synchronizes the device first. Returns a :class:`Defragmentation`.
    Raises TypeError or ValueError for a bad ``nbytes`` or ``release``,
    DefragmentationRefused when moving is not safe (nothing moves),
    DefragmentationError when a copy fails (the pool stays consistent) and
    RuntimeError, nothing changed, once the device context is gone
    (Backend.check_alive)."""
    nbytes, release = checked_arguments(nbytes, release)
    with pool._lock:
        pool.backend.check_alive()
        pool._free_deferred()
        if not pool._initialized:
            return Defragmentation(0, 0, 0, nbytes is None)
        if nbytes is None:
            with pool.backend.session():        # a release an emptied segment, and more
                return _compact_all(pool, release)
        size, kind = pool._size_and_kind(nbytes)
        if pool._fits(size, kind):
            return Defragmentation(0, 0, 0, True)
        _quiesce_for_moves(pool)
        moves, gather = _room_inside(pool, _segment_maps(pool, kind), size, kind)
        if moves:
            moved = _moves.execute(pool, [moves])
            return Defragmentation(moved, len(moves), 0, pool._fits(size, kind))
        if gather is None:
            return Defragmentation(0, 0, 0, pool._fits(size, kind))
        moved = _moves.run_gather(pool, gather)
        return Defragmentation(moved, sum(map(len, gather)), 0, pool._fits(size, kind))


def checked_arguments(nbytes, release):
    """(``nbytes`` as a request's size, or None; ``release``) as
    :func:`defragment` takes them. TypeError or ValueError naming the
    argument and what it may be."""
    release = as_flag(release, "release")
    return (None if nbytes is None else request_size(nbytes)), release


def pin_for_export(pool, block):
    """Pin the live ``block`` where CUDA IPC can export it. A block in
    pages mapped under the pool's reserved range (expandable segments),
    which cuIpcGetMemHandle refuses, first moves into a segment of its own
    reserved whole (one backend allocation, cuMemAlloc on a GPU), as a
    defragmentation moves blocks: after the device is idle, by the copy
    kernel, its handle and every Numba object on it following; counted as
    a defragmentation. Moved and pinned under one hold of the pool's lock,
    so that no defragmentation moves it back in between. Raises what
    Pool.pin raises; DefragmentationRefused (nothing moved, nothing pinned)
    when moving is not safe or the limit or the device has no room for the
    segment; DefragmentationError when the copy fails (the block keeps its
    place and bytes, the segment goes back, nothing pinned), or when the
    device fails once the copy has completed (the block stays moved, in its
    segment, not pinned: the next call pins it there)."""
    with pool._lock:
        if pool.segment_of(block) is None:      # reclaimed (or not live: pin says so)
            pool.pin(block)                     # brings it back
            pool.unpin(block)
        if not pool.segment_of(block).mapped:
            pool.pin(block)
            return
        if pool.pins_of(block):
            raise DefragmentationRefused(
                f"the block at {block.address:#x} lies in mapped pages and is pinned: it "
                "cannot move into a segment of its own for CUDA IPC")
        nbytes = own_segment(block.allocated_size)
        if pool.stats.current("reserved_bytes") + nbytes > pool._limit:
            raise DefragmentationRefused(
                f"no room under the pool's limit for a segment of {nbytes} bytes of the "
                "block's own, which CUDA IPC needs (its pages cannot be exported)")
        _quiesce_for_moves(pool)
        own = pool._add_segment(nbytes, LARGE, False)
        if own is None:
            raise DefragmentationRefused(
                f"no room on the device for a segment of {nbytes} bytes of the block's "
                "own, which CUDA IPC needs (its pages cannot be exported)")
        try:
            _moves.execute(pool, [np.array([[block.address, own.address, block.allocated_size]],
                                     np.int64)])
        except BaseException:
            if pool._wholly_free(own):          # the move did not complete: no block there
                pool._release_segment(own)
            raise                               # else moved (DefragmentationError says so)
        pool.pin(block)


def _compact_all(pool, release):
    """defragment()'s full compaction, the pool's lock held; ``release``:
    the segments and pages left free go back to the device."""
    _quiesce_for_moves(pool)
    done = _compact(pool, *_plan_full_compaction(pool, charge_free=True), release)
    if pool._range is None or not release:
        return done
    # the runs' free pages go back as emptied segments do
    try:
        unmapped = pool._unmap_free_pages()
    except Exception as e:
        raise DefragmentationError(
            f"the compaction moved {done.blocks_moved} blocks ({done.bytes_moved} bytes), "
            f"then unmapping the free pages it left failed ({e}): the pages not "
            "unmapped stay mapped, free, and the pool is consistent") from e
    return done._replace(bytes_released=done.bytes_released + unmapped)


def _room_inside(pool, maps, size, kind):
    """(hole moves, None), (None, a Gather) or (None, None): room for a
    ``size``-byte block of ``kind`` inside the segments ``maps`` (a run of
    blocks cleared, else one segment's free space gathered), as the pool
    may carve it (its max_split, keep_whole_segments, separate_big_segments:
    then the big segments are left out)."""
    if pool._big_apart(size, kind):
        maps = [m for m in maps if not pool._segments[m.address].big]
    whole_over = pool._kept_whole_above(size, kind)
    moves = plan_hole(maps, size, pool._max_run(size), pool._max_split, whole_over)
    if moves:
        return moves, None
    return None, plan_gather(maps, size, pool._max_run(size), pool._max_split, whole_over)


def _plan_full_compaction(pool, frozen=(), layouts=None, charge_free=False):
    """(phases, emptied segment addresses) compacting both kinds, the
    segments at the ``frozen`` addresses left out (no block moves into,
    out of or inside them); ``layouts``: the kinds' :func:`_layout` s when
    the caller has them (nothing frozen); ``charge_free``: the caller gives
    back the wholly free segments that receive nothing, or keeps them whole
    (compaction_plan). A phase is an int64 array of
    rows (src, dst, size), not a Move each: a compaction moves up to every
    live block, and as many tuples would set off the cyclic garbage
    collector over every handle of the pool."""
    phases, emptied = [], []
    for kind in (SMALL, LARGE):
        layout = layouts[kind] if layouts is not None else _layout(pool, kind, frozen)
        kind_phases, kind_emptied = compaction_plan(layout, max_free=pool._max_split,
                                                    charge_free=charge_free)
        phases += kind_phases
        emptied += kind_emptied
    return phases, emptied


def _compact(pool, phases, emptied, release):
    """Run a compaction plan; with ``release``, return to the device the
    segments it emptied and those already free (the plan moved a block
    into one only where that gives bytes back), but a growth:false arena."""
    bytes_moved = _moves.execute(pool, phases)
    released = 0
    if release:
        segments = ([pool._segments[address] for address in emptied] if pool._growth_off
                    else pool._free_segments())
        for segment in segments:
            pool._release_segment(segment)
            released += segment.size
    return Defragmentation(bytes_moved, sum(map(len, phases)), released, True)


def _quiesce_for_moves(pool):
    """Make the device idle and every completed free reusable, then let
    the relocator pin what must stay (it may refuse). The other devices
    too: work queued there (a launch or copy Numba queued while another
    device was current) may read or write blocks that are about to move."""
    pool._refusal = None
    pool._pending.synchronize()
    pool.backend.synchronize_other_devices()
    if pool.relocator is not None:
        pool.relocator.pin_unmovable(pool)


def _layout(pool, kind, frozen=()):
    """The planner's view of one kind's segments (but those at the
    ``frozen`` addresses), in address order: blocks that are not free are
    live; pinned and pending ones stay, and so do blocks without a
    registered handle and those whose relocation (the glue's pointer) is
    still being made. The segments and their rows are the core's (one pass
    over its table, then chains); the rest is NumPy over them."""
    segments = _core.segments(pool._p, kind)
    segments = segments[np.argsort(segments[:, 0])]
    if frozen:
        segments = segments[~np.isin(segments[:, 0], np.fromiter(frozen, np.int64))]
    rows, offsets = _core.chains(pool._p, np.ascontiguousarray(segments[:, 2]))
    a = pool._core.a
    owner = np.repeat(np.arange(len(segments)), np.diff(offsets))
    live = a[TABLE + rows * NF + _STATE] != _core.FREE
    rows, owner = rows[live], owner[live]
    base = TABLE + rows * NF
    movable = ((a[base + _STATE] == _core.ALLOCATED) & (a[base + _PIN] == 0)
               & (_core.registered(pool._handles, rows, a[base + _GEN]) != 0))
    if pool.relocator is not None:
        candidates = np.flatnonzero(movable)
        movable[candidates] = pool.relocator.movable_blocks(pool._handles, rows[candidates])
    first = np.zeros(len(segments) + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=len(segments)), out=first[1:])
    return Layout(np.ascontiguousarray(segments[:, 0]), np.ascontiguousarray(segments[:, 1]), first,
                  a[base + _ADDR], a[base + _SIZE], (~movable).astype(np.int64))


def _segment_maps(pool, kind):
    """:func:`_layout` as plan_hole takes it."""
    return _layout(pool, kind).segment_maps()
