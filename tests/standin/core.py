"""Stand-ins for what numba-cuda takes from cuda-core, whose compiled code
calls the real driver (unreachable from Python): the device object, the
stream wrapper, module loading, the kernel launch, and the device buffers
and strided views of host arrays passed straight to a kernel. Each
replaces a name at numba-cuda's module level (install() in __init__.py).
Kernels still compile through NVVM and nvJitLink; a launch queues the
kernel's run (kernels.py) on its stream.
"""

import collections
import itertools
import struct
import sys
import weakref

import numpy as np
from cuda.bindings import driver as _real
from numba.cuda import dispatcher
from numba.cuda.cudadrv import driver as numba_driver
from numba.cuda.cudadrv.driver import CudaAPIError
from numba.cuda.dispatcher import CUDADispatcher

from . import kernels
from .binding import CallRefused

ComputeCapability = collections.namedtuple("ComputeCapability", "major minor")


class Stream:
    """cuda-core's Stream as numba-cuda uses it: from_handle, handle and
    ``__cuda_stream__`` (no driver call)."""

    def __init__(self, handle):
        self._handle = int(handle)

    @classmethod
    def from_handle(cls, handle):
        return cls(handle)

    @property
    def handle(self):
        return _real.CUstream(self._handle)

    def __cuda_stream__(self):
        return (0, self._handle)

    def __int__(self):
        return self._handle

    def __repr__(self):
        return f"<stand-in stream {self._handle:#x}>"


class Device:
    """cuda-core's Device as numba-cuda uses it, over the stand-in driver."""

    def __init__(self, standin, device_id=0):
        self._standin = standin
        self.device_id = int(device_id)
        self.compute_capability = ComputeCapability(9, 0)
        self.name = f"Stand-in GPU {self.device_id}"
        self.uuid = f"00000000-0000-0000-0000-{self.device_id:012d}"
        self.memory_resource = MemoryResource(standin, self.device_id)
        self._retained = None

    def set_current(self):
        """Make the device's primary context current (pushed, as numba-cuda
        expects: it pops it again when this changed the current context)."""
        binding = self._standin.binding
        (status, handle) = binding.cuDevicePrimaryCtxRetain(self.device_id)
        _check(status, "cuDevicePrimaryCtxRetain")
        self._retained = int(handle)
        (status, current) = binding.cuCtxGetCurrent()
        if int(current) != self._retained:
            _check(binding.cuCtxPushCurrent(handle)[0], "cuCtxPushCurrent")

    @property
    def context(self):
        return _Context(_real.CUcontext(self._retained or 0))

    def allocate(self, size, *, stream):
        return self.memory_resource.allocate(size, stream=stream)


class _Context:
    def __init__(self, handle):
        self.handle = handle


def _check(status, call):
    if status != _real.CUresult.CUDA_SUCCESS:
        raise CudaAPIError(status, f"{call} (stand-in): {status!r}")


# -- device memory for host arrays passed to a kernel (cuda-core's path) --------------

class MemoryResource:
    """cuda-core's default memory resource: stream-ordered allocations, each
    freed on its stream when its buffer closes (after the work queued
    there), as cudaFreeAsync orders it."""

    def __init__(self, standin, device_id):
        self._standin, self.device_id = standin, device_id
        self.is_device_accessible, self.is_host_accessible = True, False

    def allocate(self, size, *, stream=None):
        d = self._standin.driver
        context = d.contexts.require_current()
        allocation = d.memory.allocate_device(int(size), context)
        if allocation is None:
            raise CudaAPIError(_real.CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                               f"cuda-core allocate({size}) (stand-in)")
        return Buffer.from_handle(allocation.address, allocation.size, mr=self, stream=stream)

    def deallocate(self, ptr, size, *, stream=None):
        if not ptr:                 # numba-cuda's empty buffers
            return
        d = self._standin.driver
        state = d.queue.stream(_handle_of(stream), d.contexts.current())

        def release():
            d.memory.release(int(ptr), ("device",))
        d.queue.enqueue(state, release, f"cuda-core free of {int(ptr):#x}")


def _handle_of(stream):
    if stream is None or stream == 0:
        return 0
    if hasattr(stream, "__cuda_stream__"):
        return stream.__cuda_stream__()[1]
    return int(getattr(stream, "handle", stream))


class Buffer:
    """cuda-core's Buffer (numba-cuda's ``Buffer`` name) as numba-cuda and
    memory resources make it, without a driver library:
    ``from_handle(ptr, size, mr=..., stream=...)``; with ``mr``, closing or
    collecting it calls ``mr.deallocate(ptr, size, stream=...)`` once, on the
    stream recorded when it was made."""

    def __init__(self, ptr, size, mr, stream):
        self.handle, self.size, self.memory_resource = int(ptr), int(size), mr
        self._finalizer = (weakref.finalize(self, mr.deallocate, self.handle, self.size,
                                            stream=stream) if mr is not None else None)

    @classmethod
    def from_handle(cls, ptr, size, mr=None, owner=None, *, stream=None):
        if mr is not None and owner is not None:
            raise ValueError("owner and memory resource cannot be both specified together")
        return cls(ptr, size, mr, stream)

    def close(self, stream=None):
        if self._finalizer is not None:
            self._finalizer()


