"""The core and the kernels compile under NumPy 2.5 and later with Numba
0.68 and numba-cuda 0.30.

NumPy 2.5 removed ``np.row_stack``, but Numba 0.68's ``numba.np.arrayobj``
(loaded at the first CPU compile: the pool's core) and numba-cuda 0.30's
``numba.cuda.np.arrayobj`` (loaded when the CUDA target loads its typing
registries) register an overload of it unconditionally, so every compile
raises ``AttributeError``. :func:`apply` (called on import) installs an
import hook that loads those modules, whenever something first imports
them, with a stand-in ``np.row_stack``, and removes the stand-in again:
NumPy is left unchanged and no code can reach the overload. Nothing is
imported until then (importing numba_alloc does not import numba.cuda). It
does nothing where ``np.row_stack`` exists or once the modules have loaded.
"""

import importlib.abc
import importlib.machinery
import sys

import numpy as np

_MODULES = ("numba.np.arrayobj", "numba.cuda.np.arrayobj")


def _removed_row_stack(tup):
    """Stand-in for the function NumPy 2.5 removed; never called."""
    raise AttributeError("numpy has no row_stack")


class _WithRowStack(importlib.abc.Loader):
    """Runs a module's ``loader`` with the stand-in in NumPy."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        np.row_stack = _removed_row_stack
        try:
            self._loader.exec_module(module)
        finally:
            del np.row_stack


class _ArrayobjFinder(importlib.abc.MetaPathFinder):
    """Finds Numba's and numba-cuda's array overloads for loading with the
    stand-in; finds nothing else."""

    def find_spec(self, name, path, target=None):
        if name not in _MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _WithRowStack(spec.loader)
        return spec


_FINDER = _ArrayobjFinder()


def apply():
    """Install the hook if NumPy lacks ``np.row_stack`` and the array
    overloads have not all loaded yet."""
    if (hasattr(np, "row_stack") or all(m in sys.modules for m in _MODULES)
            or _FINDER in sys.meta_path):
        return
    sys.meta_path.insert(0, _FINDER)


apply()
