"""Reclaim (the ``reclaim`` setting): inactive blocks go to pinned host
memory when a request cannot be met otherwise, and come back on their next
use, as TensorFlow Large Model Support's allocator did.

A live block is *resident* (it has device memory: a row of the core) or
*reclaimed* (its bytes are in chunks of the pinned host cache; it has no
device memory and its address means nothing). A resident block is *active* while it is inside
:meth:`Pool.use <numba_alloc.policy.pool.Pool.use>` (pinned: never moved, never
reclaimed), else *inactive*.

Reclaiming blocks: for each, chunks of pinned host memory from the pool's
host cache and asynchronous copies of the block's bytes into them, queued
behind all work queued before (so kernels that wrote the block have
finished; host_copies.py); the copies of every victim are queued before
the host waits for the device once, and only then is each block's device
memory freed (reusable at once, its copy has completed) and the pool's
relocator points the block's other references (the Numba glue's pointer
objects) at a null address until it comes back. A failing chunk, copy or
wait leaves every block as it was (the chunks already filling go back to
the cache, reused once their copies have run). Victims are
inactive resident blocks that are not pinned, whose last use's GPU work has
completed (it ended before the pool last synchronized the device; when an
inactive block's did not, reclaim synchronizes first: residency.py), and
that the host limit leaves room for; the least recently used
first, on one clock: the allocations made so far (a block never used counts
as used when it was allocated). A *single reclaim* takes
the first whose bytes, with its free neighbours, serve the request, or are
its whole segment, whose return to the device makes room to grow; a *full
reclaim*, when none does, takes all of them.

Bringing blocks back (use, pin): refused at once (OutOfMemoryError, nothing
changed) when they could not all fit even with every other inactive block
reclaimed; else device blocks for all of them first (the ordinary request
path, which may reclaim other inactive blocks, never those being brought
back or already active); if one cannot be had, those taken are freed and the
blocks stay reclaimed (OutOfMemoryError). Then copies from
their chunks are queued, and each handle takes its new device block:
a new address, which the pool's relocator (the Numba glue) makes its
objects follow. Its chunks go back to the host cache, reused once the
copies reading them have completed.

The host_limit setting caps :attr:`Residency.host_bytes`, the bytes of the
chunks reclaimed blocks hold (rounded as host_copies.host_bytes says);
the host_cache_limit setting caps everything the host cache holds: those
chunks, chunks whose copies are still under way, cached ones and Numba's
pinned and mapped arrays.

Not thread safe: the pool calls these functions under its lock.
"""

from . import core as _core
from .core import NF, TABLE
from .counters import family_index
from .errors import ReclaimError
from .host_cache import HostOutOfMemoryError
from .host_copies import copy_in, copy_out, give_back, host_bytes
from .residency import Reclaimed, any_queued_use, device_idle, queued_uses, record_event

_SIZE, _REQ, _STATE, _PIN, _PREV, _NEXT, _KIND, _ADDR, _GEN = (
    _core.SIZE, _core.REQ, _core.STATE, _core.PIN, _core.PREV, _core.NEXT, _core.KIND,
    _core.ADDR, _core.GEN)
_ROW_MASK = _core.ROW_MASK
ACTIVE_BYTES = family_index("lms_active_bytes")      # the counter uses raise and lower


def _extent(mv, row):
    """Bytes the block at ``row`` frees with its free neighbours."""
    r = TABLE + row * NF
    total = mv[r + _SIZE]
    for link in (_PREV, _NEXT):
        other = mv[r + link]
        if other >= 0 and mv[TABLE + other * NF + _STATE] == _core.FREE:
            total += mv[TABLE + other * NF + _SIZE]
    return total


def victims(pool):
    """[(row, handle)] of the blocks reclaim may take, least recently used
    first."""
    r, mv, relocator = pool._residency, pool._mv, pool.relocator
    last_use, epoch = r.last_use, r.epoch
    found = []
    for segment in pool._segments.values():
        for row, handle in pool._allocated(segment):
            if handle is None or mv[TABLE + row * NF + _PIN] or handle in r.active \
                    or (relocator is not None and not relocator.movable(handle)):
                continue
            used = last_use.get(row)
            if used is None or used[0] != handle._ticket:
                clock = mv[TABLE + row * NF + _GEN]
            elif used[2] == epoch:
                continue                # its last use's work may still be queued
            else:
                clock = used[1]
            found.append((clock, row, handle))
    found.sort(key=lambda v: v[0])
    return [(row, handle) for _, row, handle in found]


