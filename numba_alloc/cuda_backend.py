"""The real device, through Numba's driver bindings.

Every call runs in the Numba context the backend was made for; that context
must be current (it is inside Numba's memalloc, and numba_alloc's module
functions make it so).
"""

from numba.cuda.cudadrv.driver import CudaAPIError, binding, driver

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


class CudaDevice(Backend):
    """Segments from cuMemAlloc in one Numba context."""

    name = "cuda"

    def __init__(self, context):
        self.context = context
        self.device_id = context.device.id

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

    def __repr__(self):
        return f"CudaDevice({self.device_id})"
