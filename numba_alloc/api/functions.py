"""Functions that name a device: PyTorch's, TensorFlow's and TensorFlow
Large Model Support's, over the plugin's per-device pools: each resolves its device to a pool and
calls the function of the same name in :mod:`numba_alloc.api.compat`.

Every one takes its device the same way
(:func:`~numba_alloc.plugin.registry.resolve_pool`, re-exported here): a GPU number
(an int >= 0), a TensorFlow device name ("GPU:0", "/device:GPU:0", ...), a
:class:`~numba_alloc.Pool` (on any backend, such as a SimulatedDevice), or
None for the current GPU. The argument keeps each library's name and
default: PyTorch's ``device=None``, TensorFlow Large Model Support's
``gpu_id=0``. A GPU is made the current device, so its Numba context may be
created (as torch.cuda's functions initialise CUDA); its memory manager must
be numba_alloc's (RuntimeError otherwise, before any context is made), and without a CUDA driver, or
under the CUDA simulator, a GPU cannot be named at all (RuntimeError pointing
to ``Pool(SimulatedDevice(...))``).
"""

import contextlib

from . import compat
from ..plugin import nrt, registry
from ..policy.config import Settings
from ..policy.defrag import Defragmentation, checked_arguments
from ..policy.pool import Pool
from ..plugin.registry import _gpu_number, _require_gpu_runtime, check_device
from ..plugin.registry import resolve_pool  # noqa: F401  (numba_alloc.api.functions.resolve_pool, as before)
from ..validate import as_flag

__all__ = [
    "install", "device_pool", "settings", "defragment", "nrt_heap_stats",
    # PyTorch's names
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "memory_cached", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "empty_cache", "total_memory",
    # TensorFlow's names
    "get_memory_info", "reset_memory_stats", "set_memory_growth",
    # TensorFlow Large Model Support's getters
    "LMS_GETTERS", "get_num_allocs", "get_bytes_in_use", "get_peak_bytes_in_use",
    "get_largest_alloc_size", "get_bytes_limit", "get_bytes_reserved",
    "get_peak_bytes_reserved", "get_bytes_reservable_limit", "get_bytes_inactive",
    "get_bytes_active", "get_peak_bytes_active", "get_bytes_reclaimed",
    "get_num_single_reclaims", "get_num_full_reclaims", "get_num_defragmentations",
    "get_bytes_defragged",
]


def install() -> None:
    """Make numba_alloc Numba's memory manager for the contexts Numba creates
    from now on. Raises RuntimeError under the CUDA simulator, without a
    usable CUDA driver, or when Numba already has a context with another
    manager (the choice is fixed per context)."""
    _require_gpu_runtime()
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    from ..plugin.emm import NumbaAllocManager
    for device in driver.devices.values():
        ctx = device.primary_context
        if ctx is not None and not isinstance(ctx.memory_manager, NumbaAllocManager):
            raise RuntimeError(
                f"Numba already uses another memory manager on device {device.id}; "
                "call numba_alloc.install() before CUDA is first used")
    cuda.set_memory_manager(NumbaAllocManager)


def device_pool(device=None) -> contextlib.AbstractContextManager[Pool]:
    """Context manager: the pool of ``device`` (a GPU number, a TensorFlow
    name, a Pool, or None for the current GPU), with that GPU's context
    current. Raises TypeError or ValueError naming ``device`` for a bad
    device, RuntimeError where no GPU can be reached or numba_alloc is not
    Numba's memory manager."""
    return resolve_pool(device)


def settings(device=None) -> Settings:
    """The :class:`~numba_alloc.Settings` in force. None: the defaults for
    every device (NUMBA_ALLOC_CONF, then :func:`numba_alloc.configure`); a
    Pool: its own; a GPU number or TensorFlow name: that GPU's (its pool's
    once it has one). Raises TypeError or ValueError for a device that is
    none of these or names no GPU, RuntimeError where no GPU can be reached."""
    checked = check_device(device)
    if checked is None:
        return registry.settings()
    if isinstance(checked, Pool):
        return checked.settings()
    return registry.settings(_gpu_number(checked, "device"))


