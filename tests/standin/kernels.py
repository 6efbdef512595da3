"""Running a launched kernel on the stand-in: the kernel's Python function
under numba-cuda's CUDA simulator (its thread and block machinery, its
``cuda`` module), on NumPy views of the stand-in's memory at the addresses
the launch passed.

A launch is parsed as numba-cuda flattened it (``_Kernel._prepare_args``,
by the kernel's argument types): every array's address range is checked
when the launch is queued and again when it runs, and must then still be in
the allocation it was in at the launch. The function runs with its globals
(and those of the device functions and plain functions it calls) seen
through copies in which ``numba.cuda`` is the simulator's module, device
functions are their Python functions, and the equivalents registered
for intrinsics replace them (``INTRINSICS``); no
module's globals are changed, so host threads are not disturbed.
"""

import ctypes
import sys
import time
import types as pytypes

import numba
import numpy as np
from numba import cuda as numba_cuda
from numba.core import types
from numba.cuda.dispatcher import CUDADispatcher
from numba.cuda.errors import normalize_kernel_dimensions
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray
from numba.cuda.simulator.kernel import _push_kernel_context
from numba.cuda.simulator.kernelapi import Dim3, FakeCUDAModule
from numba.np import numpy_support
from numba.np.unsafe.ndarray import to_fixed_tuple

from simulator_threads import BlockManager  # tests/, on the path wherever standin is

from . import cpu

# Every import is made here, on the thread that imports the stand-in: a
# kernel runs on whichever thread waits for it, and an import there can race
# another thread's (CPython then hands one of them a partially initialised
# module); numba_alloc's modules are imported on the launching thread, and
# read from sys.modules here.


# intrinsics kernels call, by name: (their Python equivalent, a factory of a
# CPU-compilable one, or None where a kernel using it runs as Python only)
INTRINSICS = {
    "to_fixed_tuple": (lambda array, length: tuple(array[:length]), lambda: to_fixed_tuple),
    "globaltimer": (time.monotonic_ns, None),       # tests/gpu_kernels.py
}


def _heap_equivalents(heap_kernels):
    return {"cuda": heap_kernels.SimulatorCuda(), "_load": lambda array, index: array[index]}


MODULE_EQUIVALENTS = {"numba_alloc.device.heap_kernels": _heap_equivalents,
                      "numba_alloc.device.warp": lambda warp: {"cuda": warp.SimulatorCuda()}}

_COMPILED = {}      # (kernel function, argument types) -> cpu.CompiledKernel or None

_LIBRARY_PREFIXES = ("numpy", "math", "cmath", "builtins", "operator", "functools",
                     "collections", "llvmlite")


def _is_library(module):
    if module is None:
        return True
    if module == "numba" or module.startswith(("numba.", "numba_cuda")):
        return True
    return module.split(".")[0] in _LIBRARY_PREFIXES


def _names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _names(const)
    return names


# what makes the threads of a block wait for each other: such kernels run on
# the simulator's threads; the others run one thread after another
COOPERATING = frozenset((
    "syncthreads", "syncthreads_count", "syncthreads_and", "syncthreads_or", "shared",
    "syncwarp", "activemask", "ballot_sync", "match_any_sync", "match_all_sync",
    "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync", "all_sync",
    "any_sync", "eq_sync", "cg", "lanemask_lt"))


def kernel_cuda_module(grid, block, sharedmem):
    """The ``cuda`` a kernel run sees: the simulator's module, with
    ``nanosleep`` (a no-op here), and, when its threads run one after
    another (``run_sequentially``), their indices from the thread running
    now instead of from Python threads."""
    class KernelCuda(FakeCUDAModule):
        _position = None

        @property
        def threadIdx(self):
            position = self._position
            return position[1] if position else super().threadIdx

        @property
        def blockIdx(self):
            position = self._position
            return position[0] if position else super().blockIdx

        @property
        def laneid(self):
            position = self._position
            return position[2] % 32 if position else super().laneid

        def nanosleep(self, ns):
            pass

        def run_sequentially(self, function, args):
            x, y, z = self.blockDim
            for block_point in np.ndindex(*self.gridDim):
                block_index = Dim3(*block_point)
                for thread_point in np.ndindex(x, y, z):
                    linear = thread_point[0] + x * (thread_point[1] + y * thread_point[2])
                    self._position = (block_index, Dim3(*thread_point), linear)
                    try:
                        function(*args)
                    except Exception as e:
                        raise type(e)(f"tid={list(thread_point)} ctaid={list(block_point)}: "
                                      f"{e}") from e
            self._position = None

    return KernelCuda(grid, block, sharedmem)


