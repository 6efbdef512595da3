"""Arrays on a real GPU through ``numba.cuda``, under whatever memory manager
Numba uses in this process.

An allocation is ``cuda.device_array`` and a free drops the only reference
to it, so the manager's release (or, for Numba's default manager, the queue
of pending deallocations) runs inside the timed call. Kernels are compiled
with ``cuda.jit`` on first use (cached on disk), so a warm-up run keeps
compilation out of the figures.
"""

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError, binding

from .arrays import Arrays, DeviceArray

_THREADS_1D = 256
_THREADS_2D = (16, 16)
_MAX_BLOCKS_1D = 4096           # grid-stride kernels: more blocks only add launch cost
_MAX_BLOCKS_2D = 128


def launch_grid(shape):
    """``(blocks, threads)`` covering ``shape`` (an int or a 2-tuple)."""
    if isinstance(shape, (int, np.integer)) or len(shape) == 1:
        n = int(shape if isinstance(shape, (int, np.integer)) else shape[0])
        return min(max(1, -(-n // _THREADS_1D)), _MAX_BLOCKS_1D), _THREADS_1D
    blocks = tuple(min(max(1, -(-int(n) // t)), _MAX_BLOCKS_2D)
                   for n, t in zip(shape, _THREADS_2D))
    return blocks, _THREADS_2D


class CudaArrays(Arrays):
    """Device arrays of the current CUDA context."""

    _compiled = {}              # kernel function -> cuda.jit dispatcher (per process)

    def launch(self, kernel, shape, *args):
        compiled = self._compiled.get(kernel)
        if compiled is None:
            compiled = self._compiled[kernel] = cuda.jit(kernel, cache=True)
        blocks, threads = launch_grid(shape)
        compiled[blocks, threads](*[a.data if isinstance(a, DeviceArray) else a for a in args])

    def to_host(self, array):
        return array.data.copy_to_host()

    def synchronize(self):
        cuda.synchronize()

    def _allocate(self, shape, dtype, nbytes):
        return cuda.device_array(shape, dtype=dtype)

    def _release(self, array):
        array.data = None       # the last reference: the manager frees it now

    def _copy_in(self, array, host):
        array.data.copy_to_device(host)

    def _is_out_of_memory(self, error):
        """Numba's (and numba_alloc's) CUDA_ERROR_OUT_OF_MEMORY, RMM's
        ``MemoryError`` (bad_alloc) and CuPy's OutOfMemoryError (a
        MemoryError)."""
        if isinstance(error, CudaAPIError):
            return error.code == binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        return isinstance(error, MemoryError)
