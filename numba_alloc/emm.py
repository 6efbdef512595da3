"""Numba's External Memory Management plugin: thin glue over the pool.

``NUMBA_CUDA_MEMORY_MANAGER=numba_alloc`` makes Numba build one
:class:`NumbaAllocManager` per context (that is, per device: Numba uses the
primary context). Constructing it with ``context=None``, as
``set_memory_manager`` does, makes no CUDA call.
"""

import contextlib
import weakref

from numba.cuda.cudadrv.driver import (
    AutoFreePointer,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    MemoryInfo,
    binding,
)

from . import registry
from .block import ALLOCATED
from .cuda_backend import CudaDevice


class PoolPointer(AutoFreePointer):
    """The pointer memalloc returns: Numba's AutoFreePointer (freed when the
    last OwnedPointer to it goes) that knows its pool ``block``. Its
    ``device_pointer``/``handle`` is one CUdeviceptr object, so changing that
    object's value moves every reader that reads it live."""

    def __init__(self, context, block, finalizer):
        super().__init__(context, binding.CUdeviceptr(block.address), block.size,
                         finalizer=finalizer)
        self.block = block


def _free_block(pool, block, allocations):
    """The finalizer of a PoolPointer: drop the manager's reference and free
    the block. Harmless after the pool's reset (the block is no longer live)
    and at interpreter exit (no driver call)."""
    def free():
        allocations.pop(block, None)
        if block.state is ALLOCATED:
            pool.free(block)
    return free


class NumbaAllocManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Device memory from numba_alloc's pool; host memory as Numba does it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = None

    def initialize(self):
        """Create the device's pool (no device memory yet). Numba calls this
        on some paths to a context and not on others, so every entry point
        that needs the pool calls it too; the context must be current."""
        if self.pool is None:
            self.pool = registry.create_pool(CudaDevice(self.context))
            self.deallocations.memory_capacity = self.pool.total_memory()
        return self.pool

    def memalloc(self, size):
        pool = self.pool or self.initialize()
        block = pool.malloc(size)
        ctx = weakref.proxy(self.context)
        mem = PoolPointer(ctx, block, _free_block(pool, block, self.allocations))
        # As Numba's own manager: the manager holds the pointer, its
        # OwnedPointers count references, and the last one frees it.
        self.allocations[block] = mem
        return mem.own()

    def get_memory_info(self):
        """(free, total) bytes, where free is the device's free memory plus
        the bytes the pool holds in free, reusable blocks."""
        pool = self.pool or self.initialize()
        free, total = pool.backend.memory_info()
        return MemoryInfo(free=free + pool.get_bytes_inactive(), total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle for a block inside a pool segment (the segment's
        base plus the block's offset). The block is pinned: it never moves."""
        block = getattr(memory.owner, "block", None)
        if block is not None:
            self.pool.pin(block)
        return super().get_ipc_handle(memory)

    def reset(self):
        super().reset()
        if self.pool is not None:
            self.pool.reset()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, freed blocks are not made reusable."""
        with super().defer_cleanup(), (self.pool or self.initialize()).hold_frees():
            yield

    @property
    def interface_version(self):
        return 1
