"""A simulated device whose backend calls can be made to fail, as a driver
call fails on a GPU (cuMemAlloc, cuMemFree, cuMemMap, cuMemUnmap, a remap,
cuEventRecord, cuEventQuery, cuCtxSynchronize, a kernel launch)."""

from numba_alloc import SimulatedDevice
from numba_alloc.backends.simulated import SimulatedEvent

PAGE_CALLS = ("map_pages", "unmap_pages", "remap_pages")      # with expandable_segments
# called only where a test arranges it (runs moved together by defrag)
ARRANGED_CALLS = ("remap_pages",)
HOST_CALLS = ("host_allocate", "host_release", "copy_to_host", "copy_from_host")   # no pool's
CALLS = ("allocate", "release", "memory_info", "event", "record", "query",
         "synchronize", "copy") + PAGE_CALLS + HOST_CALLS


class InjectedFault(RuntimeError):
    """What a failing backend call raises (not DeviceOutOfMemory)."""


class FaultyEvent(SimulatedEvent):
    __slots__ = ()

    def record(self):
        self._device._maybe_fail("record")
        super().record()

    def query(self):
        self._device._maybe_fail("query")
        return super().query()


class FaultyDevice(SimulatedDevice):
    """``fail(call, skip=0, times=1)``: the call named (one of CALLS) raises
    InjectedFault ``times`` times, after ``skip`` calls that succeed."""

    def __init__(self, capacity, device_id=0):
        super().__init__(capacity, device_id)
        self._faults = {}
        self.calls = dict.fromkeys(CALLS, 0)
        self.fired = dict.fromkeys(CALLS, 0)   # failures raised, by call

    def fail(self, call, skip=0, times=1):
        assert call in CALLS, call
        self._faults[call] = [skip, times]

    def heal(self):
        self._faults.clear()

    def _maybe_fail(self, call):
        self.calls[call] += 1
        fault = self._faults.get(call)
        if fault is None:
            return
        if fault[0]:
            fault[0] -= 1
            return
        fault[1] -= 1
        if not fault[1]:
            del self._faults[call]
        self.fired[call] += 1
        raise InjectedFault(f"injected failure of {call}")

    def allocate(self, nbytes):
        self._maybe_fail("allocate")
        return super().allocate(nbytes)

    def release(self, address):
        self._maybe_fail("release")
        super().release(address)

    def map_pages(self, address, nbytes):
        self._maybe_fail("map_pages")
        super().map_pages(address, nbytes)

    def unmap_pages(self, address, nbytes):
        self._maybe_fail("unmap_pages")
        super().unmap_pages(address, nbytes)

    def remap_pages(self, address, nbytes, to):
        self._maybe_fail("remap_pages")
        super().remap_pages(address, nbytes, to)

    def memory_info(self):
        self._maybe_fail("memory_info")
        return super().memory_info()

    def event(self):
        self._maybe_fail("event")
        return FaultyEvent(self)

    def synchronize(self):
        self._maybe_fail("synchronize")
        super().synchronize()

    def host_allocate(self, nbytes, flags=0):
        self._maybe_fail("host_allocate")
        return super().host_allocate(nbytes, flags)

    def host_release(self, buffer):
        self._maybe_fail("host_release")
        super().host_release(buffer)

    def copy_to_host(self, address, buffer, nbytes):
        self._maybe_fail("copy_to_host")
        super().copy_to_host(address, buffer, nbytes)

    def copy_from_host(self, buffer, address, nbytes):
        self._maybe_fail("copy_from_host")
        super().copy_from_host(buffer, address, nbytes)

    def _copy(self, batches, first):
        """Fails after copying the first batch when armed: a launch that
        fails after earlier launches of the same phase ran, raised by the
        queued copy, as a GPU's failed copy is by the wait for it."""
        fault = self._faults.get("copy")
        if fault is not None and not fault[0] and len(batches) > 1:
            super()._copy(batches[:1], first)
        self._maybe_fail("copy")
        super()._copy(batches, first)
