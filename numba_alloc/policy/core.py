"""The pool's compiled core: block table, free index and counters in one
NumPy int64 array, operated on by compiled functions (_core.pyx, built by
Cython when the package is installed: nothing is compiled at run time) that
the pool calls with the array's address (one integer argument, not an
array: unboxing an array costs more than the work).

Layout:

* a header (free-row stack, capacity, max_split_size, growth off, free-index
  bytes and counts per kind, heads of the lists of huge free blocks, the
  list of open frees, the last carve's record (for untake), the block
  generation, the batch size);
* the counters: per family (numba_alloc.policy.counters.FAMILIES), current, allocated and
  freed per kind, and the peak per kind and for both;
* the free index per kind: exact-size bins (doubly linked through the rows,
  newest first) for sizes below 32 MiB with a two-level bitmap over them,
  and one list for larger free blocks (scanned: they are few);
* the block table: one row of NF int64 fields per block (a row's fields
  share a cache line), rows linked by index in address order within their
  segment, and pending rows linked by PNEXT in the order they were freed.

Five files: core_layout.py (where everything lies in the array; making
and growing one), core_blocks.pxi (the compiled internals: counters, rows,
the free index, carving and coalescing), _core.pyx (the compiled entry
points the pool calls: take, release, untake, retire, rebuild, ...; with
core_handles.pxi, the handles, and core_uses.pxi, reclaim's bookkeeping
of uses) and this one, which gives the entry points and the layout's names to everyone
else. Block surgery and every free-index change go
through core_blocks.pxi's gateways ``_index_add``/``_index_remove``, which
also keep the split-block counters. A segment's first row never changes except when
defragmentation rebuilds it: carving keeps the free row for the handed-out
block and puts the rest in a new row; coalescing keeps the lower row.

Not thread safe: the pool calls it under its lock. ImportError, naming
the fix, where the compiled module was not built (a checkout used through
PYTHONPATH without ``pip install -e .``).
"""

try:
    from ._core import (Block, add_segment, begin_uses, chains, close_open,  # noqa: F401
                        cut, drop_free, edges, end_uses, fits, free_pages, held, join, largest,
                        rebuild, registered, release, release_block, release_segment, retire,
                        segments, take, take_block, take_large, take_now, take_row, untake, unowned)
except ImportError as error:        # a checkout not built: no _core extension next to this file
    raise ImportError("numba_alloc's compiled core (numba_alloc/policy/_core.pyx) is not built: "
                      "install the package (pip install -e . in a checkout; it needs Cython "
                      "and a C compiler), or build it in place with "
                      f"python setup.py build_ext --inplace ({error})") from error

from .core_layout import *  # noqa: E402,F403 (the core's layout: numba_alloc.policy.core.TABLE, ...)
