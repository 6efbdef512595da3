"""numba_alloc: a pooling GPU memory allocator for Numba CUDA.

Switch a Numba program over with ``NUMBA_CUDA_MEMORY_MANAGER=numba_alloc``
(or :func:`install` before CUDA is first used). Without a GPU, drive the
same policy with ``Pool(SimulatedDevice(capacity))``.
"""

from . import numpy_compat  # noqa: F401  (kernels compile under NumPy 2.5)
from .api import (
    LMS_GETTERS,
    defragment,
    device_pool,
    empty_cache,
    get_memory_info,
    install,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_memory_stats,
    reset_peak_memory_stats,
    set_memory_growth,
    total_memory,
)
from .api import __dict__ as _api
from .backend import Backend, DeviceOutOfMemory
from .block import Block, Segment
from .config import Settings
from .errors import DefragmentationError, DefragmentationRefused, OutOfMemoryError
from .history import record_history, recorded_events
from .memory_viz import dump_snapshot, snapshot
from .nvml import device_info
from .pinning import pin
from .plots import plot_segments, plot_timeline
from .pool import Pool
from .registry import configure
from .registry import settings
from .replay import replay_trace
from .simulated import SimulatedDevice
from .summary import memory_summary
from .trace import BUNDLED_TRACE, dump_trace, read_rmm_log, write_rmm_log
from .tracking import track

globals().update({name: _api[name] for name in LMS_GETTERS})
del _api

__version__ = "0.1.0"


def __getattr__(name):
    # Numba reads this when NUMBA_CUDA_MEMORY_MANAGER=numba_alloc; imported
    # lazily so that numba_alloc imports under the CUDA simulator too.
    if name == "_numba_memory_manager":
        from .emm import NumbaAllocManager
        return NumbaAllocManager
    raise AttributeError(f"module 'numba_alloc' has no attribute {name!r}")
