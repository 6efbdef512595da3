"""What reclaim knows of a pool's live blocks (:class:`Residency`): the
blocks in host memory, those in use, when each was last used and what GPU
work of that use may still run. Not thread safe: the pool's lock guards it."""

import weakref
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

    __slots__ = ("reclaimed", "active", "last_use", "streams", "arrival", "host_bytes")

    def __init__(self):
        self.reclaimed = {}                         # handle -> Reclaimed
        self.active = {}                            # handle -> nesting of Pool.use
        # handle -> (the allocation clock, the core's H_GEN, at the end of its
        # last use: recency, against the generation of blocks never used;
        # the (event, stream) of its uses whose work may still be running,
        # None once all of it has completed: see running)
        self.last_use = weakref.WeakKeyDictionary()
        self.streams = False        # a use has ended on a stream other than 0
        # an event after the latest copies that brought blocks back (queued on
        # the legacy default stream), None once they are known to be done
        self.arrival = None
        self.host_bytes = 0         # bytes of the chunks reclaimed blocks hold (host_limit's)


def record_event(backend, stream=0):
    """An event recorded now (on ``stream`` when it is not 0: a Numba
    stream), or one that never completes if that fails."""
    try:
        event = backend.event()
        if stream:
            event.record_on(stream)
        else:
            event.record()
        return event
    except Exception:       # noqa: BLE001 (protected until a synchronize instead)
        return NEVER


def running(previous, mark, stream):
    """What a block's use ending now leaves it waiting for: ``mark``, this
    use's (event, ``stream``) (None: its work has completed), and the marks
    of ``previous`` (its last_use entry) on other streams whose events have
    not completed: an event on one stream does not wait for another's work.
    None when there is nothing to wait for."""
    kept = ()
    if previous is not None and previous[1]:
        kept = tuple(m for m in previous[1] if m[1] is not stream and not m[0].query())
    if mark is not None:
        kept += (mark,)
    return kept or None


def device_idle(pool):
    """Every copy queued so far has completed (the device was synchronized):
    no block is busy, and no copy bringing blocks back is under way."""
    pool._residency.arrival = None
    last_use = pool._residency.last_use
    for handle, (clock, marks) in list(last_use.items()):
        if marks is not None:
            last_use[handle] = (clock, None)