class Rebuilder:
    """Copies of functions whose globals see the simulator (see above)."""

    def __init__(self, fake_cuda, wrap=None):
        self._fake, self._dispatcher = fake_cuda, CUDADispatcher
        self._cpu = wrap is not None
        self._wrap = wrap or (lambda function: function)   # what a call from a kernel gets
        self._memo = {}
        self._modules = {}

    def function(self, fn):
        done = self._memo.get(fn)
        if done is not None:
            return done
        scope = dict(fn.__globals__)
        closure = fn.__closure__
        if closure:
            closure = tuple(pytypes.CellType(self.value(c.cell_contents, scope, fn))
                            if _filled(c) else c for c in closure)
        new = pytypes.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, closure)
        new.__kwdefaults__ = fn.__kwdefaults__
        self._memo[fn] = new
        overrides = self._equivalents(fn.__module__)
        for name in _names(fn.__code__):
            if name in overrides:
                scope[name] = overrides[name]
            elif name in scope:
                scope[name] = self.value(scope[name], scope, fn)
        return new

    def cooperates(self):
        """Whether a function rebuilt so far uses what makes threads wait
        for each other (COOPERATING)."""
        return any(_names(fn.__code__) & COOPERATING for fn in self._memo)

    def _equivalents(self, module):
        if module not in self._modules:
            factory = MODULE_EQUIVALENTS.get(module)
            self._modules[module] = factory(sys.modules[module]) if factory else {}
        return self._modules[module]

    def value(self, value, scope, fn):
        if value is numba_cuda:
            return self._fake
        if isinstance(value, self._dispatcher):
            return self._wrap(self.function(value.py_func))
        if isinstance(value, pytypes.FunctionType) and not _is_library(value.__module__):
            return self._wrap(self.function(value))
        if type(value).__name__ == "_Intrinsic":
            python, cpu = INTRINSICS.get(value._name, (None, None))
            equivalent = (cpu() if cpu else None) if self._cpu else python
            if equivalent is None:
                raise TypeError(f"{fn.__module__}.{fn.__qualname__} calls the intrinsic "
                                f"{value._name}, which has no "
                                f"{'CPU' if self._cpu else 'Python'} equivalent in "
                                "standin.kernels.INTRINSICS")
            return equivalent
        return value


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


class _HeapInKernel:
    """A DeviceHeap argument inside a kernel run: malloc, malloc_warp, free
    and view over NumPy views of its data and meta, by heap_kernels'
    functions."""

    def __init__(self, heap_type, data, meta, rebuild):
        self.data, self.meta = data, meta
        self._malloc, self._free = rebuild(heap_type.heap_malloc), rebuild(heap_type.heap_free)
        self._malloc_warp = rebuild(heap_type.heap_malloc_warp)
        self._heap_type = heap_type

    def malloc(self, nbytes):
        return self._malloc(self.data, self.meta, nbytes)

    def malloc_warp(self, nbytes):
        return self._malloc_warp(self.data, self.meta, nbytes)

    def free(self, offset):
        self._free(self.data, self.meta, offset)

    def view(self, offset, count, dtype):
        dtype = self._heap_type.as_dtype(dtype)
        start, items = self._heap_type.view_bounds(self.data.size, offset, count, dtype.itemsize)
        return self.data[start:start + items * dtype.itemsize].view(dtype)


class _ArraySpec:
    """One array argument: its range, checked at launch and at run."""

    def __init__(self, standin, ty, size, itemsize, ptr, shape, strides, label):
        self.dtype = numpy_support.as_dtype(ty.dtype)
        self.shape, self.strides, self.ptr = tuple(shape), tuple(strides), int(ptr)
        self.label = label
        low = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides)) if size else 0
        high = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + itemsize \
            if size else 0
        self.low, self.nbytes = low, high - low
        self.allocation = None
        if self.nbytes:
            self.allocation = standin.driver.claim(self.ptr + low, self.nbytes, label,
                                                   spanning=True)

    def build(self, standin, plain):
        if not self.nbytes:
            array = np.empty(self.shape, self.dtype)
        else:
            standin.driver.still(self.allocation, self.ptr + self.low, self.nbytes, self.label)
            base = self.allocation.view(self.ptr + self.low - self.allocation.address,
                                        self.nbytes)
            array = np.ndarray(self.shape, self.dtype, buffer=base, offset=-self.low,
                               strides=self.strides)
        if plain:
            return array
        return FakeWithinKernelCUDAArray(FakeCUDAArray(array))


