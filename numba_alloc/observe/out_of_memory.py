"""The error a request that cannot be met raises: :class:`OutOfMemoryError`.

Its own module because it subclasses Numba's CudaAPIError, and importing
that imports numba.cuda: :mod:`numba_alloc.policy.errors` (and the package) import
this module on first use of the name.
"""

from numba.cuda.cudadrv.driver import CudaAPIError

from .summary import out_of_memory_message

try:
    from cuda.bindings.driver import CUresult
    CUDA_ERROR_OUT_OF_MEMORY = CUresult.CUDA_ERROR_OUT_OF_MEMORY
except ImportError:  # pragma: no cover - cuda-bindings comes with numba-cuda
    CUDA_ERROR_OUT_OF_MEMORY = 2


class OutOfMemoryError(CudaAPIError, MemoryError):
    """Raised by the pool when a request cannot be met. ``code`` is
    CUDA_ERROR_OUT_OF_MEMORY; the message says what was asked, the device's
    total and free memory, the pool's allocated and cached bytes, its largest
    free block, and which setting could help. ``report``: the pool's
    :class:`~numba_alloc.policy.errors.OutOfMemoryReport` (None when made from a message alone)."""

    def __init__(self, msg, report=None):
        self.code = CUDA_ERROR_OUT_OF_MEMORY
        self.msg = msg
        self.report = report
        Exception.__init__(self, self.code, msg)

    @classmethod
    def from_report(cls, report):
        """The error for an :class:`OutOfMemoryReport`, with its message."""
        return cls(out_of_memory_message(report), report)

    def __str__(self):
        """The message; on a GPU (or when the device is not known) after
        the driver's code, as Numba's CudaAPIError shows it. A simulated
        device has no driver: its message starts with what was asked."""
        if self.report is not None and self.report.device_name != "cuda":
            return self.msg
        return f"[{self.code}] {self.msg}"

    def __reduce__(self):
        return (type(self), (self.msg, self.report))
