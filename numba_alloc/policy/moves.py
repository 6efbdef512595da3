"""Running a defragmentation's moves (planned by
:mod:`numba_alloc.policy.compaction`, chosen by :mod:`numba_alloc.policy.defrag`
and :mod:`numba_alloc.policy.room`): the backend's copy kernel moves the
bytes, started for every phase at once; the block table (the compiled
core), the handles and, through the Numba glue's relocator, every Numba
object on a block follow while the device copies; what a failed copy did
not complete goes back.

Every function here is called with the pool's lock held.
"""

from typing import NamedTuple

import numpy as np

from . import core as _core
from .backend import PhaseCopyError
from .compaction import slide_pieces
from .core import NF, TABLE
from .errors import DefragmentationError
from .observers import PoolObserver
from .phase import Phase

_ADDR, _SEG, _STATE = _core.ADDR, _core.SEG, _core.STATE


def _rows_array(rows):
    return np.array(rows, dtype=np.int64).reshape(-1)


class _Segments(NamedTuple):
    """The pool's segments in address order, as the core has them when
    made (int64 ``bases``, ``sizes`` and ``first_rows``), for finding the
    segment of each of a defragmentation's addresses."""
    bases: np.ndarray
    sizes: np.ndarray
    first_rows: np.ndarray

    @classmethod
    def of(cls, pool):
        found = _core.segments(pool._p, -1)
        found = found[np.argsort(found[:, 0])]
        return cls(*(np.ascontiguousarray(found[:, i]) for i in range(3)))

    def spans(self, addresses):
        """An int64 row (address, size) a value of ``addresses``: the
        segment holding it."""
        at = np.searchsorted(self.bases, addresses, "right") - 1
        return np.stack((self.bases[at], self.sizes[at]), axis=-1)

    def live_rows(self, pool, addresses):
        """address -> row of every allocated block of the segments holding
        ``addresses`` (before any of them moved)."""
        held = np.unique(np.searchsorted(self.bases, addresses, "right") - 1)
        rows, _ = _core.chains(pool._p, self.first_rows[held])
        base = TABLE + rows * NF
        a = pool._core.a
        allocated = a[base + _STATE] == _core.ALLOCATED
        return dict(zip(a[base + _ADDR][allocated].tolist(), rows[allocated].tolist()))


def _phases(pool, segments, tables):
    """Phases' ``tables`` of moves (int64 rows src, dst, size) as the
    backend copies them: a Phase each, its moves' segments found by
    address (all the phases' at once)."""
    spans = segments.spans(np.concatenate(tables)[:, :2].reshape(-1)).reshape(-1, 2, 2)
    sources, destinations = np.ascontiguousarray(spans[:, 0]), np.ascontiguousarray(spans[:, 1])
    bounds = np.cumsum([0] + [len(moves) for moves in tables]).tolist()
    return [Phase(moves, sources[start:end], destinations[start:end])
            for moves, start, end in zip(tables, bounds, bounds[1:])]


def _count_moves(pool, before, completed=None):
    """Count what the copy kernel copied since its counters read ``before``;
    after a failure, only the ``completed`` phases (int64 tables), none of
    a phase that ran in part."""
    after = pool.backend.move_counters()
    stats = pool.stats
    if completed is None:
        stats.num_defragmentations += after[0] - before[0]
        stats.bytes_defragged += after[1] - before[1]
    elif completed:
        stats.num_defragmentations += after[0] - before[0]
        stats.bytes_defragged += sum(int(moves[:, 2].sum()) for moves in completed)


def _copy(pool, segments, moves, first):
    """Copy one phase's ``moves`` with the backend's copy kernel, wait for
    it and count what it copied; returns the destination segment of each
    move. Raises what the backend raises (then nothing is counted)."""
    (phase,) = _phases(pool, segments, [moves])
    with pool.backend.copy_session():
        before = pool.backend.move_counters()
        pool.backend.copy(phase.batches(), first)
        _count_moves(pool, before)
    return phase.destinations[:, 0]


