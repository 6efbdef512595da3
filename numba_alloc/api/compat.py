"""PyTorch's, TensorFlow's and TensorFlow Large Model Support's names for a
pool's counters, as functions of the pool: ``memory_allocated(pool)``,
``get_memory_info(pool)``, ``get_bytes_in_use(pool)``, ...

They are names only: each is built on the few reading primitives of
:class:`~numba_alloc.Pool` (:meth:`~numba_alloc.Pool.current`,
:meth:`~numba_alloc.Pool.peak`, :meth:`~numba_alloc.Pool.accumulated`,
:meth:`~numba_alloc.Pool.count`, :meth:`~numba_alloc.Pool.reset_peaks`,
:meth:`~numba_alloc.Pool.reset_accumulated`,
:meth:`~numba_alloc.Pool.clear_stats`, :meth:`~numba_alloc.Pool.since_clear`,
:meth:`~numba_alloc.Pool.limit_bytes`, ``memory_stats()``,
``empty_cache()``) and the backend's ``memory_info()``. Sizes are in bytes.
Thread safe: every primitive takes the pool's lock, and a function that
reads several holds it across them, so they are of one instant.

The functions of :mod:`numba_alloc.api.functions` (``numba_alloc.memory_allocated(device)``
and the others) take a device instead (a GPU number, a TensorFlow name, a
Pool, or None), resolve it to its pool and call these.
"""

__all__ = [
    # PyTorch's names (torch.cuda.*)
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "memory_cached", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "empty_cache", "total_memory",
    # TensorFlow's names (tf.config.experimental.*)
    "get_memory_info", "reset_memory_stats",
    # TensorFlow Large Model Support's getters
    "get_num_allocs", "get_bytes_in_use", "get_peak_bytes_in_use", "get_largest_alloc_size",
    "get_bytes_limit", "get_bytes_reserved", "get_peak_bytes_reserved",
    "get_bytes_reservable_limit", "get_bytes_inactive", "get_bytes_active",
    "get_peak_bytes_active", "get_bytes_reclaimed", "get_num_single_reclaims",
    "get_num_full_reclaims", "get_num_defragmentations", "get_bytes_defragged",
]


# -- PyTorch's names (torch.cuda.*) ----------------------------------------------
def memory_stats(pool):
    """The counters, keyed as torch.cuda.memory_stats (see docs/stats.md).
    Frees whose GPU work has completed are retired first."""
    return pool.memory_stats()


def memory_allocated(pool):
    """Bytes in blocks handed out and not freed, on the device (not those
    reclaimed to host memory)."""
    return pool.current("allocated_bytes")


def max_memory_allocated(pool):
    """Peak of memory_allocated() since the last peak reset."""
    return pool.peak("allocated_bytes")


def memory_reserved(pool):
    """Bytes of device memory the pool holds (all segments)."""
    return pool.current("reserved_bytes")


def memory_cached(pool):
    """memory_reserved()'s old name, as torch.cuda keeps it."""
    return pool.current("reserved_bytes")


def max_memory_reserved(pool):
    """Peak of memory_reserved() since the last peak reset."""
    return pool.peak("reserved_bytes")


def reset_peak_memory_stats(pool):
    """Set every peak to its current value."""
    pool.reset_peaks()


def reset_accumulated_memory_stats(pool):
    """Zero the allocated/freed totals and the event counters."""
    pool.reset_accumulated()


def empty_cache(pool):
    """Return every fully free segment to the device, after waiting for
    pending frees; with growth off the arena is kept."""
    pool.empty_cache()


def host_memory_stats(pool):
    """The pinned host cache's counters, keyed as torch.cuda.host_memory_stats()."""
    return pool.host_cache.stats()


def empty_host_cache(pool):
    """Return the pinned host blocks the cache keeps for reuse; the bytes returned."""
    return pool.host_cache.empty()


def reset_peak_host_memory_stats(pool):
    """Set every peak of host_memory_stats() to its current value."""
    pool.host_cache.reset_peaks()


def reset_accumulated_host_memory_stats(pool):
    """Zero host_memory_stats()' allocated/freed totals, counts and timings."""
    pool.host_cache.reset_accumulated()


def mem_get_info(pool):
    """``(free, total)`` bytes of the device, as the driver reports them
    (torch.cuda.mem_get_info): free counts neither the pool's cached blocks
    nor its limit."""
    return pool.backend.memory_info()


