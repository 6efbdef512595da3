"""Segments (device allocations) and the handles of the blocks cut from them.

A segment is one allocation from the backend (one cuMemAlloc). Its blocks
tile it exactly, in address order; they are rows of the pool's compiled core
(numba_alloc.policy.core), linked by row index. These objects belong to a
:class:`~numba_alloc.policy.pool.Pool` and are read and written only under its lock.
"""

from .core import ADDR, NF, ROW_MASK, SIZE, TABLE

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
    its first block. ``serial``: how many segments its pool had reserved
    before it (so later segments have larger ones)."""

    __slots__ = ("address", "size", "kind", "oversize", "row", "serial")

    def __init__(self, address, size, kind, oversize, serial):
        self.address = address
        self.size = size
        self.kind = kind
        self.oversize = oversize
        self.row = -1
        self.serial = serial

    def __repr__(self):
        return f"Segment(address={self.address:#x}, size={self.size}, kind={self.kind})"


class Block:
    """The handle :meth:`Pool.malloc` returns for a block.

    ``address`` (int; it changes when defragmentation moves the block),
    ``size`` (bytes requested; ``requested_size`` is PyTorch's name for it)
    and ``allocated_size`` (bytes reserved for it, a multiple of 512; a
    snapshot's block ``size`` is this one, as in PyTorch's). ``address`` and
    ``allocated_size`` are read from the pool's core until a value is kept
    in the handle: the pool keeps both when it frees, reclaims or resets
    the block; so a dead handle keeps the values it had, and a copy of a
    handle those of when it was made. ``state``
    is ALLOCATED, then PENDING once freed, then DEAD once its bytes are
    reusable; ``pinned`` counts the reasons the block must not move (see
    Pool.pin); ``segment`` is the :class:`Segment` holding a live block
    (None once dead). Those three are read from the pool's core. A handle
    is never handed out twice, so a stale one is always recognised.
    """

    # _address, _allocated_size: None while read from the core
    __slots__ = ("size", "pool", "_ticket", "_address", "_allocated_size", "__weakref__")

    @property
    def address(self):
        address = self._address
        if address is None:
            return self.pool._mv[TABLE + (self._ticket & ROW_MASK) * NF + ADDR]
        return address

    @address.setter
    def address(self, address):
        self._address = address

    @property
    def allocated_size(self):
        allocated_size = self._allocated_size
        if allocated_size is None:
            return self.pool._mv[TABLE + (self._ticket & ROW_MASK) * NF + SIZE]
        return allocated_size

    @allocated_size.setter
    def allocated_size(self, allocated_size):
        self._allocated_size = allocated_size

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

    def __getstate__(self):
        """What copy.copy and pickle take: a copy keeps the values of now."""
        state = object.__getstate__(self)
        slots = state[1] if state else {}
        for name in ("address", "allocated_size"):
            if slots.get("_" + name, 0) is None:
                slots["_" + name] = getattr(self, name)
        return state

    def __repr__(self):
        return (f"Block(address={self.address:#x}, size={self.size}, "
                f"allocated_size={self.allocated_size}, state={self.state})")


def keep_values(block, mv, row):
    """Keep the address and allocated size of ``block`` at ``row`` in its
    handle, before the block is freed (its row may then change)."""
    r = TABLE + row * NF
    block._address, block._allocated_size = mv[r + ADDR], mv[r + SIZE]
