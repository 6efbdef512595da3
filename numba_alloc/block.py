"""Segments (device allocations) and the handles of the blocks cut from them.

A segment is one allocation from the backend (one cuMemAlloc). Its blocks
tile it exactly, in address order; they are rows of the pool's compiled core
(numba_alloc.core), linked by row index. These objects belong to a
:class:`~numba_alloc.pool.Pool` and are read and written only under its lock.
"""

ALLOCATED = "allocated"  # handed to a user, not yet freed
PENDING = "pending"      # freed, but GPU work queued before the free may still use it
FREE = "free"            # reusable
DEAD = "dead"            # freed and reusable again (its bytes are free or handed out anew)

SMALL = 0  # the pool kinds, also indexes into per-kind lists
LARGE = 1


class Segment:
    """One backend allocation: ``address`` and ``size`` in bytes, and the
    pool (``SMALL`` or ``LARGE``) it serves. ``oversize`` marks a segment
    made for a request of max_split_size or more. ``row`` is the core row of
    its first block."""

    __slots__ = ("address", "size", "kind", "oversize", "row")

    def __init__(self, address, size, kind, oversize):
        self.address = address
        self.size = size
        self.kind = kind
        self.oversize = oversize
        self.row = -1

    def __repr__(self):
        return f"Segment(address={self.address:#x}, size={self.size}, kind={self.kind})"


class Block:
    """The handle :meth:`Pool.malloc` returns for a block.

    ``address`` (int; defragmentation updates it when the block moves),
    ``size`` (bytes requested; ``requested_size`` is PyTorch's name for it)
    and ``allocated_size`` (bytes reserved for it, a multiple of 512; a
    snapshot's block ``size`` is this one, as in PyTorch's) are plain slots
    set when the block is handed out. ``state`` is ALLOCATED, then PENDING
    once freed, then DEAD once its bytes are reusable; ``pinned`` counts the
    reasons the block must not move (see Pool.pin); ``segment`` is the
    :class:`Segment` holding a live block (None once dead). Those three are
    read from the pool's core. A handle is never handed out twice, so a
    stale one is always recognised.
    """

    __slots__ = ("address", "size", "allocated_size", "pool", "_ticket", "__weakref__")

    @property
    def requested_size(self):
        return self.size

    @property
    def state(self):
        return self.pool.state_of(self)

    @property
    def pinned(self):
        return self.pool.pins_of(self)

    @property
    def resident(self):
        """True while the block is live with device memory; False once it
        is dead, and while reclaim keeps its bytes in host memory (its
        address then means nothing until Pool.use brings it back)."""
        return self.pool.is_resident(self)

    @property
    def segment(self):
        return self.pool.segment_of(self)

    def __repr__(self):
        return (f"Block(address={self.address:#x}, size={self.size}, "
                f"allocated_size={self.allocated_size}, state={self.state})")
