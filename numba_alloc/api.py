"""Functions that name a device: PyTorch's, TensorFlow's and TensorFlow
Large Model Support's, over the plugin's per-device pools.

Each makes the device's Numba context current, so it may create that
context (as torch.cuda's functions initialise CUDA). They need Numba's
memory manager to be numba_alloc's and raise RuntimeError otherwise.
"""

import contextlib

from . import registry
from .devices import match_gpu, parse_device_name
from .pool import Pool

_INSTALL_HINT = ("set NUMBA_CUDA_MEMORY_MANAGER=numba_alloc, or call "
                 "numba_alloc.install() before CUDA is first used")


def _require_gpu_runtime():
    from numba.cuda import config
    if config.ENABLE_CUDASIM:
        raise RuntimeError(
            "the CUDA simulator has no memory manager plugins; without a GPU use "
            "numba_alloc.Pool(numba_alloc.SimulatedDevice(capacity))")


def install():
    """Make numba_alloc Numba's memory manager for the contexts Numba creates
    from now on. Raises RuntimeError under the CUDA simulator, or when Numba
    already has a context with another manager (the choice is fixed per
    context)."""
    _require_gpu_runtime()
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    from .emm import NumbaAllocManager
    for device in driver.devices.values():
        ctx = device.primary_context
        if ctx is not None and not isinstance(ctx.memory_manager, NumbaAllocManager):
            raise RuntimeError(
                f"Numba already uses another memory manager on device {device.id}; "
                "call numba_alloc.install() before CUDA is first used")
    cuda.set_memory_manager(NumbaAllocManager)


def _gpu_count():
    from numba import cuda
    return len(cuda.gpus)


def _check_gpu_id(gpu_id):
    if isinstance(gpu_id, bool) or not isinstance(gpu_id, int) or gpu_id < 0:
        raise ValueError(f"gpu_id must be a device number (an int >= 0), got {gpu_id!r}")
    count = _gpu_count()
    if gpu_id >= count:
        raise ValueError(f"gpu_id {gpu_id} names no device: there are {count} "
                         f"(0 to {count - 1})")
    return gpu_id


def _select_gpu(name):
    """The GPU number a TensorFlow device name selects: the name is checked
    before the driver is asked how many GPUs there are, so a bad name is a
    ValueError even where there is no driver."""
    index = parse_device_name(name)
    return match_gpu(name, index, _gpu_count())


def _current_device():
    from numba import cuda
    return cuda.get_current_device().id


@contextlib.contextmanager
def device_pool(gpu_id=None):
    """Context manager: the pool of device ``gpu_id`` (None: the current
    device), with that device's context current."""
    _require_gpu_runtime()
    from numba import cuda

    from .emm import NumbaAllocManager
    gpu_id = _current_device() if gpu_id is None else _check_gpu_id(gpu_id)
    with cuda.gpus[gpu_id]:
        manager = cuda.current_context().memory_manager
        if not isinstance(manager, NumbaAllocManager):
            raise RuntimeError(f"numba_alloc is not Numba's memory manager: {_INSTALL_HINT}")
        manager.initialize()
        yield manager.pool


@contextlib.contextmanager
def resolve_pool(device=None):
    """Context manager: the pool ``device`` names. A :class:`Pool` (on any
    backend, such as a SimulatedDevice) is itself; a GPU number or None (the
    current GPU) goes through :func:`device_pool`. Raises TypeError for
    anything else."""
    if isinstance(device, Pool):
        yield device
    elif device is None or (isinstance(device, int) and not isinstance(device, bool)):
        with device_pool(device) as pool:
            yield pool
    else:
        raise TypeError("device must be a numba_alloc.Pool, a GPU number or None "
                        f"(the current GPU), got {device!r}")


