"""The stand-in for ``cuda.bindings.driver`` that numba-cuda's driver layer
calls: every ``cu*`` function it uses, with the real module's calling
convention (a tuple: the CUresult, then the values) and its types, enums
and constants (taken from the real module, which imports without a
driver). A ``cu*`` function this stand-in lacks raises NotImplementedError
naming it, so a numba-cuda that calls something new fails loudly.

Every address a call takes is checked (memory.Memory); a refused call is
recorded (StandInDriver.errors) and answered with the driver's error code.
While ``StandInDriver.calls`` is a list, every call is appended to it
(:class:`Call`).
"""

import collections
import contextlib
import ctypes
import threading
from typing import NamedTuple

from cuda.bindings import driver as _real

from .memory import AddressError
from .work import WorkFailed

R = _real.CUresult
SUCCESS = R.CUDA_SUCCESS

# what cuDeviceGetAttribute answers (an H100's values where they matter)
ATTRIBUTES = {
    "MULTIPROCESSOR_COUNT": 132, "MAX_THREADS_PER_BLOCK": 1024, "WARP_SIZE": 32,
    "MAX_BLOCK_DIM_X": 1024, "MAX_BLOCK_DIM_Y": 1024, "MAX_BLOCK_DIM_Z": 64,
    "MAX_GRID_DIM_X": 2**31 - 1, "MAX_GRID_DIM_Y": 65535, "MAX_GRID_DIM_Z": 65535,
    "MAX_SHARED_MEMORY_PER_BLOCK": 49152, "CAN_MAP_HOST_MEMORY": 1,
    "UNIFIED_ADDRESSING": 1, "CONCURRENT_MANAGED_ACCESS": 1, "MANAGED_MEMORY": 1,
    "COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0, "PCI_DOMAIN_ID": 0,
    "PCI_BUS_ID": 0x1b, "PCI_DEVICE_ID": 0, "ASYNC_ENGINE_COUNT": 2,
    "COOPERATIVE_LAUNCH": 1, "CLOCK_RATE": 1980000, "MEMORY_CLOCK_RATE": 2619000,
    "GLOBAL_MEMORY_BUS_WIDTH": 5120, "L2_CACHE_SIZE": 52428800, "TCC_DRIVER": 0,
    "INTEGRATED": 0, "KERNEL_EXEC_TIMEOUT": 0, "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "MAX_REGISTERS_PER_BLOCK": 65536, "VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED": 1,
}


class CallRefused(Exception):
    """A call the stand-in answers with ``code`` (recorded when ``record``)."""

    def __init__(self, code, message, record=True):
        super().__init__(message)
        self.code, self.record = code, record


@contextlib.contextmanager
def invalid_address(call):
    """An AddressError inside as the driver's CUDA_ERROR_INVALID_VALUE,
    refusing ``call`` (its name) with the error's description."""
    try:
        yield
    except AddressError as e:
        raise CallRefused(R.CUDA_ERROR_INVALID_VALUE, f"{call}: {e}") from None


class Contexts:
    """Primary contexts (one per device, a new handle each time one is
    created after a reset) and each thread's stack of current contexts."""

    def __init__(self, devices):
        self.devices = devices
        self._lock = threading.Lock()
        self._next = 0x1000
        self.primary = {}           # device -> handle of its live primary context
        self.retains = {}           # device -> retain count
        self.device_of = {}         # live handle -> device
        self._local = threading.local()

    def stack(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self):
        stack = self.stack()
        return stack[-1] if stack else 0

    def require_current(self):
        """The current context's handle; CallRefused if none (or a dead one)."""
        handle = self.current()
        if handle == 0:
            raise CallRefused(R.CUDA_ERROR_INVALID_CONTEXT, "no current context")
        if handle not in self.device_of:
            raise CallRefused(R.CUDA_ERROR_CONTEXT_IS_DESTROYED,
                              f"the current context {handle:#x} was destroyed (reset)")
        return handle

    def retain(self, device):
        with self._lock:
            handle = self.primary.get(device)
            if handle is None:
                self._next += 0x100
                handle = self.primary[device] = self._next
                self.device_of[handle] = device
            self.retains[device] = self.retains.get(device, 0) + 1
            return handle

    def release(self, device):
        with self._lock:
            if self.retains.get(device, 0) > 0:
                self.retains[device] -= 1

    def reset(self, device):
        """Destroy ``device``'s primary context: its handle (returned) dies."""
        with self._lock:
            handle = self.primary.pop(device, None)
            self.retains.pop(device, None)
            if handle is not None:
                del self.device_of[handle]
            return handle


