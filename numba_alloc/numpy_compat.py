"""Kernels compile under NumPy 2.5 and later with numba-cuda 0.30.

NumPy 2.5 removed ``np.row_stack``, but numba-cuda 0.30's
``numba.cuda.np.arrayobj`` registers an overload of it unconditionally when
the CUDA target loads its typing registries, so every kernel compile raises
``AttributeError``. :func:`apply` loads that module once with a stand-in
``np.row_stack`` and removes the stand-in again: NumPy is left unchanged and
no code can reach the overload. It does nothing where ``np.row_stack``
exists, under the CUDA simulator (which compiles nothing), and once the
module has loaded.
"""

import sys

import numpy as np

_MODULE = "numba.cuda.np.arrayobj"


def _removed_row_stack(tup):
    """Stand-in for the function NumPy 2.5 removed; never called."""
    raise AttributeError("numpy has no row_stack")


def apply():
    """Load numba-cuda's array overloads if NumPy lacks ``np.row_stack``."""
    if hasattr(np, "row_stack") or _MODULE in sys.modules:
        return
    from numba.cuda import config
    if config.ENABLE_CUDASIM:
        return
    np.row_stack = _removed_row_stack
    try:
        __import__(_MODULE)
    finally:
        del np.row_stack


apply()
