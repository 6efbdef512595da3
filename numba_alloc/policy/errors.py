"""The errors of the policy, and how it makes the one a request that
cannot be met raises.

That one, numba_alloc.OutOfMemoryError, is Numba's CudaAPIError with code
CUDA_ERROR_OUT_OF_MEMORY (so Numba's own retry and users' handlers keep
working) and a MemoryError. Defining it imports numba.cuda, so it lives in
the layer above (numba_alloc.observe.out_of_memory), which the package
registers here (:func:`register_out_of_memory_error`); the pool hands
:func:`out_of_memory_error` an :class:`OutOfMemoryReport`, read without
changing the pool.
"""

from typing import NamedTuple

_make_out_of_memory_error = None


def register_out_of_memory_error(make):
    """Make the errors of failed requests with ``make(report)`` (the
    package does, at import). Raises TypeError when ``make`` is not
    callable, changing nothing."""
    global _make_out_of_memory_error
    if not callable(make):
        raise TypeError(f"make must be a callable taking an OutOfMemoryReport, got {make!r}")
    _make_out_of_memory_error = make


def out_of_memory_error(report):
    """The error for an :class:`OutOfMemoryReport`."""
    return _make_out_of_memory_error(report)


class OutOfMemoryReport(NamedTuple):
    """What the pool held when a request failed: the figures an
    OutOfMemoryError's message is made of, read under the pool's lock
    without changing the pool (no pending free retired, no finalizer's free
    taken, nothing counted). Sizes are ints in bytes."""
    nbytes: int             # bytes asked for
    size: int               # after rounding up to 512
    device_name: str        # the backend's name: "cuda", "simulated"
    device_id: int
    device_total: int
    device_free: int
    allocated: int          # in blocks handed out and not freed
    cached: int             # reserved but unallocated: reserved - active
    largest_free: int       # the pool's largest free block
    limit: int              # the most the pool may reserve (at most device_total)
    growth: bool            # the growth setting
    initialized: bool       # False: growth off and the arena found no room yet
    defrag: bool            # the defrag setting
    small: bool             # a small-pool request (<= 1 MiB): max_split_size never applies
    refusal: str | None     # why the last defragmentation was refused, if it was
    segments: list          # the segments, as in Pool.snapshot()
    stats: dict             # the counters, as memory_stats(), before this failure is counted
    reclaim: bool = False   # the reclaim setting
    inactive: int = 0       # bytes of resident live blocks not in use
    reclaimable: int = 0    # of those, not pinned: what reclaim may take
    host_limit: int | None = None   # the host_limit setting
    reclaim_available: bool = False  # reclaim could be turned on here
    malloc_heap: int | None = None  # bytes of the device's malloc heap (None: it has none)
    nrt_heap_size: int | None = None    # the nrt_heap_size setting (None: NRT is not the pool's)
    expandable: bool = False            # the large pool's segments are runs of pages
    pages_available: bool = False       # expandable_segments could be turned on here


class DefragmentationError(RuntimeError):
    """A copy kernel failed during defragmentation. The blocks of the failed
    phase keep their old addresses and data; the pool stays consistent."""


class DefragmentationRefused(RuntimeError):
    """Moving blocks is not safe here (the reason says why); nothing moved."""


class ReclaimError(RuntimeError):
    """Reclaiming a block to host memory (the reclaim setting) failed: a
    host allocation or a copy the backend refused. That block is resident
    and intact; blocks reclaimed before it stay reclaimed, intact."""