class _Layout:
    def __init__(self, shape, strides_in_bytes, itemsize):
        self.shape, self.strides_in_bytes = shape, strides_in_bytes
        c = tuple(int(np.prod(shape[i + 1:])) * itemsize for i in range(len(shape)))
        f = tuple(int(np.prod(shape[:i])) * itemsize for i in range(len(shape)))
        self.is_contiguous_c = strides_in_bytes is None or tuple(strides_in_bytes) == c
        self.is_contiguous_f = strides_in_bytes is not None and tuple(strides_in_bytes) == f


class BufferView:
    """What StridedMemoryView.from_buffer gives numba-cuda's launch path for
    a stand-in Buffer: ptr, shape, strides, dtype, size, _layout."""

    def __init__(self, buffer, shape, strides, dtype):
        self.buffer, self.ptr = buffer, buffer.handle
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.strides = None if strides is None else tuple(strides)
        in_bytes = None if strides is None else tuple(s * self.dtype.itemsize for s in strides)
        self._layout = _Layout(self.shape, in_bytes, self.dtype.itemsize)
        self.is_device_accessible, self.device_id = True, buffer.memory_resource.device_id


class StridedMemoryView:
    """numba-cuda's StridedMemoryView name: host arrays and interfaces as
    cuda-core makes them (no driver call), stand-in Buffers as BufferView."""

    _real = None        # cuda.core.utils.StridedMemoryView, set by install()

    @classmethod
    def from_buffer(cls, buffer, shape, strides=None, dtype=None, **kwargs):
        if isinstance(buffer, Buffer):
            return BufferView(buffer, shape, strides, dtype)
        return cls._real.from_buffer(buffer, shape=shape, strides=strides, dtype=dtype,
                                     **kwargs)

    def __class_getitem__(cls, item):
        return cls

    @classmethod
    def from_array_interface(cls, obj):
        return cls._real.from_array_interface(obj)

    @classmethod
    def from_any_interface(cls, obj, stream_ptr=None):
        return cls._real.from_any_interface(obj, stream_ptr=stream_ptr)

    @classmethod
    def from_cuda_array_interface(cls, obj, stream_ptr=None):
        return cls._real.from_cuda_array_interface(obj, stream_ptr=stream_ptr)

    @classmethod
    def from_dlpack(cls, obj, stream_ptr=None):
        return cls._real.from_dlpack(obj, stream_ptr=stream_ptr)


# -- loaded code and launches -------------------------------------------------------------

_handles = itertools.count(0x9000, 0x10)


class Kernel:
    """A loaded kernel: cuda-core's Kernel as numba-cuda reads it."""

    class attributes:               # noqa: N801 (cuda-core's attribute object)
        num_regs, const_size_bytes, local_size_bytes = 32, 0, 0
        shared_size_bytes, max_threads_per_block = 0, 1024

    def __init__(self, library, name):
        self.library, self.name = library, name
        self.handle = next(_handles)


def elf_globals(image):
    """{name: size} of the variables a cubin (an ELF image, as nvJitLink
    links it) defines, from its symbol table; None for another image
    (PTX)."""
    image = bytes(image)
    if image[:4] != b"\x7fELF" or image[4] != 2:           # 64-bit ELF only
        return None
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize)
                for i in range(shnum)]
    found = {}
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:                                       # SHT_SYMTAB
            continue
        names = sections[link][4]
        for at in range(offset, offset + size, entsize or 24):
            name, info, _, shndx, _, nbytes = struct.unpack_from("<IBBHQQ", image, at)
            if info & 0xF == 1 and shndx != 0:             # STT_OBJECT, defined
                end = image.index(b"\0", names + name)
                found[image[names + name:end].decode()] = nbytes
    return found


class Library:
    """A module numba-cuda loaded (cuda-core's ObjectCode once loaded): its
    ``handle`` names it in the stand-in driver until cuLibraryUnload."""

    def __init__(self, standin, context, object_code):
        self._standin, self.object_code = standin, object_code
        self.context = int(context.handle)
        self.handle = next(_handles)
        self._globals = {}
        self._defined = elf_globals(getattr(object_code, "code", b""))
        standin.driver.libraries[self.handle] = self

    @property
    def loaded(self):
        return self._standin.driver.libraries.get(self.handle) is self

    def get_kernel(self, name):
        return Kernel(self, name)

    def global_symbol(self, name):
        """A module global's device memory, zeroed, of the size the cubin's
        symbol table gives it; a name the cubin does not define is refused
        (CUDA_ERROR_NOT_FOUND, not recorded: callers look names up). For a
        module loaded from PTX, which the stand-in does not read, 8 bytes
        for any name (numba-cuda's debug mode reads an int)."""
        allocation = self._globals.get(name)
        if allocation is None:
            size = 8 if self._defined is None else self._defined.get(name)
            if size is None:
                raise CallRefused(_real.CUresult.CUDA_ERROR_NOT_FOUND,
                                  f"cuLibraryGetGlobal: the module defines no {name!r}",
                                  record=False)
            d = self._standin.driver
            allocation = self._globals[name] = d.memory.allocate_device(max(size, 1),
                                                                        self.context)
        return allocation


