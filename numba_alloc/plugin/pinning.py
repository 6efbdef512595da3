"""``numba_alloc.pin``: keep an allocation where it is during defragmentation."""

from ..policy.block import Block


def _block(obj):
    """The pool block behind a Numba device array or pointer, or a Block."""
    if isinstance(obj, Block):
        return obj
    from numba import cuda
    block = None
    if not cuda.config.ENABLE_CUDASIM:      # the simulator has no plugin, so no pool arrays
        from .relocation import block_of
        block = block_of(getattr(obj, "gpu_data", obj))
    if block is None:
        raise ValueError(f"pin: {obj!r} is not memory numba_alloc allocated (expected a "
                         "Numba device array or pointer from the plugin, or a pool Block)")
    return block


class pin:
    """Keep ``obj`` (a Numba device array, a view of one, or a pool Block)
    at its address: its block is never moved by defragmentation.

    ``pin(array)`` pins for good, for an address that has left Numba (a raw
    integer, cuda-python, a library that kept it). ``with pin(array):`` pins
    only inside the block. Raises ValueError for memory not from the pool.
    Pinning a view pins its whole allocation.
    """

    def __init__(self, obj):
        self.block = _block(obj)
        self._obj = obj
        self.block.pool.pin(self.block)

    def __enter__(self):
        return self._obj

    def __exit__(self, *exc):
        self.block.pool.unpin(self.block)
        return False
