"""The error a request that cannot be met raises.

It is Numba's CudaAPIError with code CUDA_ERROR_OUT_OF_MEMORY, so Numba's own
retry (HostOnlyCUDAMemoryManager._attempt_allocation) and users' handlers
keep working, and a MemoryError, so generic handlers catch it too.
"""

from numba.cuda.cudadrv.driver import CudaAPIError

try:
    from cuda.bindings.driver import CUresult
    CUDA_ERROR_OUT_OF_MEMORY = CUresult.CUDA_ERROR_OUT_OF_MEMORY
except ImportError:  # pragma: no cover - cuda-bindings comes with numba-cuda
    CUDA_ERROR_OUT_OF_MEMORY = 2


class OutOfMemoryError(CudaAPIError, MemoryError):
    """Raised by the pool when a request cannot be met. ``code`` is
    CUDA_ERROR_OUT_OF_MEMORY; the message says what was asked, the device's
    total and free memory, the pool's allocated and cached bytes, its largest
    free block, and which setting could help."""

    def __init__(self, msg):
        self.code = CUDA_ERROR_OUT_OF_MEMORY
        self.msg = msg
        Exception.__init__(self, self.code, msg)

    def __str__(self):
        return f"[{self.code}] {self.msg}"

    def __reduce__(self):
        return (type(self), (self.msg,))


class DefragmentationError(RuntimeError):
    """A copy kernel failed during defragmentation. The blocks of the failed
    phase keep their old addresses and data; the pool stays consistent."""


class DefragmentationRefused(RuntimeError):
    """Moving blocks is not safe here (the reason says why); nothing moved."""
