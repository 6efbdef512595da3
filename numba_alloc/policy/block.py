"""Segments (device allocations) and the handles of the blocks cut from them
(:class:`Block`, compiled with the core: _core.pyx's core_handles.pxi).

A segment is one allocation from the backend (one cuMemAlloc). Its blocks
tile it exactly, in address order; they are rows of the pool's compiled core
(numba_alloc.policy.core), linked by row index. These objects belong to a
:class:`~numba_alloc.policy.pool.Pool` and are read and written only under its lock.
"""

from .core import ADDR, NF, SIZE, TABLE, Block  # noqa: F401 (Block: the handles, compiled)

ALLOCATED = "allocated"  # handed to a user, not yet freed
PENDING = "pending"      # freed, but GPU work queued before the free may still use it
FREE = "free"            # reusable
DEAD = "dead"            # freed and reusable again (its bytes are free or handed out anew)

SMALL = 0  # the pool kinds, also indexes into per-kind lists
LARGE = 1


class Segment:
    """One backend allocation: ``address`` and ``size`` in bytes, and the
    pool (``SMALL`` or ``LARGE``) it serves. ``oversize`` marks a segment
    of max_split_size or more made for a request, ``big`` one made for a
    request of MIN_LARGE_ALLOC or more (sizes.py). ``row`` is the core row
    of its first block. ``serial``: how many segments its pool had reserved
    before it (so later segments have larger ones). ``mapped``: a run of
    pages under the pool's reserved range (expandable_segments), which grows
    by joining the runs it touches and is cut in two by unmapping pages."""

    __slots__ = ("address", "size", "kind", "oversize", "big", "row", "serial", "mapped")

    def __init__(self, address, size, kind, oversize, big, serial, mapped=False):
        self.address = address
        self.size = size
        self.kind = kind
        self.oversize = oversize
        self.big = big
        self.row = -1
        self.serial = serial
        self.mapped = mapped

    def __repr__(self):
        return f"Segment(address={self.address:#x}, size={self.size}, kind={self.kind})"


def keep_values(block, mv, row):
    """Keep the address and allocated size of ``block`` at ``row`` in its
    handle, before the block is freed (its row may then change)."""
    r = TABLE + row * NF
    block._address, block._allocated_size = mv[r + ADDR], mv[r + SIZE]
