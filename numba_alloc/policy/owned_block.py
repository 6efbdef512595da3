"""A block that frees itself when its owner is garbage, as Numba's arrays
free theirs: :class:`OwnedBlock`, from :meth:`Pool.malloc_owned`.

A :class:`~numba_alloc.policy.block.Block` from ``Pool.malloc`` is freed
only by ``Pool.free``: the pool keeps every live block's handle (so a lost
handle is never garbage, and its bytes stay allocated). An OwnedBlock is
the user's only reference that matters: when it is garbage its block goes
to :meth:`Pool.free_later`, and is freed at the pool's next operation, so
dropping it (or the frames of a failed cell's traceback that hold it, as
the IPython extension does after an out-of-memory error) frees its bytes.
"""

import weakref


class OwnedBlock:
    """Owns one live block of a pool. ``block``: its
    :class:`~numba_alloc.policy.block.Block` handle (for ``pool.use``,
    ``pool.pin``, ...; freeing that handle with ``pool.free`` is allowed,
    the owner then frees nothing); ``address``, ``size``,
    ``allocated_size``: the block's. Thread safe as the pool is; creating
    one costs a ``weakref.finalize`` on top of ``Pool.malloc``."""

    __slots__ = ("block", "_finalizer", "__weakref__")

    def __init__(self, pool, block):
        self.block = block
        self._finalizer = weakref.finalize(self, pool.free_later, block)

    @property
    def address(self) -> int:
        return self.block.address

    @property
    def size(self) -> int:
        return self.block.size

    @property
    def allocated_size(self) -> int:
        return self.block.allocated_size

    def free(self) -> None:
        """Free the block now (as ``Pool.free``); afterwards this owner frees
        nothing, and a second call does nothing. ValueError as ``Pool.free``
        when the block was already freed through its handle."""
        if self._finalizer.detach() is not None:
            self.block.pool.free(self.block)

    def __repr__(self):
        return f"OwnedBlock({self.block!r})"
