"""A Dask worker preload (a file: LocalCluster(preload=[its path])): the
worker cannot import numba_alloc, as one where it is not installed."""
import sys


class _NoNumbaAlloc:
    def find_spec(self, name, path=None, target=None):
        if name == "numba_alloc" or name.startswith("numba_alloc."):
            raise ImportError(f"No module named {name!r} (hidden on this worker)", name=name)
        return None


for _name in [n for n in sys.modules if n == "numba_alloc" or n.startswith("numba_alloc.")]:
    del sys.modules[_name]
sys.meta_path.insert(0, _NoNumbaAlloc())