# -- PyTorch's names (device=None: the current GPU) -------------------------------
def memory_stats(device=None) -> dict[str, int]:
    """The counters, keyed as torch.cuda.memory_stats (see docs/stats.md).
    Frees whose GPU work has completed are retired first. On a GPU with
    numba-cuda's NRT statistics on (NUMBA_CUDA_NRT_STATS=1) and NRT started,
    also ``nrt.*`` (read from the device: plugin.nrt.counters)."""
    with resolve_pool(device) as pool:
        stats = compat.memory_stats(pool)
        if pool.backend.name == "cuda":
            stats.update(nrt.counters())
        return stats


def nrt_heap_stats(device=None, wait=False) -> dict | None:
    """The heap that serves NRT's np.empty inside kernels (the nrt_heap_size
    setting) on ``device``: its counters (memory_stats' ``nrt.*`` names,
    without the prefix), ``classes`` (per size class that served or refused
    a request of the heap serving now: num_allocs, num_frees, num_failed,
    bytes_in_use, live_blocks), ``up_to_date`` (as DeviceHeap.stats: read
    without waiting for kernels still running, unless ``wait``) and
    ``descriptor_address``; None while the pool has no such heap (the
    setting unset, or no kernel using NRT loaded yet). TypeError when
    ``wait`` is not a bool."""
    wait = as_flag(wait, "wait")
    with resolve_pool(device) as pool:
        heap = pool.nrt_heap
    return None if heap is None else heap.stats(wait=wait)


def memory_allocated(device=None) -> int:
    """Bytes in blocks handed out and not freed, on the device (not those
    reclaimed to host memory)."""
    with resolve_pool(device) as pool:
        return compat.memory_allocated(pool)


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated() since the last peak reset."""
    with resolve_pool(device) as pool:
        return compat.max_memory_allocated(pool)


def memory_reserved(device=None) -> int:
    """Bytes of device memory the pool holds (all segments)."""
    with resolve_pool(device) as pool:
        return compat.memory_reserved(pool)


def memory_cached(device=None) -> int:
    """memory_reserved()'s old name, as torch.cuda keeps it."""
    with resolve_pool(device) as pool:
        return compat.memory_cached(pool)


def max_memory_reserved(device=None) -> int:
    """Peak of memory_reserved() since the last peak reset."""
    with resolve_pool(device) as pool:
        return compat.max_memory_reserved(pool)


def reset_peak_memory_stats(device=None) -> None:
    """Set every peak to its current value."""
    with resolve_pool(device) as pool:
        compat.reset_peak_memory_stats(pool)


def reset_accumulated_memory_stats(device=None) -> None:
    """Zero the allocated/freed totals and the event counters."""
    with resolve_pool(device) as pool:
        compat.reset_accumulated_memory_stats(pool)


def empty_cache(device=None) -> None:
    """Return every fully free segment to the device, after waiting for
    pending frees; with growth off the arena is kept."""
    with resolve_pool(device) as pool:
        compat.empty_cache(pool)


def host_memory_stats(device=None) -> dict[str, int | float]:
    """The pinned host memory cache's counters (Numba's pinned and mapped
    arrays under the plugin), keyed as torch.cuda.host_memory_stats()."""
    with resolve_pool(device) as pool:
        return compat.host_memory_stats(pool)


def empty_host_cache(device=None) -> int:
    """Return the pinned host blocks the cache keeps for reuse (blocks in
    use stay); the bytes returned."""
    with resolve_pool(device) as pool:
        return compat.empty_host_cache(pool)


def reset_peak_host_memory_stats(device=None) -> None:
    """Set every peak of host_memory_stats() to its current value."""
    with resolve_pool(device) as pool:
        compat.reset_peak_host_memory_stats(pool)


