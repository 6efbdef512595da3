"""Conjugate gradient for an implicit diffusion step, allocating as a
straightforward Numba CG does: every iteration makes new ``Ap``, ``x``,
``r`` and ``p`` vectors and a zeroed one-element accumulator per dot product,
and frees the old ones.

The system is (I + a L) x = b on an m x m grid (L the 5-point Laplacian,
zero Dirichlet boundary, a = 1), symmetric positive definite with condition
number below 9, so a fixed number of iterations converges at any size and
the allocation sequence does not depend on the data. The right-hand side is
b = A x* for a known x*; the check compares b with NumPy's A x* and the
solution with x*.

Out of memory stops the solver (the workload ends and reports it).
"""

import math

import numpy as np
from numba import cuda

from . import linalg

NAME = "cg"
ITERATIONS = 30
SIMULATOR_STEPS = 10
ALPHA = 1.0
ON_OUT_OF_MEMORY = "stops"


def grid_side(scale):
    """m: 4096 at scale 1 (16.8M unknowns, 128 MiB per float64 vector)."""
    return max(8, round(4096 * math.sqrt(scale)))


def matvec(out, p, m, alpha):
    """out = (I + alpha L) p on the m x m grid, p flattened row-major."""
    for k in range(cuda.grid(1), m * m, cuda.gridsize(1)):
        i = k // m
        j = k - i * m
        s = (1.0 + 4.0 * alpha) * p[k]
        if i > 0:
            s -= alpha * p[k - m]
        if i < m - 1:
            s -= alpha * p[k + m]
        if j > 0:
            s -= alpha * p[k - 1]
        if j < m - 1:
            s -= alpha * p[k + 1]
        out[k] = s


def solution_pattern(x):
    """x*[k] = ((7919 k) mod 1000) / 1000."""
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[k] = ((7919 * k) % 1000) / 1000.0


def reference_solution(n):
    return (7919 * np.arange(n, dtype=np.int64) % 1000) / 1000.0


def reference_matvec(p, m, alpha):
    grid = p.reshape(m, m)
    out = (1.0 + 4.0 * alpha) * grid
    out[1:, :] -= alpha * grid[:-1, :]
    out[:-1, :] -= alpha * grid[1:, :]
    out[:, 1:] -= alpha * grid[:, :-1]
    out[:, :-1] -= alpha * grid[:, 1:]
    return out.reshape(-1)


def _dot(arrays, x, y):
    """x . y through a fresh zeroed accumulator (1.0 when the arrays hold
    no data: nothing downstream depends on it then)."""
    acc = arrays.to_device(np.zeros(1))
    arrays.launch(linalg.dot, x.size, acc, x, y)
    value = arrays.to_host(acc)
    arrays.free(acc)
    return 1.0 if value is None else float(value[0])


def _replace(arrays, old, new):
    arrays.free(old)
    return new


def run(arrays, scale, steps=ITERATIONS):
    """Solve with ``steps`` CG iterations; raises AssertionError when the
    result is wrong."""
    m = grid_side(scale)
    n = m * m
    x_true = arrays.empty(n, np.float64)
    arrays.launch(solution_pattern, n, x_true)
    b = arrays.empty(n, np.float64)
    arrays.launch(matvec, n, b, x_true, m, ALPHA)
    if arrays.computes:
        arrays.synchronize()
        with arrays.untimed():
            np.testing.assert_allclose(arrays.to_host(b),
                                       reference_matvec(reference_solution(n), m, ALPHA),
                                       rtol=1e-12, atol=1e-12,
                                       err_msg="cg: b = A x* differs from NumPy's")
    x = arrays.empty(n, np.float64)
    arrays.launch(linalg.fill_value, n, x, 0.0)
    r = arrays.empty(n, np.float64)
    arrays.launch(linalg.copy, n, r, b)             # r = b - A 0
    p = arrays.empty(n, np.float64)
    arrays.launch(linalg.copy, n, p, b)
    arrays.free(b)
    rr = _dot(arrays, r, r)
    for _ in range(steps):
        ap = arrays.empty(n, np.float64)
        arrays.launch(matvec, n, ap, p, m, ALPHA)
        p_ap = _dot(arrays, p, ap)
        assert p_ap > 0, f"cg: p.Ap = {p_ap}, but A is positive definite"
        step = rr / p_ap
        new = arrays.empty(n, np.float64)
        arrays.launch(linalg.axpy, n, new, step, p, x)
        x = _replace(arrays, x, new)
        new = arrays.empty(n, np.float64)
        arrays.launch(linalg.axpy, n, new, -step, ap, r)
        r = _replace(arrays, r, new)
        arrays.free(ap)
        rr_new = _dot(arrays, r, r)
        new = arrays.empty(n, np.float64)
        arrays.launch(linalg.axpy, n, new, rr_new / rr, p, r)
        p = _replace(arrays, p, new)
        rr = rr_new
        arrays.checkpoint()
    if arrays.computes:
        arrays.synchronize()
        with arrays.untimed():
            got, expected = arrays.to_host(x), arrays.to_host(x_true)
            error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
            bound = 6 * 0.5 ** steps + 1e-9     # CG's bound for a condition number below 9
            assert error < bound, (f"cg: relative error {error:.3g} after {steps} "
                                   f"iterations, above the bound {bound:.3g}")
    for array in (x, r, p, x_true):
        arrays.free(array)
