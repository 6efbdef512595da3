"""The Numba plugin's Relocator: what the pool asks of the Numba glue when
blocks move or go to host memory (relocation.py makes Numba's pointers and
arrays follow, activity.py keeps the blocks of a launch resident)."""

from ..policy.block import ALLOCATED
from ..policy.core import held
from ..policy.errors import DefragmentationRefused
from ..policy.observers import Relocator
from . import activity, nrt
from .relocation import nrt_memsys_block, unsupported_reason


class NumbaRelocator(Relocator):
    """The relocator of a NumbaAllocManager; ``pointers`` is the manager's
    ``allocations`` (block -> PoolPointer)."""

    def __init__(self, pointers):
        self._pointers = pointers

    def pin_unmovable(self, pool):
        reason = unsupported_reason()
        if reason:
            raise DefragmentationRefused(reason)
        if not getattr(pool.backend, "copy_ready", True):
            raise DefragmentationRefused(
                pool.backend.copy_error or
                "the copy kernel is not loaded yet: it loads at the first allocation with "
                "defrag on, and in numba_alloc.defragment(), never under the pool's lock")
        if activity.preparing_arguments() and not activity.keeps_in_place(pool):
            raise DefragmentationRefused(
                "a kernel launch on this thread is preparing its arguments, whose addresses "
                "it reads, and has not queued the kernel yet (a request from an argument "
                "extension, or staging host arrays): nothing may move (with the pool's "
                "reclaim on, the launch hooks keep its arrays in place)")
        self.pin_unreclaimable(pool)

    def pin_unreclaimable(self, pool):
        """Pin NRT's memsys (its address is in a device global)."""
        block = nrt_memsys_block()
        if block is not None and block.pool is pool and block.state is ALLOCATED and not block.pinned:
            pool.pin(block)

    def movable(self, block):
        return block in self._pointers     # else its pointer is still being made

    def movable_blocks(self, handles, rows):
        return held(handles, rows, self._pointers)

    def reclaim_refused(self):
        return activity.unsupported_reason()

    def nrt_heap_refused(self):
        return nrt.unsupported_reason() or nrt.switch_on_refused()

    def reclaim_ready(self, pool):
        return activity.settle(pool)

    def reclaiming(self, pool, on):
        activity.reclaiming(pool, on)

    def relocated(self, pool, moves):
        for block, _ in moves:
            pointer = self._pointers.get(block)
            if pointer is not None:
                pointer.relocate()
