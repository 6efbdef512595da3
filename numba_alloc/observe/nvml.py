"""The driver's view of a GPU through NVML (the pynvml module of
nvidia-ml-py), beside the pool's own figures.

:func:`device_info` returns nvidia-smi's ``--query-gpu`` fields for one GPU
with the pool's reserved and allocated bytes, so that what the driver sees
used (all processes, all allocators, the CUDA context itself) and what the
pool holds sit side by side.
"""

import datetime
import os
from typing import NamedTuple

from ..plugin import registry
from ..plugin.devices import match_gpu
from ..policy.pool import Pool

NVIDIA_SMI_FIELDS = ("timestamp", "name", "pci.bus_id", "driver_version", "pstate",
                     "pcie.link.gen.max", "pcie.link.gen.current", "temperature.gpu",
                     "utilization.gpu", "utilization.memory", "memory.total",
                     "memory.reserved", "memory.free", "memory.used")
POOL_FIELDS = ("pool.reserved_bytes", "pool.allocated_bytes")
_PSTATE_UNKNOWN = 32


def _import_pynvml():
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("device_info needs NVML's Python module (pynvml): "
                           "pip install 'numba-alloc[nvml]'") from None
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


def _visible_entries():
    """CUDA_VISIBLE_DEVICES's entries, each stripped, an empty one kept
    (none for an empty variable), or None when it is not set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [e.strip() for e in visible.split(",")] if visible.strip() else []


def _entry_handle(pynvml, entry, count):
    """(the NVML handle of the GPU a CUDA_VISIBLE_DEVICES ``entry`` names,
    None), or (None, why it names none): an index below NVML's ``count``,
    a UUID (a MIG instance's too), or the start of one GPU's UUID; an
    empty entry names none."""
    if not entry:
        return None, "is empty"
    try:
        if entry.lstrip("-").isdigit():
            if not 0 <= int(entry) < count:
                return None, f"is no GPU's index (NVML sees {count})"
            return pynvml.nvmlDeviceGetHandleByIndex(int(entry)), None
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(entry), None     # whole: a MIG instance's too
        except pynvml.NVMLError:
            pass
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        matches = [h for h in handles if _text(pynvml.nvmlDeviceGetUUID(h)).startswith(entry)]
    except pynvml.NVMLError as e:
        return None, f"is unknown to NVML ({e})"
    if len(matches) != 1:       # CUDA takes a UUID's start that names one GPU
        return None, ("is unknown to NVML" if not matches else
                      f"is the start of {len(matches)} GPUs' UUIDs")
    return matches[0], None


def _visible_handles(pynvml, entries):
    """(the NVML handles of the GPUs CUDA sees through CUDA_VISIBLE_DEVICES's
    ``entries``, in CUDA's order; None, or why they are fewer than the
    entries). CUDA's programming guide (CUDA_VISIBLE_DEVICES) documents
    that the list ends at the first invalid index (1,-1,0 makes one GPU
    visible: NVML's GPU 1): here at the first entry that names no GPU.
    It leaves an empty entry and a GPU named twice undocumented; they are
    read as PyTorch's torch.cuda._parse_visible_devices reads them, the
    cautious way (never a GPU CUDA may not show): an empty entry names no
    GPU, so it ends the list (1,,0 makes NVML's GPU 1 visible), and a GPU
    named twice, by index or UUID, makes none visible (0,0; 0,1,0)."""
    count, handles, uuids = pynvml.nvmlDeviceGetCount(), [], set()
    for entry in entries:
        handle, why = _entry_handle(pynvml, entry, count)
        if handle is None:
            return handles, f"its entry {entry!r} {why}, and CUDA stops there"
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        if uuid in uuids:
            return [], (f"its entry {entry!r} names a GPU an entry before it named, which "
                        "is read as none visible")
        handles.append(handle)
        uuids.add(uuid)
    return handles, None


def _cuda_count(pynvml):
    """How many GPUs CUDA sees, as NVML and CUDA_VISIBLE_DEVICES say."""
    entries = _visible_entries()
    if entries is None:
        return pynvml.nvmlDeviceGetCount()
    return len(_visible_handles(pynvml, entries)[0])


def _nvml_handle(pynvml, gpu_id):
    """The NVML handle of CUDA device ``gpu_id``, mapped through
    CUDA_VISIBLE_DEVICES (indices or UUIDs) as CUDA maps it; ValueError,
    saying why, when CUDA has no device ``gpu_id``."""
    entries = _visible_entries()
    if entries is None:
        count = pynvml.nvmlDeviceGetCount()
        if gpu_id >= count:
            raise ValueError(f"gpu_id {gpu_id} names no GPU: NVML sees {count}")
        return pynvml.nvmlDeviceGetHandleByIndex(gpu_id)
    handles, ended = _visible_handles(pynvml, entries)
    if gpu_id >= len(handles):
        visible = os.environ["CUDA_VISIBLE_DEVICES"]
        raise ValueError(f"gpu_id {gpu_id} names no GPU: CUDA_VISIBLE_DEVICES={visible!r} "
                         f"makes {len(handles)} visible" + (f": {ended}" if ended else ""))
    return handles[gpu_id]


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _query(pynvml, function, *args):
    """``function(*args)``, or None where the GPU does not support it
    (nvidia-smi prints [N/A] there)."""
    try:
        return function(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission):
        return None


class _Memory(NamedTuple):
    total: int
    reserved: int | None
    free: int
    used: int


def _memory(pynvml, handle):
    """The GPU's memory as nvidia-smi reads it: NVML's version 2 (its used
    bytes leave out what the driver reserves, reported apart), else
    version 1 (used includes it; reserved None); None where unsupported."""
    if hasattr(pynvml, "nvmlMemory_v2"):
        try:
            return _query(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
        except pynvml.NVMLError_FunctionNotFound:
            pass            # a driver before R510
    memory = _query(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
    return None if memory is None else _Memory(memory.total, None, memory.free, memory.used)


def _nvml_fields(pynvml, handle):
    def q(function, *args):
        return _query(pynvml, function, handle, *args)

    pci = q(pynvml.nvmlDeviceGetPciInfo)
    pstate = q(pynvml.nvmlDeviceGetPerformanceState)
    rates = q(pynvml.nvmlDeviceGetUtilizationRates)
    memory = _memory(pynvml, handle)
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
        "memory.reserved": None if memory is None else memory.reserved,
        "memory.free": None if memory is None else memory.free,
        "memory.used": None if memory is None else memory.used,
    }


def _resolve(pynvml, checked):
    """(CUDA device number, its pool or None) for a gpu_id from check_device;
    a TensorFlow name is matched against the GPUs NVML makes visible."""
    if isinstance(checked, Pool):
        return checked.backend.device_id, checked
    if checked is None:
        checked = registry.current_gpu()
    elif isinstance(checked, registry.DeviceName):
        checked = match_gpu(checked.name, checked.index, _cuda_count(pynvml), "gpu_id")
    return checked, registry.pool_of(checked)


def device_info(gpu_id=None) -> dict[str, object]:
    """nvidia-smi's fields for a GPU (see NVIDIA_SMI_FIELDS) and the pool's.

    ``gpu_id``: a CUDA device number, a TensorFlow name such as "GPU:0",
    None (the current device), or a Pool (its backend's device number, and
    its figures). Values: ``timestamp`` as
    nvidia-smi prints it, ``name``, ``pci.bus_id``, ``driver_version``,
    ``pstate`` ('P0'...), PCIe generations, ``temperature.gpu`` (degrees C),
    ``utilization.*`` (percent over the driver's last sample period),
    ``memory.*`` in bytes; None where the GPU does not report one.
    ``pool.reserved_bytes`` and ``pool.allocated_bytes``: the pool's, None
    when numba_alloc has no pool on that device. For a GPU number or a Pool
    it needs no CUDA context and no plugin, nor does a name (None asks Numba
    for the current device).

    Raises RuntimeError when pynvml, NVML or the driver is missing (the
    message says which), TypeError for a ``gpu_id`` of another type and
    ValueError when it names no GPU.
    """
    checked = registry.check_device(gpu_id, "gpu_id")
    pynvml = _import_pynvml()
    _init(pynvml)
    try:
        device_id, pool = _resolve(pynvml, checked)
        info = _nvml_fields(pynvml, _nvml_handle(pynvml, device_id))
    finally:
        pynvml.nvmlShutdown()
    if pool is None:
        info["pool.reserved_bytes"] = info["pool.allocated_bytes"] = None
    else:
        with pool.lock:             # of one instant
            info["pool.reserved_bytes"] = pool.current("reserved_bytes")
            info["pool.allocated_bytes"] = pool.current("allocated_bytes")
    return info


def process_usage(device_id):
    """(bytes this process uses on CUDA device ``device_id``, bytes the other
    processes use there), as NVML's per-process accounting reports them
    (context, modules and every allocator included); None where NVML, its
    library, the GPU's per-process figures or this process's entry (another
    PID namespace) are missing. Never raises for those."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:       # noqa: BLE001 (no pynvml, no library, no driver: no figures)
        return None
    try:
        handle = _nvml_handle(pynvml, device_id)
        processes = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except (pynvml.NVMLError, ValueError):
        return None
    finally:
        pynvml.nvmlShutdown()
    used = {p.pid: p.usedGpuMemory or 0 for p in processes}
    if os.getpid() not in used:
        return None
    mine = used.pop(os.getpid())
    return mine, sum(used.values())
