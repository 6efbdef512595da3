"""Kernels the workloads share, written once for ``numba.cuda``.

Each is a plain function over ``cuda.grid``/``cuda.gridsize`` grid-stride
loops, so any launch configuration covers the whole array: an array
provider compiles it with ``cuda.jit`` on a GPU, or runs it through Numba's
CUDA simulator on the CPU. Sums are float64, one atomic add per thread.
"""

from numba import cuda


def fill_pattern(x, seed):
    """x[i] = ((7 i + seed) mod 101), exact in any float type."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = (7 * i + seed) % 101


def fill_value(x, value):
    """x[i] = value."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = value


def copy(out, x):
    """out[i] = x[i]."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = x[i]


def axpy(out, a, x, y):
    """out[i] = a x[i] + y[i]."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * x[i] + y[i]


def dot(acc, x, y):
    """acc[0] += sum of x[i] y[i]."""
    partial = 0.0
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i] * y[i]
    cuda.atomic.add(acc, 0, partial)


def total(acc, x):
    """acc[0] += sum of x[i]."""
    partial = 0.0
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        partial += x[i]
    cuda.atomic.add(acc, 0, partial)


def pattern_sum(n, seed):
    """The exact sum of ``n`` values written by :func:`fill_pattern`: 7 and
    101 are coprime, so every 101 consecutive values are 0..100 once."""
    return n // 101 * 5050 + sum((7 * r + seed) % 101 for r in range(n % 101))