class Call(NamedTuple):
    """One call as numba-cuda made it: its ``name``, its ``args`` and what it
    answered (``values``: the values after the CUresult, or the refusing
    CUresult's name), each an int where it has one (addresses, sizes,
    handles), else its repr."""
    name: str
    args: tuple
    values: object


def _plain(value):
    """``value`` as an int when it has one (a handle, an address), else its
    repr; tuples item by item."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return repr(value)


class StandInDriver:
    """The state behind the stand-in binding: devices' memory, contexts,
    work, loaded kernels, the errors recorded and, while it is a list, the
    calls made (``calls``: :class:`Call`, in call order)."""

    def __init__(self, memory, queue, devices=1):
        self.memory, self.queue = memory, queue
        self.contexts = Contexts(devices)
        self.errors = []            # (call, message) of every refused call or failed work
        self._errors_lock = threading.Lock()
        self.libraries = {}         # handle -> stand-in library (core.py)
        self.ipc_open = {}          # address -> allocation, opened by cuIpcOpenMemHandle
        self.limits = {}            # (context, CUlimit) -> value set by cuCtxSetLimit
        self.launched = set()       # contexts that have launched a kernel
        self.launches = collections.Counter()   # kernel launches queued, by kernel label
        self.grids = []             # (kernel label, grid, block) of each launch queued
        self.calls = None           # a list while calls are recorded (StandIn.recording)

    def record_error(self, call, message):
        with self._errors_lock:
            self.errors.append((call, message))

    # -- helpers ---------------------------------------------------------------
    def claim(self, address, nbytes, call, device_access=True, spanning=False):
        """The allocation holding the range, checked (``spanning``: a
        kernel's array, which may also be a memory.Span of two live device
        allocations); CallRefused otherwise."""
        with invalid_address(call):
            if spanning:
                return self.memory.find_span(int(address), int(nbytes))
            return self.memory.find(int(address), int(nbytes), device_access)

    def still(self, allocation, address, nbytes, label):
        """At run time: the range is still in ``allocation`` (live; a Span:
        still from and to the same live allocations)."""
        try:
            now = self.memory.find_span(address, nbytes)
        except AddressError as e:
            raise RuntimeError(f"{label}: {e} (it was in {allocation!r} when queued)") from None
        if now is not allocation and now != allocation:
            raise RuntimeError(f"{label}: {address:#x} is now in {now!r}, not in "
                               f"{allocation!r} as when queued")

    def stream(self, handle):
        context = self.contexts.require_current()
        state = self.queue.stream(handle, context)
        if state is None:
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, f"unknown stream {int(handle):#x}")
        return state

    def wait_for(self, run):
        """Run queued work now (``run`` waits for it); a failure is the GPU's
        error surfacing here."""
        try:
            run()
        except WorkFailed as e:
            raise CallRefused(R.CUDA_ERROR_ILLEGAL_ADDRESS,
                              f"queued work failed: {e.args[0]!r}", record=False) from None


def _host_bytes(address, nbytes):
    return ctypes.string_at(int(address), int(nbytes))


def _host_write(address, data):
    ctypes.memmove(int(address), data, len(data))


MALLOC_HEAP = int(_real.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE)
DEFAULT_LIMITS = {MALLOC_HEAP: 8 << 20}     # CUDA's device malloc heap: 8 MiB


def make_functions(d):
    """{name: function} of the stand-in binding over StandInDriver ``d``."""
    memory, queue, contexts = d.memory, d.queue, d.contexts
    functions = {}

    def api(function):
        name = function.__name__

        def call(*args):
            try:
                values = function(*args)
            except CallRefused as e:
                if e.record:
                    d.record_error(name, str(e))
                if d.calls is not None:
                    d.calls.append(Call(name, _plain(args), e.code.name))
                return (e.code,) if e.code != SUCCESS else (SUCCESS,)
            if d.calls is not None:
                d.calls.append(Call(name, _plain(args), _plain(values)))
            if values is None:
                return (SUCCESS,)
            return (SUCCESS, *values) if isinstance(values, tuple) else (SUCCESS, values)
        call.__name__ = name
        functions[name] = call
        return call

    # -- initialisation and devices ----------------------------------------------
    @api
    def cuInit(flags):
        return None

    @api
    def cuDriverGetVersion():
        return 13000

    @api
    def cuDeviceGetCount():
        return contexts.devices

    def device(dev):
        dev = int(dev)
        if not 0 <= dev < contexts.devices:
            raise CallRefused(R.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")
        return dev

    @api
    def cuDeviceGet(ordinal):
        return _real.CUdevice(device(ordinal))

    @api
    def cuDeviceGetAttribute(attrib, dev):
        device(dev)
        name = _real.CUdevice_attribute(attrib).name.replace("CU_DEVICE_ATTRIBUTE_", "")
        if name not in ATTRIBUTES:
            raise NotImplementedError(f"the stand-in driver has no value for {name}")
        return ATTRIBUTES[name]

    @api
    def cuDeviceGetName(length, dev):
        return f"Stand-in GPU {device(dev)}".encode()[:length]

    @api
    def cuDeviceCanAccessPeer(dev, peer):
        return 1 if device(dev) != device(peer) else 0

    @api
    def cuDevicePrimaryCtxRetain(dev):
        return _real.CUcontext(contexts.retain(device(dev)))

    @api
    def cuDevicePrimaryCtxRelease(dev):
        contexts.release(device(dev))

    @api
    def cuDevicePrimaryCtxReset(dev):
        """Its context's work runs first (the reset waits for it), no other's;
        then its streams, events, allocations and libraries are gone."""
        handle = contexts.reset(device(dev))
        if handle is None:
            return
        d.wait_for(lambda: queue.synchronize_context(handle))
        queue.forget_context(handle)
        for allocation in memory.live("device"):
            if allocation.context == handle:
                memory.release(allocation.address, ("device",))
        for key, library in list(d.libraries.items()):
            if library.context == handle:
                del d.libraries[key]

    # -- contexts --------------------------------------------------------------------
    @api
    def cuCtxGetCurrent():
        return _real.CUcontext(contexts.current())

    @api
    def cuCtxPushCurrent(ctx):
        handle = int(ctx)
        if handle not in contexts.device_of:
            raise CallRefused(R.CUDA_ERROR_INVALID_CONTEXT, f"no live context {handle:#x}")
        contexts.stack().append(handle)

    @api
    def cuCtxPopCurrent():
        stack = contexts.stack()
        if not stack:
            raise CallRefused(R.CUDA_ERROR_INVALID_CONTEXT, "no context to pop")
        return _real.CUcontext(stack.pop())

    @api
    def cuCtxSetCurrent(ctx):
        stack, handle = contexts.stack(), int(ctx)
        if stack:
            stack.pop()
        if handle:
            stack.append(handle)

    @api
    def cuCtxGetDevice():
        return _real.CUdevice(contexts.device_of[contexts.require_current()])

    @api
    def cuCtxSynchronize():
        """CUDA: "Blocks until the current context has completed all
        preceding requested tasks": another context's work may still be
        queued after it."""
        context = contexts.require_current()
        d.wait_for(lambda: queue.synchronize_context(context))

    @api
    def cuCtxEnablePeerAccess(peer, flags):
        contexts.require_current()

    @api
    def cuCtxSetLimit(limit, value):
        """CUDA refuses CU_LIMIT_MALLOC_HEAP_SIZE after a kernel that uses
        device malloc has run in the context; the stand-in, which cannot
        tell, after any kernel (a refusal the caller is meant to handle: not
        recorded as an error)."""
        context = contexts.require_current()
        if int(limit) == MALLOC_HEAP and context in d.launched:
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE,
                              "cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE) after a kernel launch "
                              "in this context", record=False)
        d.limits[context, int(limit)] = int(value)

    @api
    def cuCtxGetLimit(limit):
        context = contexts.require_current()
        return d.limits.get((context, int(limit)), DEFAULT_LIMITS.get(int(limit), 0))

    # -- memory ------------------------------------------------------------------------
    @api
    def cuMemGetInfo():
        contexts.require_current()
        return memory.capacity - memory.device_bytes, memory.capacity

    @api
    def cuMemAlloc(size):
        context = contexts.require_current()
        allocation = memory.allocate_device(int(size), context)
        if allocation is None:
            raise CallRefused(R.CUDA_ERROR_OUT_OF_MEMORY, f"cuMemAlloc({size})", record=False)
        return _real.CUdeviceptr(allocation.address)

    # The frees wait for every context's work. CUDA documents no wait for them
    # ("Any CUDA API call may block or synchronize for various reasons ...
    # undocumented behavior should not be relied upon", API synchronization
    # behavior), yet programs, Numba's own memory manager first, rely on
    # cuMemFree waiting for the device; the stand-in waits for the most a GPU
    # may, so that it records no failure a GPU would not have.
    @api
    def cuMemFree(dptr):
        contexts.require_current()
        d.wait_for(queue.synchronize_all)
        with invalid_address("cuMemFree"):
            memory.release(int(dptr), ("device", "managed"))   # cuMemAllocManaged's too

    @api
    def cuMemAllocManaged(size, flags):
        context = contexts.require_current()
        return _real.CUdeviceptr(memory.allocate_host(int(size), True, context,
                                                      "managed").address)

    @api
    def cuMemHostAlloc(size, flags):
        context = contexts.require_current()
        mapped = bool(int(flags) & int(_real.CU_MEMHOSTALLOC_DEVICEMAP))
        return memory.allocate_host(int(size), mapped, context).address

    @api
    def cuMemFreeHost(pointer):
        d.wait_for(queue.synchronize_all)
        with invalid_address("cuMemFreeHost"):
            memory.release(int(pointer), ("host",))

    @api
    def cuMemHostRegister(pointer, size, flags):
        context = contexts.require_current()
        mapped = bool(int(flags) & int(_real.CU_MEMHOSTREGISTER_DEVICEMAP))
        if memory.register_host(int(pointer), int(size), mapped, context) is None:
            raise CallRefused(R.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                              f"cuMemHostRegister({int(pointer):#x}, {size})")

    @api
    def cuMemHostUnregister(pointer):
        d.wait_for(queue.synchronize_all)
        try:
            memory.release(int(pointer), ("registered",))
        except AddressError as e:
            raise CallRefused(R.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                              f"cuMemHostUnregister: {e}") from None

    @api
    def cuMemHostGetDevicePointer(pointer, flags):
        allocation = d.claim(pointer, 1, "cuMemHostGetDevicePointer")
        return _real.CUdeviceptr(int(pointer)) if allocation else None

    # -- virtual memory management: reserved addresses, physical memory, mappings -----
    PAGE = 2 << 20                  # the allocation granularity of current GPUs
    DEVICE_LOCATION = _real.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE

    def check_prop(prop, call):
        if (prop.type != _real.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
                or prop.location.type != DEVICE_LOCATION):
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE, f"{call}: not pinned device memory")
        device(prop.location.id)

    @api
    def cuMemGetAllocationGranularity(prop, option):
        check_prop(prop, "cuMemGetAllocationGranularity")
        return PAGE

    @api
    def cuMemAddressReserve(size, alignment, addr, flags):
        contexts.require_current()
        size, alignment = int(size), int(alignment) or PAGE
        if size % PAGE or alignment % PAGE or int(addr) or int(flags):
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE,
                              f"cuMemAddressReserve({size}, {alignment}, {int(addr)}, "
                              f"{int(flags)}): not a multiple of the granularity, or a "
                              "fixed address or flags (the stand-in has neither)")
        address = memory.reserve_addresses(size, alignment)
        if address is None:
            raise CallRefused(R.CUDA_ERROR_OUT_OF_MEMORY, f"cuMemAddressReserve({size})",
                              record=False)
        return _real.CUdeviceptr(address)

    @api
    def cuMemAddressFree(ptr, size):
        with invalid_address("cuMemAddressFree"):
            memory.free_addresses(int(ptr), int(size))

    @api
    def cuMemCreate(size, prop, flags):
        contexts.require_current()
        check_prop(prop, "cuMemCreate")
        if int(size) % PAGE or int(flags):
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE, f"cuMemCreate({size}): not a "
                              "multiple of the granularity, or flags")
        handle = memory.create_physical(int(size))
        if handle is None:
            raise CallRefused(R.CUDA_ERROR_OUT_OF_MEMORY, f"cuMemCreate({size})", record=False)
        return _real.CUmemGenericAllocationHandle(handle)

    @api
    def cuMemRelease(handle):
        with invalid_address("cuMemRelease"):
            memory.release_physical(int(handle))

    @api
    def cuMemMap(ptr, size, offset, handle, flags):
        context = contexts.require_current()
        if int(offset) or int(flags):
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE, "cuMemMap: an offset or flags (the "
                              "stand-in maps whole handles)")
        with invalid_address("cuMemMap"):
            memory.map_physical(int(ptr), int(size), int(handle), context)

    @api
    def cuMemSetAccess(ptr, size, desc, count):
        if int(count) != 1 or desc[0].location.type != DEVICE_LOCATION or desc[0].flags != \
                _real.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: the stand-in takes "
                              "one descriptor, read-write access for a device")
        device(desc[0].location.id)
        at, end = int(ptr), int(ptr) + int(size)
        while at < end:                 # every byte mapped
            part = d.claim(at, 1, "cuMemSetAccess")
            if part.physical is None:
                raise CallRefused(R.CUDA_ERROR_INVALID_VALUE,
                                  f"cuMemSetAccess: {part!r} is not a mapping")
            at = part.address + part.size

    @api
    def cuMemUnmap(ptr, size):
        with invalid_address("cuMemUnmap"):
            memory.unmap(int(ptr), int(size))

    @api
    def cuMemGetAddressRange(dptr):
        with invalid_address("cuMemGetAddressRange"):
            base, size = memory.range_of(int(dptr))
        return _real.CUdeviceptr(base), size

    @api
    def cuPointerGetAttribute(attribute, dptr):
        attribute = _real.CUpointer_attribute(attribute)
        allocation = d.claim(dptr, 1, "cuPointerGetAttribute", device_access=False)
        if attribute == _real.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            return _real.CUdeviceptr(int(dptr))
        if attribute == _real.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT:
            return _real.CUcontext(allocation.context)
        raise NotImplementedError(f"the stand-in driver does not answer {attribute.name}")

    # -- copies and memsets -----------------------------------------------------------------
    def queued_copy(stream_handle, label, dst, src, size, host_src=None, host_dst=None):
        """Queue a copy; device ranges checked now and when it runs."""
        size = int(size)
        stream = d.stream(stream_handle)
        device_dst = d.claim(dst, size, label) if host_dst is None else None
        device_src = d.claim(src, size, label) if host_src is None else None
        if host_src is not None and not memory.holds_pinned(host_src, size):
            snapshot = _host_bytes(host_src, size)  # pageable: CUDA stages it now

            def read():
                return snapshot
        elif host_src is not None:
            def read():
                return _host_bytes(host_src, size)
        else:
            def read():
                d.still(device_src, int(src), size, label)
                return device_src.view(int(src) - device_src.address, size).tobytes()

        def run():
            data = read()
            if host_dst is not None:
                _host_write(host_dst, data)
            else:
                d.still(device_dst, int(dst), size, label)
                device_dst.view(int(dst) - device_dst.address, size)[:] = \
                    bytearray(data) or b""
        return queue.enqueue(stream, run, label)

    def synchronous(work):
        d.wait_for(lambda: queue.finish(work))

    # the calls that take no stream use the default stream (handle 0): the
    # legacy one, or in per-thread mode the calling thread's (work.py)
    def before_synchronous_call():
        stream = d.stream(0)
        d.wait_for(lambda: queue.before_synchronous_call(stream))

    @api
    def cuMemcpyHtoD(dst, src, size):
        before_synchronous_call()
        synchronous(queued_copy(0, "cuMemcpyHtoD", dst, None, size, host_src=int(src)))

    @api
    def cuMemcpyHtoDAsync(dst, src, size, stream):
        queued_copy(stream, "cuMemcpyHtoDAsync", dst, None, size, host_src=int(src))

    @api
    def cuMemcpyDtoH(dst, src, size):
        before_synchronous_call()
        synchronous(queued_copy(0, "cuMemcpyDtoH", None, src, size, host_dst=int(dst)))

    @api
    def cuMemcpyDtoHAsync(dst, src, size, stream):
        work = queued_copy(stream, "cuMemcpyDtoHAsync", None, src, size, host_dst=int(dst))
        if not memory.holds_pinned(int(dst), int(size)):
            synchronous(work)               # into pageable memory CUDA returns when done

    @api
    def cuMemcpyDtoD(dst, src, size):       # asynchronous to the host, on the default stream
        queued_copy(0, "cuMemcpyDtoD", dst, src, size)

    @api
    def cuMemcpyDtoDAsync(dst, src, size, stream):
        queued_copy(stream, "cuMemcpyDtoDAsync", dst, src, size)

    def queued_memset(stream_handle, label, dst, value, count):
        count = int(count)
        stream = d.stream(stream_handle)
        allocation = d.claim(dst, count, label)

        def run():
            d.still(allocation, int(dst), count, label)
            allocation.view(int(dst) - allocation.address, count)[:] = int(value) & 0xFF
        return queue.enqueue(stream, run, label)

    @api
    def cuMemsetD8(dst, value, count):      # asynchronous to the host, on the default stream
        queued_memset(0, "cuMemsetD8", dst, value, count)

    @api
    def cuMemsetD8Async(dst, value, count, stream):
        queued_memset(stream, "cuMemsetD8Async", dst, value, count)

    # -- streams and events ---------------------------------------------------------------
    @api
    def cuStreamCreate(flags):
        return _real.CUstream(queue.create_stream(int(flags), contexts.require_current()))

    @api
    def cuStreamDestroy(stream):
        if not queue.destroy_stream(int(stream)):
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, f"unknown stream {int(stream):#x}")

    @api
    def cuStreamSynchronize(stream):
        state = d.stream(stream)
        d.wait_for(lambda: queue.synchronize_stream(state))

    def answered(work):
        """A query's answer: done (a failure surfacing as its error), or
        CUDA_ERROR_NOT_READY. A query never runs work."""
        if work is None or work.done:
            if work is not None and work.failed:
                raise CallRefused(R.CUDA_ERROR_ILLEGAL_ADDRESS, f"{work!r} failed",
                                  record=False)
            return None
        raise CallRefused(R.CUDA_ERROR_NOT_READY, "not ready", record=False)

    @api
    def cuStreamQuery(stream):
        return answered(d.stream(stream).last)

    @api
    def cuStreamWaitEvent(stream, event, flags):
        state = d.stream(stream)
        event_state = queue.events.get(int(event))
        if event_state is None:
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, f"unknown event {int(event):#x}")
        queue.wait_event(state, event_state)

    @api
    def cuEventCreate(flags):
        return _real.CUevent(queue.create_event(int(flags), contexts.require_current()))

    @api
    def cuEventDestroy(event):
        if not queue.destroy_event(event):
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, f"unknown event {int(event):#x}")

    def event(handle):
        state = queue.events.get(int(handle))
        if state is None:
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, f"unknown event {int(handle):#x}")
        return state

    @api
    def cuEventRecord(handle, stream):
        """CUDA (cudaEventRecord): "event and stream must be on the same CUDA
        context"; else CUDA_ERROR_INVALID_HANDLE."""
        state, stream_state = event(handle), d.stream(stream)
        if state.context != stream_state.context:
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE,
                              f"event {int(handle):#x} of context {state.context:#x} recorded "
                              f"on stream {stream_state.handle:#x} of context "
                              f"{stream_state.context:#x}")
        queue.record(state, stream_state)

    @api
    def cuEventQuery(handle):
        return answered(event(handle).recorded)

    @api
    def cuEventSynchronize(handle):
        state = event(handle)
        d.wait_for(lambda: queue.finish(state.recorded))

    @api
    def cuEventElapsedTime(start, end):
        first, last = event(start), event(end)
        if not (first.timing and last.timing):
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, "an event without timing")
        if first.recorded is None or last.recorded is None:
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, "an event never recorded",
                              record=False)
        if not (first.recorded.done and last.recorded.done):
            raise CallRefused(R.CUDA_ERROR_NOT_READY, "not completed", record=False)
        return (last.recorded.time - first.recorded.time) / 1000.0

    # -- IPC (within this process; another process needs a GPU) ---------------------------
    @api
    def cuIpcGetMemHandle(dptr):
        allocation = d.claim(dptr, 1, "cuIpcGetMemHandle")
        if allocation.address != int(dptr) or allocation.kind != "device" \
                or allocation.physical is not None:     # cuMemCreate memory has no IPC handle
            raise CallRefused(R.CUDA_ERROR_INVALID_VALUE,
                              f"cuIpcGetMemHandle: {int(dptr):#x} is not the base of a "
                              "cuMemAlloc allocation")
        handle = _real.CUipcMemHandle()
        ctypes.memmove(handle.getPtr(), allocation.address.to_bytes(8, "little"), 8)
        return handle

    @api
    def cuIpcOpenMemHandle(handle, flags):
        raise CallRefused(R.CUDA_ERROR_NOT_SUPPORTED,
                          "cuIpcOpenMemHandle: opening an IPC handle needs another process "
                          "and a GPU", record=False)

    @api
    def cuIpcCloseMemHandle(dptr):
        raise CallRefused(R.CUDA_ERROR_INVALID_VALUE, "cuIpcCloseMemHandle: nothing opened")

    # -- loaded code (core.py loads it) ------------------------------------------------------
    def library(handle):
        library = d.libraries.get(int(handle))
        if library is None:
            raise CallRefused(R.CUDA_ERROR_INVALID_HANDLE, f"no loaded library {int(handle):#x}")
        return library

    @api
    def cuLibraryGetGlobal(handle, name):
        allocation = library(handle).global_symbol(name.decode() if isinstance(name, bytes)
                                                   else name)
        return _real.CUdeviceptr(allocation.address), allocation.size

    @api
    def cuLibraryUnload(handle):
        library(handle)
        del d.libraries[int(handle)]

    @api
    def cuKernelSetAttribute(attribute, value, kernel, dev):
        return None

    @api
    def cuKernelSetCacheConfig(kernel, config, dev):
        return None

    @api
    def cuOccupancyMaxActiveBlocksPerMultiprocessor(function, block_size, shared):
        return max(1, ATTRIBUTES["MAX_THREADS_PER_MULTIPROCESSOR"] // max(int(block_size), 1))

    @api
    def cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(function, block_size, shared,
                                                              flags):
        return max(1, ATTRIBUTES["MAX_THREADS_PER_MULTIPROCESSOR"] // max(int(block_size), 1))

    @api
    def cuProfilerStart():
        return None

    @api
    def cuProfilerStop():
        return None

    return functions


class Binding:
    """The module object installed as numba-cuda's ``binding``: the
    stand-in's functions, then the real module's types and constants."""

    def __init__(self, functions):
        self._functions = functions
        self.__name__ = "cuda.bindings.driver (stand-in)"

    def __getattr__(self, name):
        function = self._functions.get(name)
        if function is not None:
            return function
        if name.startswith("cu") and name[2:3].isupper():
            def missing(*args):
                raise NotImplementedError(f"the stand-in driver does not implement {name}")
            missing.__name__ = name
            return missing
        return getattr(_real, name)