def execute(pool, phases, first=1, tell=True):
    """Run the phases' copies (each a list of Move or an int64 array of rows
    src, dst, size): started all at once (Backend.start_copies), the blocks'
    records and every Numba object on them follow while the device copies
    (under the pool's lock: no request sees them before the copies have
    completed), then waits for the copies; returns the bytes moved. When a
    copy fails, the blocks of the phases that did not complete keep (or get
    back) their old addresses and data, those of the phases before them
    their new ones, and DefragmentationError is raised. The move counters
    count what the device's counters say was copied; ``first``: 1 when
    this starts a defragmentation; ``tell``: the observers hear of it
    (on_defragment) when something moved."""
    tables = [t for t in (np.asarray(phase, np.int64).reshape(-1, 3) for phase in phases)
              if len(t)]
    if not tables:
        return 0
    with pool.backend.copy_session():
        _copy_and_follow(pool, tables, first)
    moved_bytes = sum(int(moves[:, 2].sum()) for moves in tables)
    if tell:
        for observer in pool._observers:
            observer.on_defragment(pool, sum(map(len, tables)), moved_bytes)
    return moved_bytes


def _copy_and_follow(pool, tables, first):
    """:func:`execute`'s copies, the records following them and the
    counting, the backend's copy session held."""
    segments = _Segments.of(pool)
    planned = _phases(pool, segments, tables)
    backend, before = pool.backend, pool.backend.move_counters()
    try:
        backend.start_copies(planned, first)
    except Exception as e:
        done = e.done if isinstance(e, PhaseCopyError) else 0
        live = segments.live_rows(pool, np.concatenate(tables)[:, 0])
        for phase in planned[:done]:
            _move_records(pool, phase.moves, live, phase.destinations[:, 0])
        _count_moves(pool, before, tables[:done])
        raise _copy_failed(done, tables, _cause(e)) from _cause(e)
    try:
        # the allocated blocks of the segments blocks move out of (a block
        # moves at most once), read while the device copies
        live = segments.live_rows(pool, np.concatenate(tables)[:, 0])
        for phase in planned:
            _move_records(pool, phase.moves, live, phase.destinations[:, 0])
    except BaseException:
        try:
            backend.finish_copies()         # no copy runs on once this raises
        except Exception:      # noqa: BLE001 - the first error is the one raised
            pass
        raise
    try:
        backend.finish_copies()
    except Exception as e:
        done = e.done if isinstance(e, PhaseCopyError) else 0
        # the phases the device did not complete go back, the last first
        for phase in reversed(planned[done:]):
            _move_records(pool, np.ascontiguousarray(phase.moves[:, [1, 0, 2]]), live,
                          phase.sources[:, 0])
        _count_moves(pool, before, tables[:done])
        raise _copy_failed(done, tables, _cause(e)) from _cause(e)
    _count_moves(pool, before)


def _cause(e):
    """The backend's error behind ``e`` (a PhaseCopyError's cause)."""
    return e.__cause__ if isinstance(e, PhaseCopyError) and e.__cause__ is not None else e


def _copy_failed(done, tables, cause):
    """The DefragmentationError of copies that failed (the backend's
    ``cause``) after the first ``done`` phases of ``tables`` completed."""
    if done == len(tables):
        return DefragmentationError(
            f"the device failed once the copy kernel's {done} phases had completed "
            f"({cause}); every moved block has its new address, and the pool is consistent")
    return DefragmentationError(
        f"the copy kernel failed in phase {done + 1} of {len(tables)} ({cause}); the "
        f"{sum(map(len, tables[done:]))} blocks of that phase and those after it keep their "
        "old addresses and data, those before them their new ones, and the pool is "
        "consistent")


def run_gather(pool, gather):
    """Run a :class:`~numba_alloc.policy.compaction.Gather`: the slides
    opening its receivers, its evictions (one phase), then its slides;
    returns the bytes moved; the observers hear of it once
    (on_defragment), when it has completed."""
    moved = slide(pool, gather.opening)
    moved += execute(pool, [gather.evictions], 0 if moved else 1, tell=False)
    moved += slide(pool, gather.slides, 0 if moved else 1)
    for observer in pool._observers:
        observer.on_defragment(pool, sum(map(len, gather)), moved)
    return moved


