"""The driver's view of a GPU through NVML (the pynvml module of
nvidia-ml-py), beside the pool's own figures.

:func:`device_info` returns nvidia-smi's ``--query-gpu`` fields for one GPU
with the pool's reserved and allocated bytes, so that what the driver sees
used (all processes, all allocators, the CUDA context itself) and what the
pool holds sit side by side.
"""

import datetime
import os

from . import registry
from .pool import Pool

NVIDIA_SMI_FIELDS = ("timestamp", "name", "pci.bus_id", "driver_version", "pstate",
                     "pcie.link.gen.max", "pcie.link.gen.current", "temperature.gpu",
                     "utilization.gpu", "utilization.memory", "memory.total",
                     "memory.free", "memory.used")
POOL_FIELDS = ("pool.reserved_bytes", "pool.allocated_bytes")
_PSTATE_UNKNOWN = 32


def _import_pynvml():
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("pynvml is not installed: pip install nvidia-ml-py") from None
    return pynvml


def _init(pynvml):
    """nvmlInit, with errors that say what is missing."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise RuntimeError(
            "NVML (libnvidia-ml, the NVIDIA driver's management library) is missing: "
            "no NVIDIA driver is installed on this machine") from None
    except pynvml.NVMLError_DriverNotLoaded:
        raise RuntimeError("NVML is installed but the NVIDIA driver is not loaded: "
                           "no GPU is usable on this machine") from None


def _nvml_handle(pynvml, gpu_id):
    """The NVML handle of CUDA device ``gpu_id``, mapped through
    CUDA_VISIBLE_DEVICES (indices or UUIDs) as CUDA maps it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        count = pynvml.nvmlDeviceGetCount()
        if gpu_id >= count:
            raise ValueError(f"gpu_id {gpu_id} names no GPU: NVML sees {count}")
        return pynvml.nvmlDeviceGetHandleByIndex(gpu_id)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if gpu_id >= len(entries):
        raise ValueError(f"gpu_id {gpu_id} names no GPU: CUDA_VISIBLE_DEVICES={visible!r} "
                         f"makes {len(entries)} visible")
    entry = entries[gpu_id]
    try:
        if entry.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    except pynvml.NVMLError as e:
        raise ValueError(f"gpu_id {gpu_id} names no GPU: CUDA_VISIBLE_DEVICES entry "
                         f"{entry!r} is unknown to NVML ({e})") from None


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _query(pynvml, function, *args):
    """``function(*args)``, or None where the GPU does not support it
    (nvidia-smi prints [N/A] there)."""
    try:
        return function(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission):
        return None


def _nvml_fields(pynvml, handle):
    def q(function, *args):
        return _query(pynvml, function, handle, *args)

    pci = q(pynvml.nvmlDeviceGetPciInfo)
    pstate = q(pynvml.nvmlDeviceGetPerformanceState)
    rates = q(pynvml.nvmlDeviceGetUtilizationRates)
    memory = q(pynvml.nvmlDeviceGetMemoryInfo)
    return {
        "timestamp": datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3],
        "name": _text(q(pynvml.nvmlDeviceGetName)),
        "pci.bus_id": None if pci is None else _text(pci.busId),
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "pstate": None if pstate in (None, _PSTATE_UNKNOWN) else f"P{pstate}",
        "pcie.link.gen.max": q(pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
        "pcie.link.gen.current": q(pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
        "temperature.gpu": q(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        "utilization.gpu": None if rates is None else rates.gpu,
        "utilization.memory": None if rates is None else rates.memory,
        "memory.total": None if memory is None else memory.total,
        "memory.free": None if memory is None else memory.free,
        "memory.used": None if memory is None else memory.used,
    }


def _check(gpu_id):
    if isinstance(gpu_id, Pool) or gpu_id is None:
        return
    if isinstance(gpu_id, bool) or not isinstance(gpu_id, int):
        raise TypeError("gpu_id must be a GPU number, None (the current GPU) or a "
                        f"numba_alloc.Pool, got {gpu_id!r}")
    if gpu_id < 0:
        raise ValueError(f"gpu_id must be >= 0, got {gpu_id}")


def _resolve(gpu_id):
    """(CUDA device number, its pool or None) for a checked gpu_id."""
    if isinstance(gpu_id, Pool):
        return gpu_id.backend.device_id, gpu_id
    if gpu_id is None:
        from numba import cuda
        gpu_id = cuda.get_current_device().id
    return gpu_id, registry.pool_of(gpu_id)


def device_info(gpu_id=None):
    """nvidia-smi's fields for a GPU (see NVIDIA_SMI_FIELDS) and the pool's.

    ``gpu_id``: a CUDA device number, None (the current device), or a Pool
    (its backend's device number, and its figures). Values: ``timestamp`` as
    nvidia-smi prints it, ``name``, ``pci.bus_id``, ``driver_version``,
    ``pstate`` ('P0'...), PCIe generations, ``temperature.gpu`` (degrees C),
    ``utilization.*`` (percent over the driver's last sample period),
    ``memory.*`` in bytes; None where the GPU does not report one.
    ``pool.reserved_bytes`` and ``pool.allocated_bytes``: the pool's, None
    when numba_alloc has no pool on that device. For a GPU number or a Pool
    it needs no CUDA context and no plugin (None asks Numba for the current
    device).

    Raises RuntimeError when pynvml, NVML or the driver is missing (the
    message says which), TypeError for a ``gpu_id`` of another type and
    ValueError when it names no GPU.
    """
    _check(gpu_id)
    pynvml = _import_pynvml()
    _init(pynvml)
    try:
        device_id, pool = _resolve(gpu_id)
        info = _nvml_fields(pynvml, _nvml_handle(pynvml, device_id))
    finally:
        pynvml.nvmlShutdown()
    info["pool.reserved_bytes"] = None if pool is None else pool.memory_reserved()
    info["pool.allocated_bytes"] = None if pool is None else pool.memory_allocated()
    return info