def total_memory(pool):
    """The device's total memory in bytes."""
    return pool.backend.memory_info()[1]


# -- TensorFlow's names (tf.config.experimental.*) ---------------------------------
def get_memory_info(pool):
    """{'current': bytes in use, 'peak': their peak}, as
    tf.config.experimental.get_memory_info."""
    with pool.lock:
        return {"current": pool.current("allocated_bytes"),
                "peak": pool.peak("allocated_bytes")}


def reset_memory_stats(pool):
    """As tf.config.experimental.reset_memory_stats (TensorFlow's
    BFCAllocator::ClearStats): get_num_allocs and get_largest_alloc_size
    restart from 0, the peak of bytes in use (get_memory_info's,
    get_peak_bytes_in_use, max_memory_allocated) is set to its current
    value; every other peak (get_peak_bytes_reserved's among them) and
    memory_stats()' other keys stay."""
    pool.clear_stats()


# -- TensorFlow Large Model Support's getters ---------------------------------------
def get_num_allocs(pool):
    """Allocation requests served, reclaimed blocks brought back included,
    since the last reset_memory_stats or reset of accumulated stats."""
    return pool.since_clear()[0]


def get_bytes_in_use(pool):
    """Bytes in blocks handed out and not freed, on the device (as
    memory_allocated)."""
    return pool.current("allocated_bytes")


def get_peak_bytes_in_use(pool):
    """Peak of get_bytes_in_use()."""
    return pool.peak("allocated_bytes")


def get_largest_alloc_size(pool):
    """Largest block handed out since the last reset_memory_stats, in bytes
    after rounding to 512."""
    return pool.since_clear()[1]


def get_bytes_limit(pool):
    """Most bytes the pool may reserve: its limit, or the device's total,
    whichever is smaller."""
    return pool.limit_bytes()


def get_bytes_reserved(pool):
    """Bytes of device memory the pool holds (as memory_reserved)."""
    return pool.current("reserved_bytes")


def get_peak_bytes_reserved(pool):
    """Peak of get_bytes_reserved()."""
    return pool.peak("reserved_bytes")


def get_bytes_reservable_limit(pool):
    """Most bytes the pool could hold now: its limit, or what it reserves
    plus the device's free memory, whichever is smaller; with growth off,
    once its arena is reserved, that arena (it never reserves more)."""
    with pool.lock:
        reserved = pool.current("reserved_bytes")
        if pool.initialized and not pool.settings().growth:
            return reserved
        device_free = pool.backend.memory_info()[0]
        return min(pool.limit_bytes(), reserved + device_free)


def get_bytes_active(pool):
    """Large Model Support's active bytes: of the blocks in use (inside
    Pool.use; under the Numba plugin, the arrays of a kernel launch or copy
    while it is being issued), which reclaim never takes. (PyTorch's active_bytes, live
    blocks plus frees whose GPU work may still run, is
    ``memory_stats()["active_bytes.all.current"]``.)"""
    return pool.current("lms_active_bytes")


def get_peak_bytes_active(pool):
    """Peak of get_bytes_active()."""
    return pool.peak("lms_active_bytes")


def get_bytes_inactive(pool):
    """Large Model Support's inactive bytes: of the resident live blocks
    not in use, which reclaim may take unless they are pinned."""
    return pool.inactive_bytes()


def get_bytes_reclaimed(pool):
    """Bytes of live blocks moved to host memory by reclaim (since the last
    reset_accumulated_memory_stats)."""
    return pool.accumulated("reclaimed_bytes")[0]


def get_num_single_reclaims(pool):
    """Requests met by reclaiming one inactive block to host memory."""
    return pool.count("num_single_reclaims")


def get_num_full_reclaims(pool):
    """Times every inactive block was reclaimed to host memory to meet a
    request."""
    return pool.count("num_full_reclaims")


def get_num_defragmentations(pool):
    """Times live blocks were moved to open a hole or compact the pool,
    as the copy kernels counted them in device memory (a defragmentation
    whose copies failed is not counted)."""
    return pool.count("num_defragmentations")


def get_bytes_defragged(pool):
    """Bytes of live blocks moved by defragmentation, as the copy
    kernels counted them in device memory (only phases that completed)."""
    return pool.count("bytes_defragged")