def slide(pool, slides, first=1):
    """Run a gather's ``slides`` (Moves down inside their segments, each
    segment's in address order): each block in the pieces
    :func:`slide_pieces` cuts, one copy after another, its record moved
    once its last piece is in place;
    returns the bytes moved. When a piece's copy fails, the pieces copied
    go back, last first, each from its new place to its old (every old
    place a piece overwrote held a piece already copied, and the failed
    copy wrote only into such a place): the block keeps its old address
    and data, the blocks slid before it their new ones, and
    DefragmentationError is raised; it says so when putting back fails
    too (the device then fails its copies: the block's bytes are split
    between its two places). ``first``: 1 when this starts a
    defragmentation. The caller tells the observers (on_defragment)."""
    if not slides:
        return 0
    segments = _Segments.of(pool)
    live = segments.live_rows(pool, np.array([move.src for move in slides], np.int64))
    moved_bytes = 0
    for number, move in enumerate(slides, 1):
        pieces = slide_pieces(move)
        done = 0
        try:
            for piece in pieces:
                destination = _copy(pool, segments, np.array([piece], np.int64), first)
                first = 0
                done += 1
        except Exception as e:
            what = (f"the copy kernel failed sliding block {number} of {len(slides)} "
                    f"({move.size} bytes from {move.src:#x} to {move.dst:#x}) at piece "
                    f"{done + 1} of {len(pieces)} ({e})")
            try:
                for piece in reversed(pieces[:done]):
                    _copy(pool, segments, np.array([(piece.dst, piece.src, piece.size)],
                                                   np.int64), 0)
            except Exception as again:
                raise DefragmentationError(
                    f"{what}; putting its pieces back failed too ({again}): the block's "
                    "bytes are split between its old and new places, its record keeps "
                    "the old address") from again
            raise DefragmentationError(
                f"{what}; its pieces went back: it keeps its old address and data, the "
                f"{number - 1} blocks slid before it their new ones, and the pool is "
                "consistent") from e
        _move_records(pool, np.array([move], np.int64), live, destination)
        moved_bytes += move.size
    return moved_bytes


def _move_records(pool, moves, live, destinations):
    """Point the blocks of a phase's ``moves`` (rows src, dst, size) at
    their new addresses, in the segments at ``destinations``, and rebuild
    the free blocks of the segments involved. Their handles read the
    address from the core."""
    sources = moves[:, 0].tolist()
    rows = np.array([live.pop(src) for src in sources], np.int64)
    core = pool._core
    origins = core.a[TABLE + rows * NF + _SEG]
    involved = [pool._segments[address] for address in
                np.unique(np.concatenate([origins, destinations])).tolist()]
    # the old chains, before any relinking
    chain_rows, offsets = _core.chains(pool._p, np.array([seg.row for seg in involved],
                                                         np.int64))
    pool._reserve(len(chain_rows) + 2 * len(involved))
    a = core.a                          # the table grows no more in this phase
    a[TABLE + rows * NF + _ADDR] = moves[:, 1]
    a[TABLE + rows * NF + _SEG] = destinations
    live.update(zip(moves[:, 1].tolist(), rows.tolist()))
    # each involved segment's non-free rows now, in address order: those of
    # its old chain that did not move, and those that moved into it
    base = TABLE + chain_rows * NF
    not_free = a[base + _STATE] != _core.FREE
    is_moved = np.zeros(int(a[_core.H_CAP]), bool)
    is_moved[rows] = True
    stays = not_free & ~is_moved[chain_rows]
    addresses = np.array([seg.address for seg in involved], np.int64)
    kept = np.concatenate((chain_rows[stays], rows))
    owner = np.concatenate((np.repeat(np.arange(len(involved)), np.diff(offsets))[stays],
                            np.searchsorted(addresses, destinations)))
    order = np.lexsort((a[TABLE + kept * NF + _ADDR], owner))
    kept = np.ascontiguousarray(kept[order])
    bounds = np.searchsorted(owner[order], np.arange(len(involved) + 1)).tolist()
    # every count goes down before any goes up, so no peak sees a state
    # between two segments
    _drop_free(pool, chain_rows[~not_free])
    pool._reserve(len(kept) + len(involved))
    p, at = pool._p, kept.ctypes.data
    for i, segment in enumerate(involved):
        segment.row = _core.rebuild(p, segment.address, segment.size, segment.kind, segment.big,
                                    at + 8 * bounds[i], bounds[i + 1] - bounds[i])
    # (a tuple a block only for those that hear moves: a compaction moves
    # up to every live block)
    hearing = [observer for observer in pool._observers
               if type(observer).on_move is not PoolObserver.on_move]
    if hearing or pool.relocator is not None:
        moved = [(block, src) for row, src in zip(rows.tolist(), sources)
                 if (block := pool._handle_of(row)) is not None]
        for observer in hearing:
            for block, old in moved:
                observer.on_move(pool, block, old)
        if pool.relocator is not None:
            pool.relocator.relocated(pool, moved)


def _drop_free(pool, rows):
    """Take free ``rows`` out of the index and counters; they die."""
    core = pool._core
    table = _rows_array(rows)
    _core.drop_free(core.p, table.ctypes.data, len(rows))
