"""Segments (device allocations) and the blocks they are cut into.

A segment is one allocation from the backend (one cuMemAlloc). Its blocks
tile it exactly, in address order, linked through ``prev``/``next``. These
objects belong to a :class:`~numba_alloc.pool.Pool` and are read and written
only under its lock.
"""

ALLOCATED = "allocated"  # handed to a user, not yet freed
PENDING = "pending"      # freed, but GPU work queued before the free may still use it
FREE = "free"            # reusable
DEAD = "dead"            # merged into a neighbour, handed out anew, or released

SMALL = 0  # the pool kinds, also indexes into per-kind lists
LARGE = 1


class Segment:
    """One backend allocation: ``address`` and ``size`` in bytes, and the
    pool (``SMALL`` or ``LARGE``) it serves. ``oversize`` marks a segment
    made for a request of max_split_size or more."""

    __slots__ = ("address", "size", "kind", "oversize", "first")

    def __init__(self, address, size, kind, oversize):
        self.address = address
        self.size = size
        self.kind = kind
        self.oversize = oversize
        self.first = None

    @property
    def is_free(self):
        """True when one free block covers the whole segment."""
        first = self.first
        return first.state is FREE and first.next is None

    def blocks(self):
        """The segment's blocks in address order."""
        block = self.first
        while block is not None:
            yield block
            block = block.next

    def __repr__(self):
        return f"Segment(address={self.address:#x}, size={self.size}, kind={self.kind})"


class Block:
    """A piece of a segment.

    For a user this is the handle :meth:`Pool.malloc` returns: ``address``
    (int), ``size`` (bytes requested) and ``allocated_size`` (bytes reserved
    for it, a multiple of 512). A handle is never handed out twice, so a
    stale one is always recognised. ``pinned`` counts the reasons the block
    must not move (see Pool.pin); a pinned block is never moved.
    """

    __slots__ = ("address", "allocated_size", "size", "segment", "prev", "next",
                 "state", "pool", "pinned", "__weakref__")

    def __init__(self, address, allocated_size, segment, pool, state):
        self.address = address
        self.allocated_size = allocated_size
        self.size = 0
        self.segment = segment
        self.prev = None
        self.next = None
        self.state = state
        self.pool = pool
        self.pinned = 0

    @property
    def is_split(self):
        """True when the block shares its segment with other blocks."""
        return self.prev is not None or self.next is not None

    def __repr__(self):
        return (f"Block(address={self.address:#x}, size={self.size}, "
                f"allocated_size={self.allocated_size}, state={self.state})")
