"""The kernels the GPU tests launch, as plain Python functions: this module
imports without a GPU, so CI can compile each to PTX (``cuda.compile_ptx``
needs NVVM, not a GPU). ``PTX_KERNELS`` lists every kernel with the
signature it is launched with; ``jit(fn)`` is the kernel to launch
(compiled on first use). Every Python function here is a kernel
(``globaltimer`` is an intrinsic they call), but ``twice``, the scalar
function of a CUDA @vectorize ufunc, listed in ``PTX_DEVICE_FUNCTIONS``."""

import collections
import functools

from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic


def add_one(x):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] += 1


def axpy(out, a, x, y):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * x[i] + y[i]


def add(x, y, out):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = x[i] + y[i]


def scale(x, factor):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] *= factor


@intrinsic
def globaltimer(typingctx):
    """The GPU's global nanosecond timer (PTX ``%globaltimer``)."""
    def codegen(context, builder, signature, args):
        read = ir.InlineAsm(ir.FunctionType(ir.IntType(64), []),
                            "mov.u64 $0, %globaltimer;", "=l", side_effect=True)
        return builder.call(read, [])
    return types.int64(), codegen


def wait_then_fill(flag, x, value, timeout_ns):
    """Thread 0 waits until it sees the host set ``flag[0]`` (mapped memory)
    or ``timeout_ns`` nanoseconds pass on the GPU's clock; then the block
    fills ``x`` with ``value``. Launch with one block. Nothing guarantees
    that a GPU thread ever sees a host's write to mapped memory, so the
    clock ends the wait: the kernel runs until the host lets it go or the
    timeout passes, whichever it notices first, and not much longer. The flag
    is read with an atomic add of 0, which goes to memory on every
    iteration (a plain load may be hoisted or served from cache;
    cuda.ldcv does not compile to PTX without a GPU in numba-cuda 0.30.4)."""
    if cuda.threadIdx.x == 0:
        deadline = globaltimer() + timeout_ns
        while cuda.atomic.add(flag, 0, 0) == 0 and globaltimer() < deadline:
            cuda.nanosleep(1000)
    cuda.syncthreads()
    for i in range(cuda.threadIdx.x, x.size, cuda.blockDim.x):
        x[i] = value


Pair = collections.namedtuple("Pair", "x y")


def add_pair(pair, out):
    """``out`` becomes ``pair.x + pair.y`` (a namedtuple of arrays)."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = pair.x[i] + pair.y[i]


def twice(x):
    """The scalar function of a CUDA @vectorize ufunc."""
    return 2 * x


def fill_value(x, value):
    """Every byte of ``x`` becomes ``value``."""
    i = cuda.grid(1)
    if i < x.size:
        x[i] = value


PTX_KERNELS = [
    (add_one, "void(float32[:])"),
    (axpy, "void(float32[::1], float32, float32[::1], float32[::1])"),
    (add, "void(float32[::1], float32[::1], float32[::1])"),
    (scale, "void(float32[:], float32)"),
    (wait_then_fill, "void(int32[::1], float32[::1], float32, int64)"),
    (fill_value, "void(uint8[::1], uint8)"),
    (add_pair, (types.NamedUniTuple(types.float32[::1], 2, Pair), types.float32[::1])),
]

# device functions (compiled with device=True), as @vectorize compiles them
PTX_DEVICE_FUNCTIONS = [(twice, "float32(float32)")]


# ``fn`` as a CUDA kernel, one per function (not itself a Python function,
# so that only kernels are functions of this module)
jit = functools.cache(cuda.jit)
