"""NRT, numba-cuda's runtime for memory made inside kernels (``np.empty``
and the like): whether kernels use it, and its counters. NRT draws from
CUDA's device malloc heap (the ``malloc_heap_size`` setting, CUDA's 8 MiB by
default), outside the pool, its limit and its counters.

Asked only about a pool on a GPU, when numba.cuda is in use: numba.cuda is
imported on the first question, not with numba_alloc (which imports none
of it).
"""

NRT_COUNTERS = ("alloc", "free", "mi_alloc", "mi_free")


def in_use():
    """Whether kernels compile with NRT (NUMBA_CUDA_ENABLE_NRT=1), or NRT
    has started in this process."""
    from numba.cuda import config
    from numba.cuda.memory_management.nrt import rtsys
    return bool(getattr(config, "CUDA_ENABLE_NRT", False)) or rtsys._initialized


def counters():
    """``nrt.{alloc,free,mi_alloc,mi_free}``: NRT's counts of its
    allocations and frees (of memory and of meminfos), kept by numba-cuda
    when NUMBA_CUDA_NRT_STATS=1; read from the device, which launches NRT's
    read kernels and waits for the device. {} when the statistics are off or
    NRT has not started. Thread safe as numba-cuda's runtime is."""
    from numba.cuda import config
    from numba.cuda.memory_management.nrt import rtsys
    if not (getattr(config, "CUDA_NRT_STATS", False) and rtsys._initialized):
        return {}
    stats = rtsys.get_allocation_stats()
    return {f"nrt.{name}": int(getattr(stats, name)) for name in NRT_COUNTERS}
