"""Arrays carved from numba_alloc's pool on a simulated device, no GPU needed.

Every allocation is ``pool.malloc`` and every free ``pool.free``, timed by
:class:`~kernels.arrays.Arrays`. The device runs its work in order and
trails the host by ``lag`` launches (then everything queued has run after
:meth:`SimulatedArrays.to_host` or :meth:`~SimulatedArrays.synchronize`), so
frees wait for the work queued before them as on a GPU.

With ``compute=True`` an array's bytes live in the simulated device's
memory, all bits set (NaN) until written, so reading memory no kernel wrote
spoils a result: an upload is queued as a device write, and a launch queues the
kernel as device work that reads its arrays (at the addresses they had when
it was launched), runs the kernel through Numba's CUDA simulator and writes
them back. Use it at tiny sizes: the simulator runs one Python thread per
GPU thread. With ``compute=False`` launches only occupy the queue and
:meth:`~SimulatedArrays.to_host` returns None: the allocation sequence runs
at any size in seconds.
"""

from typing import NamedTuple

import numpy as np
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
from numba.cuda.simulator.kernel import FakeCUDAKernel

from numba_alloc import OutOfMemoryError

from .arrays import Arrays, DeviceArray

LAG = 2                         # launches the simulated device trails the host by
_GRID_1D = (1, 8)               # simulator threads are Python threads: few of them
_GRID_2D = ((1, 1), (4, 4))


class _Span(NamedTuple):
    """Where a kernel argument's bytes were when the kernel was launched."""
    address: int
    nbytes: int
    dtype: np.dtype
    shape: tuple


class SimulatedArrays(Arrays):
    """Arrays from ``pool`` (a :class:`numba_alloc.Pool` whose backend is a
    :class:`numba_alloc.SimulatedDevice`)."""

    def __init__(self, pool, compute, lag=LAG, probe=None):
        super().__init__(probe)
        self.pool = pool
        self.device = pool.backend
        self.computes = compute
        self.lag = lag
        self._kernels = {}

    def launch(self, kernel, shape, *args):
        self._queue(self._kernel_work(kernel, shape, args) if self.computes else None)

    def _kernel_work(self, kernel, shape, args):
        """Device work running ``kernel`` through the CUDA simulator on its
        arrays' bytes, at the addresses they have now."""
        compiled = self._kernels.get(kernel)
        if compiled is None:
            compiled = self._kernels[kernel] = FakeCUDAKernel(kernel, device=False)
        grid = _GRID_1D if isinstance(shape, (int, np.integer)) or len(shape) == 1 else _GRID_2D
        bound = [_Span(a.data.address, a.nbytes, a.dtype, a.shape)
                 if isinstance(a, DeviceArray) else a for a in args]

        def work():
            values = {b: self.device.read(b.address, b.nbytes).view(b.dtype).reshape(b.shape)
                      for b in bound if isinstance(b, _Span)}
            # as the simulator's device arrays they are used in place (an
            # array passed twice is one array, as on a GPU)
            on_device = {b: FakeCUDAArray(value) for b, value in values.items()}
            compiled[grid](*[on_device[b] if isinstance(b, _Span) else b for b in bound])
            for span, value in values.items():
                self.device.write(span.address, value)
        return work

    def to_host(self, array):
        self.device.synchronize()
        if not self.computes:
            return None
        data = self.device.read(array.data.address, array.nbytes)
        return data.view(array.dtype).reshape(array.shape)

    def synchronize(self):
        self.device.synchronize()

    def _queue(self, work):
        self.device.launch(work)
        behind = self.device.pending_work - self.lag
        if behind > 0:
            self.device.complete(behind)

    def _allocate(self, shape, dtype, nbytes):
        block = self.pool.malloc(nbytes)
        if self.computes:       # uninitialized memory, as a GPU's: all bits set (NaN)
            self.device.write(block.address, np.full(nbytes, 0xFF, np.uint8))
        return block

    def _release(self, array):
        self.pool.free(array.data)
        array.data = None

    def _copy_in(self, array, host):
        if not self.computes:
            self._queue(None)
            return
        address, data = array.data.address, host.copy()
        self._queue(lambda: self.device.write(address, data))

    def _is_out_of_memory(self, error):
        return isinstance(error, OutOfMemoryError)
