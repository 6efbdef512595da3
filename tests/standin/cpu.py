"""Kernels compiled for the CPU, for the stand-in: the kernel's own Python
function (from its bytecode, as the CUDA target compiles it) compiled by
Numba's CPU target, with ``numba.cuda`` replaced by :data:`CUDA`, a module
whose ``grid``, ``threadIdx``, ``atomic``, ... read and write one block of
state that a compiled loop over the grid's threads sets before each call.
Threads run one after another, so kernels whose threads wait for each other
(syncthreads, shared memory, warp collectives) are not compiled here; nor
are those using what this module lacks: :func:`compile_kernel` then
returns None and the stand-in runs the kernel under the CUDA simulator.

Bounds are checked: an index outside an array raises IndexError (the
stand-in records it) instead of writing outside it.
"""

import ctypes
import types as pytypes

import numba
import numpy as np
from llvmlite import binding, ir
from numba.core import types
from numba.core.extending import (intrinsic, models, overload, overload_attribute,
                                  register_model, typeof_impl)
from numba.core.imputils import lower_constant

from . import cpu_cache

# the state the grid loop sets for each thread (int64s)
BX, BY, BZ, TX, TY, TZ, BDX, BDY, BDZ, GDX, GDY, GDZ, LINEAR = range(13)
_STATE = (ctypes.c_int64 * 16)()
_ADDRESS = ctypes.addressof(_STATE)


# the state's address reaches compiled code as a symbol the JIT resolves when
# it loads the code, not as a constant: cached code runs in other processes
_SYMBOL = "numba_alloc_standin_thread_state"
binding.add_symbol(_SYMBOL, _ADDRESS)


