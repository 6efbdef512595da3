"""The real device, through Numba's driver bindings.

Every call runs in the Numba context the backend was made for; that context
must be current (it is inside Numba's memalloc, and numba_alloc's module
functions make it so).
"""

import weakref

import numpy as np
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.cudadrv.driver import CudaAPIError, MemoryPointer, binding, driver

from . import kernels
from .backend import Backend, DeviceOutOfMemory, Event

_OOM = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY


class CudaEvent(Event):
    """A timing-free event recorded on the legacy default stream, which
    completes only after work queued before it on every blocking stream."""

    __slots__ = ("_event", "_stream")

    def __init__(self, context):
        self._event = context.create_event(timing=False)
        self._stream = context.get_legacy_default_stream()

    def record(self):
        self._event.record(self._stream)

    def query(self):
        return self._event.query()


TABLE_ROWS = 4096          # moves per kernel launch (a larger table takes several)
THREADS = 256


def launch_config(nbytes):
    """(blocks, threads) for copying ``nbytes``: enough 16-byte words per
    thread to keep loads in flight, at most 8192 blocks."""
    words = max(1, nbytes // kernels.WORD)
    return min(8192, max(1, -(-words // (THREADS * 4)))), THREADS


class CudaDevice(Backend):
    """Segments from cuMemAlloc in one Numba context. Its scratch for
    defragmentation (the move counters and a move table) is reserved when it
    is made, outside the pool, so that moving never needs memory the device
    may no longer have."""

    name = "cuda"

    def __init__(self, context):
        self.context = context
        self.device_id = context.device.id
        self._scratch = self.allocate(kernels.COUNTERS * 8 + TABLE_ROWS * 3 * 8)
        self._counters = self._array(self._scratch, (kernels.COUNTERS,), np.int64)
        # zeroed by a plain driver call: Numba's array methods would ask for a
        # context, which re-enters the manager's initialize()
        driver.cuMemsetD8(binding.CUdeviceptr(self._scratch), 0, kernels.COUNTERS * 8)
        self._counts = (0,) * kernels.COUNTERS
        self._table = self._array(self._scratch + kernels.COUNTERS * 8, (TABLE_ROWS, 3), np.int64)

    def _array(self, address, shape, dtype):
        """A Numba device array over memory this backend owns (no finalizer)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        pointer = MemoryPointer(weakref.proxy(self.context), binding.CUdeviceptr(address), nbytes)
        strides = tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
        return DeviceNDArray(shape, strides, dtype, gpu_data=pointer)

    def allocate(self, nbytes):
        try:
            return int(driver.cuMemAlloc(nbytes))
        except CudaAPIError as e:
            if e.code == _OOM:
                raise DeviceOutOfMemory(str(e)) from None
            raise

    def release(self, address):
        driver.cuMemFree(binding.CUdeviceptr(address))

    def memory_info(self):
        free, total = driver.cuMemGetInfo()
        return int(free), int(total)

    def event(self):
        return CudaEvent(self.context)

    def synchronize(self):
        self.context.synchronize()

    def copy(self, batches, first):
        kernel = kernels.gpu_copy_moves()
        try:
            for (dst_address, dst_size), (src_address, src_size), table in batches:
                dst = self._array(dst_address, (dst_size,), np.uint8)
                src = self._array(src_address, (src_size,), np.uint8)
                dst_words, src_words = dst.view(np.complex128), src.view(np.complex128)
                for start in range(0, len(table), TABLE_ROWS):
                    rows = np.ascontiguousarray(table[start:start + TABLE_ROWS])
                    device_rows = self._table[:len(rows)]
                    device_rows.copy_to_device(rows)
                    blocks, threads = launch_config(int(rows[:, 2].sum()))
                    kernel[blocks, threads](dst, src, dst_words, src_words, device_rows,
                                            self._counters, first)
                    first = 0
        finally:
            self.context.synchronize()     # no copy still runs when this returns or raises
        self._counts = tuple(int(c) for c in self._counters.copy_to_host())

    def move_counters(self):
        """The counters as read when the last copy() finished (the device
        was idle then), so that reading stats never waits for the GPU."""
        return self._counts

    def __repr__(self):
        return f"CudaDevice({self.device_id})"
