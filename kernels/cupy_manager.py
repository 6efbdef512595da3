"""CuPy's MemoryPool as a Numba memory manager, for the benchmark:
``NUMBA_CUDA_MEMORY_MANAGER=numba_alloc.workloads.cupy_manager``.

Each ``memalloc`` takes a block from one ``cupy.cuda.MemoryPool`` (its own,
not CuPy's default pool, so the benchmark reads what Numba's arrays hold);
the manager keeps CuPy's MemoryPointer alive until Numba's pointer is
finalized, which returns the block to CuPy's pool. CuPy and Numba share the
device's primary context.
"""

import cupy
from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
from numba.cuda.cudadrv.driver import GetIpcHandleMixin, MemoryInfo, binding


class CuPyPoolManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Device memory from a CuPy MemoryPool; host memory as Numba does it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = None

    def initialize(self):
        if self.pool is None:
            self.pool = cupy.cuda.MemoryPool()

    def memalloc(self, size):
        if self.pool is None:
            self.initialize()
        memory = self.pool.malloc(size)
        address = int(memory.ptr)
        allocations = self.allocations
        allocations[address] = memory

        def release():
            allocations.pop(address, None)      # CuPy's pointer goes: the block returns to the pool

        return MemoryPointer(self.context, binding.CUdeviceptr(address), size, finalizer=release)

    def get_memory_info(self):
        free, total = cupy.cuda.runtime.memGetInfo()
        return MemoryInfo(free=free, total=total)

    def reset(self):
        super().reset()
        if self.pool is not None:
            self.pool.free_all_blocks()

    @property
    def interface_version(self):
        return 1


_numba_memory_manager = CuPyPoolManager