def reset_accumulated_host_memory_stats(device=None) -> None:
    """Zero host_memory_stats()' allocated/freed totals, counts and timings."""
    with resolve_pool(device) as pool:
        compat.reset_accumulated_host_memory_stats(pool)


def mem_get_info(device=None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device as the driver reports them, as
    torch.cuda.mem_get_info (free does not count the pool's cached blocks;
    get_memory_info and Numba's get_memory_info do). RuntimeError for a
    Pool whose context was closed (cuda.close()): the device's figures are
    gone."""
    with resolve_pool(device) as pool:
        return compat.mem_get_info(pool)


def total_memory(device=None) -> int:
    """The device's total memory in bytes."""
    with resolve_pool(device) as pool:
        return compat.total_memory(pool)


# -- TensorFlow's names -------------------------------------------------------------
def get_memory_info(device) -> dict[str, int]:
    """{'current': bytes in use, 'peak': their peak}, as
    tf.config.experimental.get_memory_info. A TensorFlow name that is
    malformed, matches no GPU or several, or names a device whose memory is
    not tracked ("CPU:0") is a ValueError."""
    with resolve_pool(device) as pool:
        return compat.get_memory_info(pool)


def reset_memory_stats(device) -> None:
    """As tf.config.experimental.reset_memory_stats (TensorFlow's
    BFCAllocator::ClearStats): get_num_allocs and get_largest_alloc_size
    restart from 0, the peak of bytes in use (get_memory_info's,
    get_peak_bytes_in_use, max_memory_allocated) is set to its current
    value; every other peak (get_peak_bytes_reserved's among them) and
    memory_stats()' other keys stay. Raises as get_memory_info."""
    with resolve_pool(device) as pool:
        compat.reset_memory_stats(pool)


def set_memory_growth(device, enable) -> None:
    """growth on (segments on demand) or off (the pool reserves its limit, or
    all free device memory, at first use) for one device: a GPU number, a
    TensorFlow name such as "GPU:0" or an object with such a ``name``
    (TensorFlow's PhysicalDevice), or a Pool. Raises TypeError when
    ``enable`` is not a bool (a NumPy bool is), ValueError for an invalid
    device, and RuntimeError once the device's pool has reserved memory."""
    enable = as_flag(enable, "enable")
    if not isinstance(device, (str, Pool)) and isinstance(getattr(device, "name", None), str):
        device = device.name
    try:
        if device is None:
            raise ValueError("device must name a device, got None")
        checked = check_device(device)
        gpu_id = None if isinstance(checked, Pool) else _gpu_number(checked, "device")
    except ValueError as e:
        raise ValueError(f"Invalid PhysicalDevice specified: {e}") from None
    pool = checked if gpu_id is None else registry.pool_of(gpu_id)
    if pool is not None and pool.initialized:
        whose = "the pool" if gpu_id is None else f"GPU:{gpu_id}'s pool"
        raise RuntimeError(
            f"Physical devices cannot be modified after being initialized: {whose} has "
            "reserved memory (set memory growth before CUDA is first used)")
    if gpu_id is None:
        pool.configure(growth=enable)
    else:
        registry.set_device_settings(gpu_id, growth=enable)


# -- TensorFlow Large Model Support's getters (gpu_id=0) ----------------------------
LMS_GETTERS = (
    "get_num_allocs", "get_bytes_in_use", "get_peak_bytes_in_use",
    "get_largest_alloc_size", "get_bytes_limit", "get_bytes_reserved",
    "get_peak_bytes_reserved", "get_bytes_reservable_limit", "get_bytes_inactive",
    "get_bytes_active", "get_peak_bytes_active", "get_bytes_reclaimed",
    "get_num_single_reclaims", "get_num_full_reclaims", "get_num_defragmentations",
    "get_bytes_defragged",
)


def get_num_allocs(gpu_id=0) -> int:
    """Allocation requests served, reclaimed blocks brought back included,
    since the last reset_memory_stats or reset of accumulated stats."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_num_allocs(pool)


def get_bytes_in_use(gpu_id=0) -> int:
    """Bytes in blocks handed out and not freed, on the device (as
    memory_allocated)."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_in_use(pool)


def get_peak_bytes_in_use(gpu_id=0) -> int:
    """Peak of get_bytes_in_use()."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_peak_bytes_in_use(pool)


def get_largest_alloc_size(gpu_id=0) -> int:
    """Largest block handed out since the last reset_memory_stats, in bytes
    after rounding to 512."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_largest_alloc_size(pool)


def get_bytes_limit(gpu_id=0) -> int:
    """Most bytes the pool may reserve: its limit, or the device's total,
    whichever is smaller."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_limit(pool)


def get_bytes_reserved(gpu_id=0) -> int:
    """Bytes of device memory the pool holds (as memory_reserved)."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_reserved(pool)


def get_peak_bytes_reserved(gpu_id=0) -> int:
    """Peak of get_bytes_reserved()."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_peak_bytes_reserved(pool)


def get_bytes_reservable_limit(gpu_id=0) -> int:
    """Most bytes the pool could hold now: its limit, or what it reserves
    plus the device's free memory, whichever is smaller; with growth off,
    once its arena is reserved, that arena (it never reserves more)."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_reservable_limit(pool)


def get_bytes_inactive(gpu_id=0) -> int:
    """Large Model Support's inactive bytes: of the resident live blocks
    not in use, which reclaim may take unless they are pinned."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_inactive(pool)


def get_bytes_active(gpu_id=0) -> int:
    """Large Model Support's active bytes: of the blocks in use (inside
    Pool.use; under the Numba plugin, the arrays of a kernel launch or copy
    while it is being issued), which reclaim never takes. (PyTorch's
    active_bytes, live blocks plus frees whose GPU work may still run, is
    ``memory_stats()["active_bytes.all.current"]``.)"""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_active(pool)


def get_peak_bytes_active(gpu_id=0) -> int:
    """Peak of get_bytes_active()."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_peak_bytes_active(pool)


def get_bytes_reclaimed(gpu_id=0) -> int:
    """Bytes of live blocks moved to host memory by reclaim (since the last
    reset_accumulated_memory_stats)."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_reclaimed(pool)


def get_num_single_reclaims(gpu_id=0) -> int:
    """Requests met by reclaiming one inactive block to host memory."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_num_single_reclaims(pool)


def get_num_full_reclaims(gpu_id=0) -> int:
    """Times every inactive block was reclaimed to host memory to meet a
    request."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_num_full_reclaims(pool)


def get_num_defragmentations(gpu_id=0) -> int:
    """Times live blocks were moved to open a hole or compact the pool,
    as the copy kernels counted them in device memory (a defragmentation
    whose copies failed is not counted)."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_num_defragmentations(pool)


def get_bytes_defragged(gpu_id=0) -> int:
    """Bytes of live blocks moved by defragmentation, as the copy kernels
    counted them in device memory (only phases that completed)."""
    with resolve_pool(gpu_id, "gpu_id") as pool:
        return compat.get_bytes_defragged(pool)


def defragment(device=None, nbytes=None, release=True) -> Defragmentation:
    """Move live blocks of a device's pool together (see Pool.defragment):
    open a hole of ``nbytes``, or compact everything and return emptied
    segments to the device (``release=False``: keep them cached). The
    arguments are checked first (TypeError or ValueError, nothing done);
    then, on a GPU, the copy kernel is loaded, outside the pool's lock
    (DefragmentationRefused names why if it cannot be). Returns
    numba_alloc.policy.defrag.Defragmentation."""
    nbytes, release = checked_arguments(nbytes, release)
    with resolve_pool(device) as pool:
        load = getattr(pool.backend, "load_copy_kernel", None)
        if load is not None:
            load()
        return pool.defragment(nbytes, release)
