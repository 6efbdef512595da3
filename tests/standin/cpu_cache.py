"""An on-disk cache of the stand-in's CPU kernels (cpu.py), shared by the
processes of a test run: compiling a kernel for the CPU takes seconds, and
the stand-in tier starts a hundred processes that compile the same few.

Numba's own cache keys a function by its source file's time stamp, which
misses a change in a device function of another file. Here the directory is
named by a hash of every Python file of the repository and the versions of
Python, NumPy, llvmlite and Numba: any edit gives a new, empty directory.
Only kernels defined in the repository's files, with no closure or a
closure of plain values, are cached; the others compile as before.

In each directory, a kernel and its argument types have an index file and
a data file of their own, so that processes saving different kernels at
once never share a file (processes saving the same one write the same
bytes, each file replaced whole). Directories unused for a day are removed.
"""

import getpass
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import llvmlite
import numba
import numpy as np
from numba.core.caching import FunctionCache, CompileResultCacheImpl, _CacheLocator

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("numba_alloc", "kernels", "tests", "benchmarks")
STALE_SECONDS = 24 * 3600
_PLAIN = (int, float, bool, str, bytes, type(None), np.generic)
_directory = None


def tree_digest(root=ROOT):
    """A hash of every Python file under ``root``'s SOURCES (names and
    bytes) and of the versions that compile them."""
    digest = hashlib.sha256(repr((sys.version, np.__version__, llvmlite.__version__,
                                  numba.__version__)).encode())
    for path in sorted(p for name in SOURCES for p in (root / name).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def directory():
    """This tree's cache directory, created in $NUMBA_ALLOC_STANDIN_CACHE
    (default: numba-alloc-standin-USER in the temporary directory), whose
    other directories unused for a day are removed."""
    global _directory
    if _directory is None:
        parent = Path(os.environ.get("NUMBA_ALLOC_STANDIN_CACHE") or
                      Path(tempfile.gettempdir()) / f"numba-alloc-standin-{getpass.getuser()}")
        here = parent / tree_digest()
        here.mkdir(parents=True, exist_ok=True)
        os.utime(here)
        for other in parent.iterdir():
            try:
                stale = time.time() - other.stat().st_mtime > STALE_SECONDS
            except OSError:             # another process removed it meanwhile
                continue
            if other != here and stale:
                shutil.rmtree(other, ignore_errors=True)
        _directory = here
    return _directory


def kernel_key(py_func):
    """What names ``py_func`` (a kernel's Python function) in the cache, or
    None when it cannot be cached: defined outside the repository, or
    closing over something other than plain values."""
    code = py_func.__code__
    path = Path(code.co_filename)
    if not path.is_absolute() or not path.resolve().is_relative_to(ROOT):
        return None
    cells = tuple(cell.cell_contents for cell in py_func.__closure__ or ())
    if not all(isinstance(value, _PLAIN) for value in cells):
        return None
    return (str(path.resolve().relative_to(ROOT)), py_func.__qualname__, code.co_firstlineno,
            repr(cells))


class _Locator(_CacheLocator):
    """The tree's directory, for a function that carries its name there as
    ``standin_cache_name``."""

    def __init__(self, name, py_file):
        self._name = name
        self._py_file = py_file         # where Numba's warning of an uncachable function points

    def get_cache_path(self):
        return str(directory())

    def get_source_stamp(self):
        return directory().name

    def get_disambiguator(self):
        return self._name

    @classmethod
    def from_function(cls, py_func, py_file):
        name = getattr(py_func, "standin_cache_name", None)
        return None if name is None else cls(name, py_file)


class _Impl(CompileResultCacheImpl):
    _locator_classes = [_Locator]


class KernelCache(FunctionCache):
    """The cache of one compiled grid loop (cpu.py): ``loop`` runs the
    kernel named by ``key`` (kernel_key) for one tuple of argument types.
    Set as the loop's dispatcher's cache, as Dispatcher.enable_caching()
    sets Numba's."""

    _impl_class = _Impl

    def __init__(self, loop, key):
        self._key = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
        loop.standin_cache_name = self._key
        super().__init__(loop)

    def _index_key(self, sig, codegen):
        # the loop's closure holds the kernel's dispatcher: its key stands for it
        return (sig, codegen.magic_tuple(), self._key)
