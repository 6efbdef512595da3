"""numba_alloc's version (a leaf: the package and the packaging read it)."""

__version__ = "0.1.0"
