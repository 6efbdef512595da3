"""numba_alloc: a pooling GPU memory allocator for Numba CUDA.

Switch a Numba program over with ``NUMBA_CUDA_MEMORY_MANAGER=numba_alloc``
(or :func:`install` before CUDA is first used). Without a GPU, drive the
same policy with ``Pool(SimulatedDevice(capacity))``.

Importing the package imports neither numba.cuda nor the Numba glue, and
compiles nothing: :class:`OutOfMemoryError` and :class:`DeviceHeap` (whose
modules import numba.cuda) and ``_numba_memory_manager`` are imported on
first use of the name.
"""

from typing import TYPE_CHECKING

from . import numpy_compat  # noqa: F401  (kernels compile under NumPy 2.5)
from .api.functions import (
    LMS_GETTERS,
    defragment,
    device_pool,
    empty_cache,
    get_bytes_active,
    get_bytes_defragged,
    get_bytes_in_use,
    get_bytes_inactive,
    get_bytes_limit,
    get_bytes_reclaimed,
    get_bytes_reservable_limit,
    get_bytes_reserved,
    get_largest_alloc_size,
    get_memory_info,
    get_num_allocs,
    get_num_defragmentations,
    get_num_full_reclaims,
    get_num_single_reclaims,
    get_peak_bytes_active,
    get_peak_bytes_in_use,
    get_peak_bytes_reserved,
    empty_host_cache,
    host_memory_stats,
    install,
    mem_get_info,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_stats,
    nrt_heap_stats,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_memory_stats,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_memory_growth,
    settings,
    total_memory,
)
from .policy.backend import Backend, DeviceOutOfMemory
from .policy.block import Block, Segment
from .policy.owned_block import OwnedBlock
from .policy.host_cache import HostOutOfMemoryError
from .policy.config import Settings
from .policy.errors import (DefragmentationError, DefragmentationRefused, ReclaimError,
                            register_out_of_memory_error)
from .observe.history import record_history, recorded_events
from .observe.memory_viz import dump_snapshot, snapshot
from .observe.nvml import device_info
from .plugin.pinning import pin
from .observe.plots import plot_segments, plot_timeline
from .policy.pool import Pool
from .plugin.registry import configure
from .version import __version__  # noqa: F401
from .cli.replay import replay_trace
from .backends.simulated import SimulatedDevice
from .observe.display import memory_summary
from .observe import event_log  # noqa: F401  (every pool's rare events to logging)
from .observe.ledger import memory_ledger
from .observe.trace import BUNDLED_TRACE, dump_trace, read_rmm_log, write_rmm_log
from .observe.tracking import track

__all__ = [
    # functions that name a device (numba_alloc.api.functions)
    "LMS_GETTERS", "defragment", "device_pool", "empty_cache", "get_bytes_active",
    "get_bytes_defragged", "get_bytes_in_use", "get_bytes_inactive", "get_bytes_limit",
    "get_bytes_reclaimed", "get_bytes_reservable_limit", "get_bytes_reserved",
    "get_largest_alloc_size", "get_memory_info", "get_num_allocs",
    "get_num_defragmentations", "get_num_full_reclaims", "get_num_single_reclaims",
    "get_peak_bytes_active", "get_peak_bytes_in_use", "get_peak_bytes_reserved", "install",
    "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_cached",
    "memory_reserved", "memory_stats", "reset_accumulated_memory_stats",
    "reset_memory_stats", "reset_peak_memory_stats", "set_memory_growth", "settings",
    "total_memory", "host_memory_stats", "empty_host_cache", "reset_peak_host_memory_stats",
    "reset_accumulated_host_memory_stats", "mem_get_info", "nrt_heap_stats",
    # the pool and its backends
    "Pool", "Settings", "Backend", "DeviceOutOfMemory", "Block", "OwnedBlock", "Segment",
    "SimulatedDevice",
    "OutOfMemoryError", "DefragmentationError", "DefragmentationRefused", "ReclaimError",
    "HostOutOfMemoryError",
    "configure", "pin", "DeviceHeap",
    # seeing inside the pool
    "record_history", "recorded_events", "snapshot", "dump_snapshot", "memory_summary",
    "memory_ledger",
    "plot_segments", "plot_timeline", "track", "device_info",
    # traces
    "BUNDLED_TRACE", "dump_trace", "read_rmm_log", "write_rmm_log", "replay_trace",
]

if TYPE_CHECKING:
    from .plugin.device_heap import DeviceHeap
    from .observe.out_of_memory import OutOfMemoryError
del TYPE_CHECKING       # (for type checkers only: not a name of the package)


def _out_of_memory_error(report):
    # imports numba.cuda: at the first failed request, not at import
    from .observe.out_of_memory import OutOfMemoryError
    return OutOfMemoryError.from_report(report)


register_out_of_memory_error(_out_of_memory_error)


def __getattr__(name):
    # Numba reads _numba_memory_manager when NUMBA_CUDA_MEMORY_MANAGER=numba_alloc
    # (also imported lazily so that numba_alloc imports under the CUDA simulator)
    if name == "_numba_memory_manager":
        from .plugin.emm import NumbaAllocManager
        return NumbaAllocManager
    if name == "OutOfMemoryError":
        from .observe.out_of_memory import OutOfMemoryError
        return OutOfMemoryError
    if name == "DeviceHeap":
        from .plugin.device_heap import DeviceHeap
        return DeviceHeap
    raise AttributeError(f"module 'numba_alloc' has no attribute {name!r}")


def __dir__():
    # the names imported on first use too
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython):
    """``%load_ext numba_alloc``: after every cell, what it did to each pool
    (numba_alloc.observe.ipython_extension)."""
    from .observe.ipython_extension import load
    load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext numba_alloc``."""
    from .observe.ipython_extension import unload
    unload(ipython)
