# Reclaim's bookkeeping of uses (policy/reclaim.py's begin_use and end_use:
# a kernel launch under the Numba plugin makes one) in one compiled pass
# each: pins, the nesting of uses, the last uses and the active-bytes
# counter. Included by _core.pyx, after the handles (it reads Block).
# Not thread safe: the pool calls it under its lock.


def unowned(pool, handles, list owned, dict reclaimed):
    """The first of ``handles`` (Block handles) that is neither live in
    ``pool`` (its handle at its row of ``owned``) nor reclaimed, or None."""
    cdef Block handle
    for h in handles:
        handle = <Block?>h
        if (handle.pool is not pool or owned[handle._ticket & ROW_MASK] is not handle) \
                and handle not in reclaimed:
            return handle
    return None


def begin_uses(int64_t p, pool, handles, list owned, dict active, bint pin, int64_t family):
    """Count a use of each of ``handles`` in ``active`` (handle -> nesting),
    pinning its row once when ``pin``; raise counter ``family`` (large
    pool) by the bytes of those not in use before. Returns None; or, having
    changed nothing, the first handle that is not live in ``pool`` (its
    handle at its row of ``owned``: a reclaimed block is not)."""
    cdef int64_t *a = _view(p)
    cdef int64_t newly = 0, r, count
    cdef Block handle
    for h in handles:
        handle = <Block?>h
        if handle.pool is not pool or owned[handle._ticket & ROW_MASK] is not handle:
            return handle
    for h in handles:
        handle = <Block>h
        r = TABLE + (handle._ticket & ROW_MASK) * NF
        if pin:
            a[r + PIN] += 1
        count = active.get(handle, 0)
        active[handle] = count + 1
        if count == 0:
            newly += a[r + SIZE]
    if newly:
        _up(a, family, LARGE, newly)
    return None


def end_uses(int64_t p, handles, list owned, dict active, dict last_use, int64_t epoch,
             bint completed, int64_t family):
    """Undo :func:`begin_uses` for ``handles``: each use ends (a handle
    reset meanwhile has none: skipped), a live block's row is unpinned and
    its last use recorded in ``last_use`` (row -> (ticket, the allocation
    clock H_GEN, the epoch: ``epoch``, or -1 when ``completed`` and no
    earlier use's work may be queued)); lower counter ``family`` by the
    bytes of those no longer in use."""
    cdef int64_t *a = _view(p)
    cdef int64_t now = a[H_GEN], done = 0, r, row, count, ticket
    cdef int64_t ended = -1 if completed else epoch
    cdef Block handle
    cdef object used
    for h in handles:
        handle = <Block?>h
        count = active.pop(handle, 0)
        if count != 1:
            if count == 0:
                continue                    # reset() meanwhile
            active[handle] = count - 1
        ticket = handle._ticket
        row = ticket & ROW_MASK
        if owned[row] is not handle:        # freed meanwhile
            if count == 1:
                done += handle.allocated_size
            continue
        r = TABLE + row * NF
        if count == 1:
            done += a[r + SIZE]
        a[r + PIN] -= 1
        used = last_use.get(row)
        if completed:
            # an earlier use's work (on another stream) may still be queued
            ended = epoch if (used is not None and <int64_t>used[2] == epoch
                              and <int64_t>used[0] == ticket) else -1
        if (used is None or <int64_t>used[0] != ticket or <int64_t>used[1] != now
                or <int64_t>used[2] != ended):      # else as recorded (a launch loop's)
            last_use[row] = (ticket, now, ended)
    if done:
        _down(a, family, LARGE, done)
