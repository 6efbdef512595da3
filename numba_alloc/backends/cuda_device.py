"""The real device, through Numba's driver bindings.

Every call runs in the Numba context the backend was made for: the backend
makes it current for the call when it is not (Numba resets a context with
no context current, from cuda.close(); another device's may be current).
Once that context is gone (cuda.close() released it), every call raises
RuntimeError (Backend.check_alive) without reaching the driver.
"""

import contextlib
import functools
import threading
import weakref

import numpy as np
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.cudadrv.driver import CudaAPIError, MemoryPointer, binding, driver

from ..device import kernels
from ..policy.backend import LATE_MALLOC_HEAP, Backend, DeviceOutOfMemory, HostOutOfMemory
from .cuda_copies import CudaCopies
from .cuda_events import AllContextsEvent, CudaEvent, OtherContextEvent, alive, current

_OOM = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY


HEADROOM_MIN = 256 << 20
class _Sessions(threading.local):
    """How deep the calling thread is in CudaDevice.session blocks."""
    depth = 0


_CURRENT = contextlib.nullcontext()     # in_context inside a session: nothing to do


class CudaDevice(CudaCopies, Backend):
    """Segments from cuMemAlloc (or pages mapped under reserved addresses:
    expandable_segments) in one Numba context. Its scratch for
    defragmentation (the move counters and a move table) is reserved when it
    is made, outside the pool, so that moving never needs memory the device
    may no longer have."""

    name = "cuda"

    def __init__(self, context):
        self.context = context
        # Numba's Device, or the raw CUdevice of a Context a third party made
        device = context.device
        self.device_id = device.id if hasattr(device, "id") else int(device)
        self.scratch_bytes = kernels.SCRATCH_WORDS * 8
        self._sessions = _Sessions()
        self._scratch = self.allocate(self.scratch_bytes)
        # the counters and the idle launch header zeroed by a plain driver call:
        # Numba's array methods would ask for a context, which re-enters the
        # manager's initialize()
        try:
            with self.in_context():
                driver.cuMemsetD8(binding.CUdeviceptr(self._scratch), 0, kernels.TABLE * 8)
        except BaseException:
            try:
                self.close()
            except Exception:      # noqa: BLE001 - the driver's first error is the one raised
                pass
            raise
        self._counted = np.zeros(kernels.COUNTERS, np.int64)    # where copy() reads them
        self._counts = (0,) * kernels.COUNTERS
        self._words = self._array(self._scratch, (kernels.SCRATCH_WORDS,), np.int64)
        self._kernel = None
        self._resident = None       # blocks of the copy kernel the device holds at once
        self.copy_error = None      # why the copy kernel could not be loaded, if it failed
        self._reserved = {}         # reserved address range -> its bytes
        self._page_handles = {}     # mapped page's address -> its cuMemCreate handle
        # what refused driver calls left, tried again at the next page call (_tidy):
        self._unreleased = []       # unmapped pages' handles whose cuMemRelease was refused
        self._stray = {}            # address -> handle of pages mapped for no pool (an undone
                                    # map whose cuMemUnmap was refused)

    @property
    def context_alive(self) -> bool:
        """Whether the Numba context this backend serves is still its
        device's primary context (cuda.close() releases it; the device's
        next use makes a new context, with a pool of its own)."""
        return alive(self.context)

    def in_context(self):
        """Make this backend's context current inside the block, pushing it
        when another context, or none, is current (and popping it after);
        inside a :meth:`session` of this thread it is current already.
        RuntimeError (Backend.check_alive) once the context is gone: the
        driver would refuse its handle or, should the device's new context
        get the same one, let this pool work in a context not its own."""
        return _CURRENT if self._sessions.depth else self._made_current()

    def _made_current(self):
        self.check_alive()
        return current(self.context.handle)

    @contextlib.contextmanager
    def session(self):
        """See Backend.session: this backend's context current for the
        block (one cuCtxGetCurrent, not one a call)."""
        with self.in_context():
            self._sessions.depth += 1
            try:
                yield
            finally:
                self._sessions.depth -= 1

    def _array(self, address, shape, dtype):
        """A Numba device array over memory this backend owns (no finalizer)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        pointer = MemoryPointer(weakref.proxy(self.context), binding.CUdeviceptr(address), nbytes)
        strides = tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
        return DeviceNDArray(shape, strides, dtype, gpu_data=pointer)

    def allocate(self, nbytes):
        try:
            with self.in_context():
                return int(driver.cuMemAlloc(nbytes))
        except CudaAPIError as e:
            if e.code == _OOM:
                raise DeviceOutOfMemory(str(e)) from None
            raise

    def release(self, address):
        with self.in_context():
            driver.cuMemFree(binding.CUdeviceptr(address))

    def close(self):
        """Give back the scratch memory (a pool set-up that failed: the
        context keeps it otherwise). Raises what the driver raises."""
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            self.release(scratch)

    def memory_info(self):
        with self.in_context():
            free, total = driver.cuMemGetInfo()
        return int(free), int(total)

    def headroom(self, free):
        """What an arena without a limit leaves of the device's ``free``
        bytes to the driver, module loads (Numba's kernels) and other
        libraries: 5% of them, at least 256 MiB, and the device malloc
        heap's size (the driver carves the heap when the first module
        using malloc loads, NRT's kernels), at most all of them."""
        return min(free, max(HEADROOM_MIN, free // 20) + self.malloc_heap_size())

    def event(self):
        return CudaEvent(self)

    # -- every live context's work (the host cache's pinned blocks, which any
    # device's work may use): Numba's primary contexts, driver.devices' ------------
    def _other_contexts(self):
        """Numba's live primary contexts but this backend's, one at a time
        (no driver call; the devices read at once, as another thread may
        add one)."""
        own = self.context
        for device in list(driver.devices.values()):
            context = device.primary_context
            if (context is not None and context is not own
                    and int(context.handle) != int(own.handle)):
                yield context

    def event_all_devices(self):
        """See Backend.event_all_devices: a CudaEvent when this backend's
        context is the only live one (exactly :meth:`event`), else an
        AllContextsEvent. Each context is pushed current for its calls.
        Raises what the driver raises (a context another thread resets
        meanwhile: CudaAPIError, as Numba's own calls then)."""
        others = list(self._other_contexts())
        if not others:
            return CudaEvent(self)
        return AllContextsEvent([CudaEvent(self)] + [OtherContextEvent(c) for c in others])

    def is_current(self):
        """See Backend.is_current: with no other live context Numba knows,
        True without a driver call; else whether this backend's context is
        the current one (cuCtxGetCurrent)."""
        return (next(self._other_contexts(), None) is None
                or int(driver.cuCtxGetCurrent()) == int(self.context.handle))

    def synchronize_other_devices(self):
        """See Backend.synchronize_other_devices: cuCtxSynchronize in each
        other live context, pushed current for it (none: no driver call).
        Raises what the driver raises."""
        for context in self._other_contexts():
            with current(context.handle):
                context.synchronize()

    def malloc_heap_size(self):
        with self.in_context():
            return int(driver.cuCtxGetLimit(binding.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE))

    def set_malloc_heap_size(self, nbytes):
        try:
            with self.in_context():
                driver.cuCtxSetLimit(binding.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE, nbytes)
        except CudaAPIError as e:
            raise RuntimeError(f"{LATE_MALLOC_HEAP} (the driver refused: {e})") from None

    # -- pages under reserved addresses (the expandable_segments setting): the
    # driver's virtual memory management, each page its own physical
    # allocation so that any page can be given back alone ---------------------------
    @functools.cached_property
    def page_size(self):
        """The driver's allocation granularity for this device (2 MiB on
        current GPUs); 0 where the device has no virtual memory management."""
        try:
            with self.in_context():
                supported = driver.cuDeviceGetAttribute(
                    binding.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                    self.device_id)
                if not supported:
                    return 0
                return int(driver.cuMemGetAllocationGranularity(
                    self._page_properties(),
                    binding.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        except CudaAPIError:
            return 0

    def _location(self, struct):
        """``struct`` (a CUmemAllocationProp or CUmemAccessDesc) about this
        device's memory."""
        struct.location.type = binding.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        struct.location.id = self.device_id
        return struct

    def _page_properties(self):
        """What a page is: pinned memory of this device."""
        prop = self._location(binding.CUmemAllocationProp())
        prop.type = binding.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        return prop

    def reserve_addresses(self, nbytes):
        try:
            with self.in_context():
                address = int(driver.cuMemAddressReserve(nbytes, self.page_size, 0, 0))
        except CudaAPIError as e:
            if e.code == _OOM:
                raise DeviceOutOfMemory(str(e)) from None
            raise
        self._reserved[address] = nbytes
        return address

    def free_addresses(self, address):
        with self.in_context():
            self._tidy()
            driver.cuMemAddressFree(binding.CUdeviceptr(address), self._reserved[address])
        del self._reserved[address]

    def _access(self):
        """Read-write access to pages for this device (cuMemSetAccess)."""
        access = self._location(binding.CUmemAccessDesc())
        access.flags = binding.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return access

    def map_pages(self, address, nbytes):
        """See Backend.map_pages. When a call is refused, the pages mapped
        so far are unmapped and released; should the driver refuse that
        too, they stay mapped for no pool until a later page call unmaps
        them (_tidy), and the first error is raised."""
        page, prop = self.page_size, self._page_properties()
        done = {}                       # address -> handle of the pages mapped so far
        try:
            with self.in_context():
                self._tidy()
                for at in range(address, address + nbytes, page):
                    handle = driver.cuMemCreate(page, prop, 0)
                    try:
                        driver.cuMemMap(binding.CUdeviceptr(at), page, 0, handle, 0)
                    except BaseException:
                        self._release(handle)
                        raise
                    done[at] = handle
                driver.cuMemSetAccess(binding.CUdeviceptr(address), nbytes, [self._access()], 1)
        except BaseException as e:
            self._page_handles.update(done)
            try:
                self.unmap_pages(address, len(done) * page)
            except CudaAPIError:        # the driver's first error is the one raised
                for at in done:
                    if at in self._page_handles:
                        self._stray[at] = self._page_handles.pop(at)
            if isinstance(e, CudaAPIError) and e.code == _OOM:
                raise DeviceOutOfMemory(str(e)) from None
            raise
        self._page_handles.update(done)

    def unmap_pages(self, address, nbytes):
        """See Backend.unmap_pages: all or nothing. When the driver refuses
        a page's cuMemUnmap, the pages unmapped before it are mapped again
        (their bytes kept: their handles are not released yet) and its
        error is raised; a page it will not map again either is lost to
        the pool. A handle whose cuMemRelease is refused is released at a
        later page call (_tidy): its page is unmapped all the same."""
        page, handles = self.page_size, self._page_handles
        done = []
        with self.in_context():
            self._tidy()
            try:
                for at in range(address, address + nbytes, page):
                    driver.cuMemUnmap(binding.CUdeviceptr(at), page)
                    done.append(at)
            except BaseException:
                for at in done:
                    try:
                        driver.cuMemMap(binding.CUdeviceptr(at), page, 0, handles[at], 0)
                        driver.cuMemSetAccess(binding.CUdeviceptr(at), page, [self._access()], 1)
                    except CudaAPIError:
                        self._release(handles.pop(at))
                raise
            for at in done:
                self._release(handles.pop(at))

    def _release(self, handle):
        """cuMemRelease ``handle``, or keep it for :meth:`_tidy` when refused."""
        try:
            driver.cuMemRelease(handle)
        except CudaAPIError:
            self._unreleased.append(handle)

    def _tidy(self):
        """Release the handles whose release was refused, and unmap and
        release the stray pages; what the driver refuses again waits for
        the next call. In this backend's context."""
        unreleased, self._unreleased = self._unreleased, []
        for handle in unreleased:
            self._release(handle)
        for at, handle in list(self._stray.items()):
            try:
                driver.cuMemUnmap(binding.CUdeviceptr(at), self.page_size)
            except CudaAPIError:
                continue
            del self._stray[at]
            self._release(handle)

    def remap_pages(self, address, nbytes, to):
        """See Backend.remap_pages: page by page (from the end the move
        leaves first), each page's allocation unmapped and mapped at its
        new address, then access set on the new range. On a refused call
        the pages moved so far go back, the last first, access is set on
        the old range again, and the driver's first error is raised."""
        page, handles, access = self.page_size, self._page_handles, self._access()
        starts = range(address, address + nbytes, page)
        moved = []                      # (old, new) address of the pages moved so far
        with self.in_context():
            try:
                for old in (starts if to < address else reversed(starts)):
                    self._move_page(handles[old], old, old - address + to)
                    moved.append((old, old - address + to))
                driver.cuMemSetAccess(binding.CUdeviceptr(to), nbytes, [access], 1)
            except BaseException:
                try:
                    for old, new in reversed(moved):
                        self._move_page(handles[old], new, old)
                    driver.cuMemSetAccess(binding.CUdeviceptr(address), nbytes, [access], 1)
                except CudaAPIError:    # the driver's first error is the one raised
                    pass
                raise
        kept = [handles.pop(old) for old, _ in moved]
        handles.update(zip((new for _, new in moved), kept))

    def _move_page(self, handle, old, new):
        """Map the page ``handle`` mapped at ``old`` at ``new`` instead
        (nothing mapped there); on a refused map it is mapped at ``old``
        again and the error raised."""
        driver.cuMemUnmap(binding.CUdeviceptr(old), self.page_size)
        try:
            driver.cuMemMap(binding.CUdeviceptr(new), self.page_size, 0, handle, 0)
        except BaseException:
            driver.cuMemMap(binding.CUdeviceptr(old), self.page_size, 0, handle, 0)
            raise

    # -- host memory (reclaim): plain driver calls, page-locked memory that
    # Numba's memory manager (this plugin) does not see, and copies queued
    # on the legacy default stream, which orders them after the work of
    # every blocking stream, as the pool's events are ----------------------------
    reclaims = True

    def host_allocate(self, nbytes, flags=0):
        try:
            with self.in_context():
                return int(driver.cuMemHostAlloc(nbytes, flags))
        except CudaAPIError as e:
            if e.code == _OOM:
                raise HostOutOfMemory(str(e)) from None
            raise

    def host_release(self, buffer):
        with self.in_context():
            driver.cuMemFreeHost(buffer)

    def copy_to_host(self, address, buffer, nbytes):
        with self.in_context():
            driver.cuMemcpyDtoHAsync(buffer, binding.CUdeviceptr(address), nbytes,
                                     binding.CUstream(binding.CU_STREAM_LEGACY))

    def copy_from_host(self, buffer, address, nbytes):
        with self.in_context():
            driver.cuMemcpyHtoDAsync(binding.CUdeviceptr(address), buffer, nbytes,
                                     binding.CUstream(binding.CU_STREAM_LEGACY))

    def synchronize(self):
        with self.in_context():
            self.context.synchronize()

    def __repr__(self):
        return f"CudaDevice({self.device_id})"