def _busy(pool):
    """Whether an inactive block's last use may still have GPU work queued
    (it is no victim until the device is synchronized). Scans the blocks'
    last uses."""
    active = pool._residency.active
    return any(handle not in active for handle in queued_uses(pool))


def _host_room(pool, size):
    """Whether the host limit leaves room for the chunks of a ``size``-byte block."""
    limit = pool._settings.host_limit
    return limit is None or pool._residency.host_bytes + host_bytes(size) <= limit


def _stage(pool, row, handle):
    """Chunks of pinned host memory holding (once the copies queued now
    complete) the bytes of the block at ``row``: (row, handle, chunks,
    their bytes), counted in the host bytes held. ReclaimError when the
    host cache or the backend refuses: then nothing is held (the chunks
    taken are back in the cache)."""
    mv = pool._mv
    base = TABLE + row * NF
    size, address = mv[base + _SIZE], mv[base + _ADDR]
    try:
        chunks = copy_out(pool.host_cache, pool.backend, address, size)
    except HostOutOfMemoryError as e:
        raise ReclaimError(f"reclaim: no pinned host memory for {handle!r} ({size} bytes): "
                           f"{e}") from e
    except Exception as e:
        raise ReclaimError(f"reclaim: copying {handle!r} ({size} bytes) to pinned host "
                           f"memory failed: {e}") from e
    held = host_bytes(size)
    pool._residency.host_bytes += held
    return row, handle, chunks, held


def _unstage(pool, staged):
    """Give up ``staged`` copies (from _stage): their chunks go back to the
    host cache, reused once the copies into them have completed; the
    blocks stay as they are."""
    for _, _, chunks, held in staged:
        give_back(pool.host_cache, chunks)
        pool._residency.host_bytes -= held


def _commit(pool, staged):
    """Move the ``staged`` blocks to host memory: their copies have
    completed (the device was synchronized since, and nothing queued), so
    their device memory is reusable at once. Cannot fail. The open frees
    retired are the victims' alone (the wait closed every other): the
    relocator and the observers, which may free blocks, run after."""
    if not staged:
        return
    mv, r, stats = pool._mv, pool._residency, pool.stats
    moves = []
    for row, handle, chunks, held in staged:
        base = TABLE + row * NF
        address, size = mv[base + _ADDR], mv[base + _SIZE]
        r.reclaimed[handle] = Reclaimed(chunks, size, mv[base + _REQ], address, held)
        handle.address, handle.allocated_size = address, size   # kept: its row is released
        _core.release(pool._p, row, mv[base + _GEN])
        pool._handles[row] = None
        stats.up("reclaimed_bytes", size)
        stats.up("reclaimed", 1)
        moves.append((handle, address))
    pool._pending.retire_open()
    if pool.relocator is not None:
        pool.relocator.relocated(pool, moves)
    for handle, _ in moves:
        for observer in pool._observers:
            observer.on_reclaim(pool, handle)


def reclaim_blocks(pool, chosen):
    """Move the blocks ``chosen`` ([(row, handle)]) to host memory, as the
    host limit leaves room for them in turn: all of those, or none
    (ReclaimError, or what waiting for the device raised: every block is
    then as it was). The number moved."""
    staged = []
    try:
        for row, handle in chosen:
            if _host_room(pool, pool._mv[TABLE + row * NF + _SIZE]):
                staged.append(_stage(pool, row, handle))
        if staged:
            _reusable(pool)             # the copies, and the frees before, complete
    except BaseException:
        _unstage(pool, staged)
        raise
    _commit(pool, staged)
    return len(staged)


def _reusable(pool):
    """Wait for the copies of reclaimed blocks, then retire their frees."""
    pending = pool._pending
    pending.close_batch()
    pending.synchronize()
    device_idle(pool, any_queued_use(pool))


def _serves(pool, row, size, kind, device_free):
    """Whether reclaiming the block at ``row`` alone makes room for a
    ``size``-byte block of pool ``kind``: its bytes with its free
    neighbours hold it, or they are its whole segment, whose return to the
    device makes room to grow (a small request on a device full of large
    blocks)."""
    mv = pool._mv
    extent = _extent(mv, row)
    if mv[TABLE + row * NF + _KIND] == kind and extent >= size:
        return True
    return (extent == pool._segment_of(row).size
            and pool._room_after_release(size, extent, device_free))