def _on_device(method_name, gpu_arg):
    """A module function calling Pool.<method_name> on a device's pool."""
    method = getattr(Pool, method_name)

    if gpu_arg == "gpu_id":
        def function(gpu_id=0):
            with device_pool(gpu_id) as pool:
                return method(pool)
    else:
        def function(device=None):
            with device_pool(device) as pool:
                return method(pool)
    function.__name__ = function.__qualname__ = method_name
    function.__doc__ = method.__doc__
    return function


# PyTorch's names (device=None: the current device)
memory_stats = _on_device("memory_stats", "device")
memory_allocated = _on_device("memory_allocated", "device")
max_memory_allocated = _on_device("max_memory_allocated", "device")
memory_reserved = _on_device("memory_reserved", "device")
memory_cached = _on_device("memory_cached", "device")
max_memory_reserved = _on_device("max_memory_reserved", "device")
reset_peak_memory_stats = _on_device("reset_peak_memory_stats", "device")
reset_accumulated_memory_stats = _on_device("reset_accumulated_memory_stats", "device")
empty_cache = _on_device("empty_cache", "device")
total_memory = _on_device("total_memory", "device")

# TensorFlow Large Model Support's getters (gpu_id: the device number)
LMS_GETTERS = (
    "get_num_allocs", "get_bytes_in_use", "get_peak_bytes_in_use",
    "get_largest_alloc_size", "get_bytes_limit", "get_bytes_reserved",
    "get_peak_bytes_reserved", "get_bytes_reservable_limit", "get_bytes_inactive",
    "get_bytes_active", "get_peak_bytes_active", "get_bytes_reclaimed",
    "get_num_single_reclaims", "get_num_full_reclaims", "get_num_defragmentations",
    "get_bytes_defragged",
)
globals().update({name: _on_device(name, "gpu_id") for name in LMS_GETTERS})


# TensorFlow's names (a device string such as "GPU:0")
def get_memory_info(device):
    """{'current': bytes in use, 'peak': their peak} for a device named as
    TensorFlow names it ("GPU:0", "/device:GPU:0", ...). Raises ValueError for
    a malformed name, no such device, several matches, or a device whose
    memory is not tracked ("CPU:0")."""
    with device_pool(_select_gpu(device)) as pool:
        return pool.get_memory_info()


def reset_memory_stats(device):
    """Reset the peak of get_memory_info(device); raises as get_memory_info."""
    with device_pool(_select_gpu(device)) as pool:
        pool.reset_memory_stats()


def set_memory_growth(device, enable):
    """growth on (segments on demand) or off (the pool reserves its limit, or
    all free device memory, at first use) for one device: a name such as
    "GPU:0", a device number, or an object with a ``name`` (TensorFlow's
    PhysicalDevice). Raises ValueError for an invalid device and RuntimeError
    once the device's pool is initialized."""
    if not isinstance(enable, bool):
        raise ValueError(f"enable must be True or False, got {enable!r}")
    if isinstance(device, int) and not isinstance(device, bool):
        gpu_id = _check_gpu_id(device)
    else:
        try:
            gpu_id = _select_gpu(getattr(device, "name", device))
        except ValueError as e:
            raise ValueError(f"Invalid PhysicalDevice specified: {e}") from None
    pool = registry.pool_of(gpu_id)
    if pool is not None and pool.initialized:
        raise RuntimeError(
            f"Physical devices cannot be modified after being initialized: GPU:{gpu_id}'s "
            "pool has reserved memory (set memory growth before CUDA is first used)")
    registry.set_device_settings(gpu_id, growth=enable)


def defragment(device=None, nbytes=None):
    """Move live blocks of a device's pool together (see Pool.defragment):
    open a hole of ``nbytes``, or compact everything and return emptied
    segments to the device. ``device``: a GPU number, None (the current GPU)
    or a Pool. On a GPU the copy kernel is loaded first, outside the pool's
    lock (DefragmentationRefused names why if it cannot be). Returns
    numba_alloc.pool.Defragmentation."""
    with resolve_pool(device) as pool:
        load = getattr(pool.backend, "load_copy_kernel", None)
        if load is not None:
            load()
        return pool.defragment(nbytes)
