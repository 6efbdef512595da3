"""What reclaim knows of a pool's live blocks (:class:`Residency`): the
blocks in host memory, those in use, when each was last used and whether
GPU work of that use may still be queued. Not thread safe: the pool's lock
guards it.

Work a use queued is known to have completed once the pool has
synchronized the device since the use ended (:func:`device_idle`): each
such synchronization starts a new *epoch*, and a use that ends records the
epoch it ended in. No event is recorded per use (a kernel launch under the
Numba plugin is one), so ending one costs no driver call; reclaim
synchronizes before it takes a block whose last use ended in the current
epoch (a synchronization covers every stream, non-blocking ones too), as
it waits for the device for its own copies anyway."""

from typing import NamedTuple


class Reclaimed(NamedTuple):
    """A reclaimed block's bytes in pinned host memory."""
    chunks: tuple           # the host cache's blocks holding them (host_copies.py)
    size: int               # bytes copied: the block's allocated size
    requested: int          # bytes the block was asked for
    address: int            # where it was on the device
    host_bytes: int         # bytes of the chunks (host_copies.host_bytes(size))


class _Never:
    """An event that never completes (recording the real one failed): what
    waits for it waits for the device's next synchronization."""

    @staticmethod
    def query():
        return False


NEVER = _Never()


class Residency:
    """What reclaim knows of a pool's live blocks."""

    __slots__ = ("reclaimed", "active", "last_use", "epoch", "arrival", "host_bytes")

    def __init__(self):
        self.reclaimed = {}                         # handle -> Reclaimed
        self.active = {}                            # handle -> nesting of Pool.use
        # row -> (the ticket of the block there when its last use ended; the
        # allocation clock, the core's H_GEN, then: recency, against the
        # generation of blocks never used; the epoch then, or -1 when no
        # work of that use or an earlier one can be queued). An entry whose
        # ticket is not its row's block's is stale (freed, reclaimed):
        # ignored, overwritten at the row's next use.
        self.last_use = {}
        self.epoch = 0              # the device synchronizations seen (device_idle)
        # an event after the latest copies that brought blocks back (queued on
        # the legacy default stream), None once they are known to be done
        self.arrival = None
        self.host_bytes = 0         # bytes of the chunks reclaimed blocks hold (host_limit's)


def record_event(backend):
    """An event recorded now, or one that never completes if that fails."""
    try:
        event = backend.event()
        event.record()
        return event
    except Exception:       # noqa: BLE001 (protected until a synchronize instead)
        return NEVER


def device_idle(pool, other_devices):
    """Every piece of work queued so far has completed (the device was
    synchronized): no block is busy (a new epoch), and no copy bringing
    blocks back is under way. With ``other_devices`` (work on the pool's
    blocks may be queued there: Numba queues a launch or copy in the
    current device's context, which another device's may be, and the
    pool's device's synchronization does not wait for it; see
    :func:`any_queued_use`) the other devices are synchronized first; with
    one device that calls no driver. Raises what that raises, the epoch
    kept."""
    if other_devices:
        pool.backend.synchronize_other_devices()
    r = pool._residency
    r.arrival = None
    r.epoch += 1


def any_queued_use(pool):
    """Whether the last use of some live handle may still have GPU work
    queued (:func:`queued_uses`, up to the first)."""
    return next(queued_uses(pool), None) is not None


def queued_uses(pool):
    """The live handles whose last use may still have GPU work queued (a
    scan of the last uses)."""
    r, owned = pool._residency, pool._handles
    for row, (ticket, _, epoch) in r.last_use.items():
        if epoch == r.epoch:
            handle = owned[row]
            if handle is not None and handle._ticket == ticket:
                yield handle