def load_module_image(standin):
    """numba-cuda's load_module_image over stand-in Libraries, returning
    numba-cuda's own CudaPythonModule."""
    def load(context, object_code, setup_callbacks=None, teardown_callbacks=None):
        if int(context.handle) not in standin.driver.contexts.device_of:
            raise CallRefused(_real.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                              f"loading a module into dead context {context!r}")
        library = Library(standin, context, object_code)
        return numba_driver.CudaPythonModule(
            weakref.proxy(context), library,
            numba_driver._module_finalizer(context, library),
            setup_callbacks, teardown_callbacks)
    return load


def launch(standin):
    """cuda-core's launch(stream, config, kernel, *args) as numba-cuda's
    _Kernel.launch calls it: the run of the kernel's Python function queued
    on the stream (kernels.py), its arguments checked now and when it runs."""
    def run_launch(stream, config, kernel, *kernelargs):
        caller = sys._getframe(1).f_locals.get("self")
        if not isinstance(caller, dispatcher._Kernel):
            raise RuntimeError(
                "the stand-in's launch expects numba-cuda's _Kernel.launch as its caller "
                f"(numba-cuda 0.30); it was called from {sys._getframe(1).f_code.co_name}")
        d = standin.driver
        if not isinstance(kernel, Kernel) or not kernel.library.loaded:
            message = (f"launch of {getattr(kernel, 'name', kernel)!r}: its module is not "
                       "loaded (a context reset unloaded it?): CUDA_ERROR_INVALID_HANDLE")
            d.record_error("launch", message)
            raise CudaAPIError(_real.CUresult.CUDA_ERROR_INVALID_HANDLE, message)
        try:
            state = d.stream(_handle_of(stream))
            if kernel.library.context != d.contexts.current():
                raise CallRefused(_real.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                                  f"launch of {caller}: its module is in context "
                                  f"{kernel.library.context:#x}, the current one is "
                                  f"{d.contexts.current():#x}")
            grid, block = tuple(config.grid), tuple(config.block)
            refused = launch_bounds_refused(grid, block)
            if refused:
                raise CallRefused(_real.CUresult.CUDA_ERROR_INVALID_VALUE,
                                  f"launch of {caller}: {refused}")
            plan = kernels.LaunchPlan(standin, caller, kernel_function(caller, sys._getframe(1)),
                                      kernelargs, grid, block, int(config.shmem_size))
        except CallRefused as e:
            d.record_error("launch", str(e))
            raise CudaAPIError(e.code, str(e)) from None
        d.launched.add(kernel.library.context)
        d.launches[plan.label] += 1
        d.grids.append((plan.label, grid, block))
        d.queue.enqueue(state, plan.run, plan.label)
    return run_launch


MOST_THREADS = 1024                         # in a block, on every GPU since 2010
MOST_BLOCK = (1024, 1024, 64)
MOST_GRID = ((1 << 31) - 1, 65535, 65535)


def launch_bounds_refused(grid, block):
    """Why a GPU refuses a launch of ``grid`` blocks of ``block`` threads
    (CUDA_ERROR_INVALID_VALUE), or None."""
    threads = 1
    for n in block:
        threads *= n
    if threads > MOST_THREADS:
        return f"a block of {block} is {threads} threads, more than {MOST_THREADS}"
    for kind, dims, most in (("block", block, MOST_BLOCK), ("grid", grid, MOST_GRID)):
        if any(not 1 <= n <= m for n, m in zip(dims, most)):
            return f"the {kind} {dims} is outside 1 to {most}"
    return None


def kernel_function(kernel, frame):
    """The Python function of numba-cuda's ``_Kernel`` ``kernel``: its
    ``py_func``, or (a kernel read from Numba's disk cache has none) that of
    the CUDADispatcher found among the launching frames, whose overloads
    hold it."""
    function = getattr(kernel, "py_func", None)
    if function is not None:
        return function
    for _ in range(12):
        frame = frame.f_back
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, CUDADispatcher) and any(
                k is kernel for k in owner.overloads.values()):
            return owner.py_func
    raise RuntimeError(f"the stand-in cannot find the Python function of {kernel!r} "
                       "(a kernel from Numba's disk cache launched from outside its dispatcher)")