def reclaim_for(pool, size, kind, nbytes):
    """Serve a request of ``nbytes`` (a ``size``-byte block of pool
    ``kind``) by reclaiming: one victim whose freed bytes serve it, else
    every victim. The block, or None when reclaiming cannot serve it (also
    while frees are held: a victim's device memory would not be reusable)."""
    if pool._pending.hold:
        return None
    if pool.relocator is not None:
        if not pool.relocator.reclaim_ready(pool):
            return None
        pool.relocator.pin_unreclaimable(pool)
    if _busy(pool):
        # inactive blocks whose last use's GPU work is still queued are
        # victims once it completes: wait for it, and retire the frees (a
        # reclaim waits for the device anyway, for its copies)
        _reusable(pool)
        block = pool._take(nbytes)
        if block is not None:
            return block
    candidates = victims(pool)
    if not candidates:
        return None
    mv = pool._mv
    device_free, total = pool.backend.memory_info()
    movable = sum(mv[TABLE + row * NF + _SIZE] for row, _ in candidates)
    if size > min(pool._limit, total) or \
            movable + pool._free_bytes() + device_free < size:
        return None                     # reclaiming everything could not make room
    for row, handle in candidates:
        # pool._mv, not mv: a take above may have grown the table (a new array)
        if _serves(pool, row, size, kind, device_free) and _host_room(
                pool, pool._mv[TABLE + row * NF + _SIZE]):
            reclaim_blocks(pool, [(row, handle)])
            block = pool._take(nbytes) or pool._reclaim_and_grow(size, kind, nbytes)
            if block is not None:
                pool.stats.num_single_reclaims += 1
                return block
            break
    if not reclaim_blocks(pool, victims(pool)):
        return None
    pool.stats.num_full_reclaims += 1
    return pool._take(nbytes) or pool._reclaim_and_grow(size, kind, nbytes)


def _room_to_bring_back(pool):
    """The most bytes blocks brought back could have: the limit (or the
    device) less the allocated blocks reclaim may not take, and the
    reserved bytes not held by those plus the device's free memory."""
    movable = sum(pool._mv[TABLE + row * NF + _SIZE] for row, _ in victims(pool))
    device_free, total = pool.backend.memory_info()
    stats = pool.stats
    held = stats.current("allocated_bytes") - movable
    return min(min(pool._limit, total) - held,
               stats.current("reserved_bytes") - held + device_free)


def bring_back(pool, handles):
    """Make the reclaimed ``handles`` resident, pinned once each: all of
    them, or none (OutOfMemoryError, or what the backend raised). When they
    could not all fit even with every other inactive block reclaimed (once
    the GPU work queued on those has completed: it waits for that), it
    raises before anything changes. When queuing a copy fails, it waits for
    the device (the copies queued before it complete) before giving back the
    device blocks it took."""
    r, backend = pool._residency, pool.backend
    need = sum(r.reclaimed[handle].size for handle in handles)
    if need > _room_to_bring_back(pool) and _busy(pool):
        _reusable(pool)         # blocks whose work is queued are victims once it completes
    if need > _room_to_bring_back(pool):
        pool._out_of_memory(need, need)
    taken = []
    try:
        for handle in handles:
            mark = pool._growth_mark()
            saved = r.reclaimed[handle]
            block, undo = pool._malloc_undoable(saved.requested)
            pool.pin(block)
            taken.append((block, undo, mark))
            # heard now, in order with the victims a later block's room
            # reclaims (a peak or trace counts the blocks' device memory
            # as it was); an undone bring-back is heard as their reclaim
            for observer in pool._observers:
                observer.on_bring_back(pool, block, saved.address)
    except BaseException:
        _give_back_taken(pool, taken)
        raise
    try:
        for handle, (block, _, _) in zip(handles, taken):
            saved = r.reclaimed[handle]
            copy_in(backend, saved.chunks, block.address, min(saved.size, block.allocated_size))
    except BaseException:
        # the copies queued before the one that failed would land in memory
        # given back, which the next request may hand out: wait for them
        try:
            backend.synchronize()
        except Exception:       # noqa: BLE001 - the copy's error is the one raised
            pass                # (a device that fails both is lost: CUDA's errors are sticky)
        _give_back_taken(pool, taken)
        raise
    copied = record_event(backend)
    r.arrival = copied
    moves = []
    for handle, (block, _, _) in zip(handles, taken):
        # the handle takes its row before it leaves the reclaimed ones, so
        # that a reader without the lock (state_of) never sees it dead
        pool._handles[block._ticket & _core.ROW_MASK] = handle
        handle._ticket = block._ticket
        handle._address = handle._allocated_size = None     # live: read from the core
        saved = _drop(pool, handle)                 # its chunks: reused once read
        moves.append((handle, saved.address))
    if pool.relocator is not None:
        pool.relocator.relocated(pool, moves)