class LaunchPlan:
    """A launch of numba-cuda's ``_Kernel`` ``kernel``: its arguments parsed
    from ``kernelargs`` (checked now), run by :meth:`run` when the stand-in's
    queue reaches it."""

    def __init__(self, standin, kernel, function, kernelargs, grid, block, sharedmem):
        self.standin, self.kernel, self.function = standin, kernel, function
        self.grid, self.block, self.sharedmem = grid, block, sharedmem
        self.label = f"kernel {function.__module__}.{function.__qualname__}"
        values = iter(kernelargs)
        self.specs = [self._parse(ty, values) for ty in kernel.argument_types]
        rest = list(values)
        if rest:
            raise RuntimeError(f"{self.label}: {len(rest)} launch values left over: numba-cuda "
                               "flattens arguments differently from what the stand-in reads")

    def _parse(self, ty, values):
        from numba_alloc.device import heap_type
        if isinstance(ty, types.Array):
            meminfo, parent, size, itemsize, ptr = (_plain(next(values)) for _ in range(5))
            shape = [_plain(next(values)) for _ in range(ty.ndim)]
            strides = [_plain(next(values)) for _ in range(ty.ndim)]
            return ("array", _ArraySpec(self.standin, ty, size, itemsize, ptr, shape,
                                        strides, self.label))
        if heap_type.DeviceHeapType is not None and isinstance(ty, heap_type.DeviceHeapType):
            return ("heap", heap_type, [self._parse(t, values) for t in ty])
        if isinstance(ty, types.BaseTuple):
            return ("tuple", ty, [self._parse(t, values) for t in ty])
        if isinstance(ty, types.CPointer):
            return ("value", _plain(next(values)))
        if ty == types.float16:
            return ("value", np.uint16(_plain(next(values))).view(np.float16))
        if isinstance(ty, types.Complex):
            real, imag = _plain(next(values)), _plain(next(values))
            return ("value", numpy_support.as_dtype(ty).type(complex(real, imag)))
        if isinstance(ty, (types.NPDatetime, types.NPTimedelta)):
            return ("value", np.int64(_plain(next(values))).view(numpy_support.as_dtype(ty)))
        if isinstance(ty, (types.Integer, types.Float)):
            return ("value", numpy_support.as_dtype(ty).type(_plain(next(values))))
        if ty == types.boolean:
            return ("value", bool(_plain(next(values))))
        if isinstance(ty, types.EnumMember):
            return ("enum", ty, self._parse(ty.dtype, values))
        raise NotImplementedError(f"{self.label}: the stand-in cannot pass an argument of "
                                  f"type {ty}")

    def _compiled(self):
        """The kernel compiled for the CPU (cpu.py) for these argument types,
        or None where that target cannot compile it; once per kernel."""
        key = (self.function, tuple(self.kernel.argument_types))
        if key not in _COMPILED:
            rebuilder = Rebuilder(cpu.CUDA, wrap=numba.njit(boundscheck=True))
            args = [self._build(spec, None, plain=True) for spec in self.specs]
            _COMPILED[key] = cpu.compile_kernel(self.function, rebuilder, args)
        return _COMPILED[key]

    def _build(self, spec, rebuilder, plain=False):
        kind = spec[0]
        if kind == "array":
            return spec[1].build(self.standin, plain)
        if kind == "value":
            return spec[1]
        if kind == "heap":
            data, meta = (self._build(s, rebuilder, plain=True) for s in spec[2])
            return _HeapInKernel(spec[1], data, meta, rebuilder.function)
        if kind == "tuple":
            values = [self._build(s, rebuilder, plain) for s in spec[2]]
            instance = getattr(spec[1], "instance_class", None)
            return instance(*values) if instance is not None else tuple(values)
        if kind == "enum":
            return spec[1].instance_class(self._build(spec[2], rebuilder, plain))
        raise AssertionError(kind)

    def run(self):
        grid, block = normalize_kernel_dimensions(self.grid, self.block)
        fake = kernel_cuda_module(grid, block, self.sharedmem)
        rebuilder = Rebuilder(fake)
        function = rebuilder.function(self.function)
        args = [self._build(spec, rebuilder) for spec in self.specs]
        threaded = any(spec[0] == "heap" for spec in self.specs) or rebuilder.cooperates()
        if not threaded:
            compiled = self._compiled()
            if compiled is not None:
                compiled.run(grid, block, [self._build(spec, None, plain=True)
                                           for spec in self.specs])
                return
        with _push_kernel_context(fake):
            if threaded:            # threads that wait for each other: the simulator's
                for point in np.ndindex(*grid):
                    BlockManager(function, grid, block, False).run(point, *args)
            else:                   # independent threads: one after another, faster
                fake.run_sequentially(function, args)


def _plain(value):
    """An int or float from what numba-cuda put in a launch's argument list."""
    if isinstance(value, ctypes._SimpleCData):
        return value.value
    if hasattr(value, "__int__") and not isinstance(value, (int, float)):
        return int(value)
    return value
