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
from llvmlite import ir
from numba.core import types
from numba.core.extending import (intrinsic, models, overload, overload_attribute,
                                  register_model, typeof_impl)
from numba.core.imputils import lower_constant

# the state the grid loop sets for each thread (int64s)
BX, BY, BZ, TX, TY, TZ, BDX, BDY, BDZ, GDX, GDY, GDZ, LINEAR = range(13)
_STATE = (ctypes.c_int64 * 16)()
_ADDRESS = ctypes.addressof(_STATE)


@intrinsic
def _state(typingctx):
    """A pointer to the thread state (a constant address)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(ir.Constant(ir.IntType(64), _ADDRESS),
                                ir.IntType(64).as_pointer())
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


@numba.njit
def _run_grid(kernel, gx, gy, gz, tx, ty, tz, args):
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


class CompiledKernel:
    """A kernel's CPU version: ``run(grid, block, args)``."""

    def __init__(self, function):
        self._function = function

    def run(self, grid, block, args):
        _run_grid(self._function, *grid, *block, tuple(args))


def compile_kernel(py_func, rebuild, args):
    """A CompiledKernel of ``py_func`` for ``args``, or None when Numba's CPU
    target cannot compile it with :data:`CUDA` (``rebuild``: the Rebuilder
    giving functions whose globals see it)."""
    try:
        function = numba.njit(boundscheck=True)(rebuild.function(py_func))
        function.compile(tuple(numba.typeof(a) for a in args))
    except Exception:       # noqa: BLE001 (not compilable here: the simulator runs it)
        return None
    return CompiledKernel(function)