def _give_back_taken(pool, taken):
    """Undo the device blocks a bring-back took ([(block, undo, growth
    mark)]): as if never allocated, with the segments grown for them; the
    observers, who heard each brought back, hear it reclaimed."""
    for block, undo, mark in reversed(taken):
        for observer in pool._observers:
            observer.on_reclaim(pool, block)
        pool.unpin(block)
        pool._untake(block, undo, mark)


def _drop(pool, handle):
    """Forget reclaimed ``handle``'s host copy, whose chunks go back to the
    host cache (reused once the copies queued so far, reading them, have
    completed); returns the copy's Reclaimed."""
    r = pool._residency
    saved = r.reclaimed.pop(handle)
    give_back(pool.host_cache, saved.chunks)
    r.host_bytes -= saved.host_bytes
    pool.stats.down("reclaimed_bytes", saved.size)
    pool.stats.down("reclaimed", 1)
    if not r.reclaimed and not pool._settings.reclaim and pool.relocator is not None:
        pool.relocator.reclaiming(pool, False)      # the last one since reclaim was turned off
    return saved


def free_reclaimed(pool, handle):
    """A user's free of a reclaimed block: its chunks are reused once the
    work queued so far has completed (a bring-back that failed part way may
    have queued a copy out of them). Makes no backend call."""
    _drop(pool, handle)


def begin_use(pool, handles, stream=0):
    """Make ``handles`` (distinct; a list, or a dict's keys) resident and
    active (see Pool.use) for work queued on ``stream``. Work on a stream
    other than stream 0 (the legacy default stream, or a per-thread default
    stream, which waits for the legacy one), or on another device's (stream 0
    with another device current: Numba queues a copy in the current
    context), may not wait for the pool's device's legacy default stream,
    where the copies that brought blocks back are queued (by this use or an
    earlier one): the host waits for them first. When that raises, the
    blocks are not made active. Pool._begin_use serves the common case
    (every block resident, nothing to wait for) itself."""
    r = pool._residency
    reclaimed = r.reclaimed
    wrong = _core.unowned(pool, handles, pool._handles, reclaimed)
    if wrong is not None:
        pool._allocated_row(wrong, "use")
    pinned = bool(reclaimed) and _bring_back_for_use(pool, handles)
    if r.arrival is not None:
        _wait_for_arrival(pool, handles if pinned else (), stream)
    # bringing blocks back may have grown the core: its address is read now
    _core.begin_uses(pool._p, pool, handles, pool._handles, r.active, not pinned,
                     ACTIVE_BYTES)


def _bring_back_for_use(pool, handles):
    """Bring back the reclaimed blocks among ``handles``, the others pinned
    meanwhile: True, every handle then pinned once; False when none is
    reclaimed. When bringing them back raises, they are as before; other
    blocks reclaimed to make room for them stay reclaimed, intact."""
    reclaimed = pool._residency.reclaimed
    away = [handle for handle in handles if handle in reclaimed]
    if not away:
        return False
    rows = [handle._ticket & _ROW_MASK for handle in handles if handle not in reclaimed]
    _pin_rows(pool, rows, 1)
    try:
        bring_back(pool, away)                          # pinned once each
    except BaseException:
        _pin_rows(pool, rows, -1)
        raise
    return True


def _wait_for_arrival(pool, pinned, stream):
    """Wait for the copies that brought blocks back when work on ``stream``
    may not follow them (another stream than the pool's device's legacy
    default one, or stream 0 while another device is current). When asking
    whether the device is current, or waiting, raises, the handles
    ``pinned`` (by :func:`_bring_back_for_use`) are unpinned."""
    r = pool._residency
    try:
        if not stream and pool.backend.is_current():
            return
        if not r.arrival.query():
            pool.backend.synchronize()
    except BaseException:
        _pin_rows(pool, [handle._ticket & _ROW_MASK for handle in pinned], -1)
        raise
    r.arrival = None


def _pin_rows(pool, rows, by):
    mv = pool._mv
    for row in rows:
        mv[TABLE + row * NF + _PIN] += by


def forget(pool):
    """Drop every reclaimed block, its chunks back in the host cache (the
    device is idle: reset; the cache's forget_work returns them after)."""
    r = pool._residency
    for handle in list(r.reclaimed):
        _drop(pool, handle)
    for handle in list(r.active):
        pool.stats.down("lms_active_bytes", handle.allocated_size)
    r.active.clear()
    r.last_use.clear()