@intrinsic
def _state(typingctx):
    """A pointer to the thread state."""
    def codegen(context, builder, signature, args):
        module = builder.module
        state = module.globals.get(_SYMBOL)
        if state is None:
            state = ir.GlobalVariable(module, ir.ArrayType(ir.IntType(64), 16), _SYMBOL)
        return builder.bitcast(state, ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(), codegen


@numba.njit(inline="always")
def _get(i):
    return numba.carray(_state(), 16)[i]


@numba.njit(inline="always")
def _set(i, value):
    numba.carray(_state(), 16)[i] = value


# -- threadIdx, blockIdx, blockDim, gridDim: objects whose .x .y .z read the state --

class _Dim3Reader:
    def __init__(self, first):
        self.first = first


class Dim3ReaderType(types.Type):
    def __init__(self, first):
        self.first = first
        super().__init__(name=f"Dim3Reader({first})")


@typeof_impl.register(_Dim3Reader)
def _typeof_dim3(value, context):
    return Dim3ReaderType(value.first)


register_model(Dim3ReaderType)(models.OpaqueModel)


@lower_constant(Dim3ReaderType)
def _constant_dim3(context, builder, ty, value):
    return context.get_dummy_value()


for _axis, _name in enumerate("xyz"):
    def _make(axis):
        def getter(reader):
            first = reader.first
            return lambda reader: _get(first + axis)
        return getter
    overload_attribute(Dim3ReaderType, _name)(_make(_axis))


# -- the functions of ``cuda`` ------------------------------------------------------------

def _stub(name):
    def stub(*args):
        raise TypeError(f"cuda.{name} runs inside compiled kernels only")
    stub.__name__ = name
    return stub


def _namespace(name, **members):
    module = pytypes.ModuleType(name)
    for key, value in members.items():
        setattr(module, key, value)
    return module


grid, gridsize = _stub("grid"), _stub("gridsize")


@overload(grid)
def _grid(n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    dims = n.literal_value

    def one(n):
        return _get(BX) * _get(BDX) + _get(TX)

    def two(n):
        return (_get(BX) * _get(BDX) + _get(TX), _get(BY) * _get(BDY) + _get(TY))

    def three(n):
        return (_get(BX) * _get(BDX) + _get(TX), _get(BY) * _get(BDY) + _get(TY),
                _get(BZ) * _get(BDZ) + _get(TZ))
    return {1: one, 2: two, 3: three}.get(dims)


@overload(gridsize)
def _gridsize(n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    dims = n.literal_value

    def one(n):
        return _get(BDX) * _get(GDX)

    def two(n):
        return (_get(BDX) * _get(GDX), _get(BDY) * _get(GDY))

    def three(n):
        return (_get(BDX) * _get(GDX), _get(BDY) * _get(GDY), _get(BDZ) * _get(GDZ))
    return {1: one, 2: two, 3: three}.get(dims)


@numba.njit
def _nothing(*args):
    return None


@numba.njit
def _laneid():
    return _get(LINEAR) % 32


def _atomic(name, combine):
    stub = _stub(f"atomic.{name}")

    @overload(stub)
    def implementation(array, index, value):
        def impl(array, index, value):
            old = array[index]
            array[index] = combine(old, value)
            return old
        return impl
    return stub


@numba.njit(inline="always")
def _cas(array, index, expected, value):
    old = array[index]
    if old == expected:
        array[index] = value
    return old


@numba.njit(inline="always")
def _inc(old, value):
    return 0 if old >= value else old + 1


@numba.njit(inline="always")
def _dec(old, value):
    return value if old == 0 or old > value else old - 1


atomic = _namespace(
    "cuda.atomic",
    add=_atomic("add", numba.njit(lambda a, b: a + b)),
    sub=_atomic("sub", numba.njit(lambda a, b: a - b)),
    max=_atomic("max", numba.njit(lambda a, b: max(a, b))),
    min=_atomic("min", numba.njit(lambda a, b: min(a, b))),
    exch=_atomic("exch", numba.njit(lambda a, b: b)),
    and_=_atomic("and_", numba.njit(lambda a, b: a & b)),
    or_=_atomic("or_", numba.njit(lambda a, b: a | b)),
    xor=_atomic("xor", numba.njit(lambda a, b: a ^ b)),
    inc=_atomic("inc", _inc), dec=_atomic("dec", _dec),
    cas=_cas, compare_and_swap=_cas)

_local_array = _stub("local.array")


@overload(_local_array)
def _local(shape, dtype):
    def impl(shape, dtype):
        return np.empty(shape, dtype)
    return impl


@numba.njit(inline="always")
def _array_like(array):
    return array


@numba.njit
def _popc(value):
    count = 0
    while value:
        value &= value - 1
        count += 1
    return count


CUDA = _namespace(
    "numba.cuda (the stand-in's CPU kernels)",
    grid=grid, gridsize=gridsize,
    threadIdx=_Dim3Reader(TX), blockIdx=_Dim3Reader(BX),
    blockDim=_Dim3Reader(BDX), gridDim=_Dim3Reader(GDX),
    warpsize=32, laneid=_laneid,
    atomic=atomic, local=_namespace("cuda.local", array=_local_array),
    const=_namespace("cuda.const", array_like=_array_like),
    nanosleep=_nothing, threadfence=_nothing, threadfence_block=_nothing,
    threadfence_system=_nothing, popc=_popc)


# -- the loop over the grid --------------------------------------------------------------

@numba.njit(inline="always")
def _set3(first, x, y, z):
    _set(first, x)
    _set(first + 1, y)
    _set(first + 2, z)


def _grid_loop(kernel):
    """A function running ``kernel`` (a CPU dispatcher) for every thread of
    a grid, one after another."""
    def grid_loop(gx, gy, gz, tx, ty, tz, args):
        _set3(BDX, tx, ty, tz)
        _set3(GDX, gx, gy, gz)
        for bz in range(gz):
            for by in range(gy):
                for bx in range(gx):
                    _set3(BX, bx, by, bz)
                    for z in range(tz):
                        for y in range(ty):
                            for x in range(tx):
                                _set3(TX, x, y, z)
                                _set(LINEAR, x + tx * (y + ty * z))
                                kernel(*args)
    return grid_loop


class CompiledKernel:
    """A kernel's CPU version: ``run(grid, block, args)``."""

    def __init__(self, loop):
        self._loop = loop

    def run(self, grid, block, args):
        self._loop(*grid, *block, tuple(args))


def compile_kernel(py_func, rebuild, args):
    """A CompiledKernel of ``py_func`` for ``args``, or None when Numba's CPU
    target cannot compile it with :data:`CUDA` (``rebuild``: the Rebuilder
    giving functions whose globals see it). From the on-disk cache
    (cpu_cache.py) where it has the kernel for these argument types."""
    try:
        kernel = numba.njit(boundscheck=True)(rebuild.function(py_func))
        loop = _grid_loop(kernel)
        dispatcher = numba.njit(loop)
        argument_types = (types.int64,) * 6 + (numba.typeof(tuple(args)),)
        key = cpu_cache.kernel_key(py_func)
        if key is not None:         # what Dispatcher.enable_caching() does, our cache
            dispatcher._cache = cpu_cache.KernelCache(loop, (key, str(argument_types)))
        dispatcher.compile(argument_types)
    except Exception:       # noqa: BLE001 (not compilable here: the simulator runs it)
        return None
    return CompiledKernel(dispatcher)
