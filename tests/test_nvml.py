"""device_info: nvidia-smi's fields through pynvml, beside the pool's."""

import re
import sys
import types

import pytest

import numba_alloc
from numba_alloc import Pool, SimulatedDevice

from workload import MiB


try:
    import pynvml
except ImportError:
    pynvml = None

needs_pynvml = pytest.mark.skipif(pynvml is None, reason="needs pynvml (pip install 'numba-alloc[nvml]')")


def nvml_library_present():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@needs_pynvml
@pytest.mark.skipif(pynvml is not None and nvml_library_present(), reason="this machine has NVML")
def test_without_nvml_the_error_says_nvml_is_missing():
    with pytest.raises(RuntimeError, match=r"NVML \(libnvidia-ml.*\) is missing"):
        numba_alloc.device_info(0)


class FakeNVML(types.ModuleType):
    """pynvml's names, answering for two GPUs; records the calls."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    class NVMLError_FunctionNotFound(NVMLError):
        pass

    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x2000028
    UUIDS = ("GPU-0a1b2c3d-aaaa", "GPU-1111abcd-bbbb")

    def __init__(self, unsupported=(), memory_v2=True):
        super().__init__("pynvml")
        self.unsupported = set(unsupported)
        self.memory_v2 = memory_v2          # a driver from R510 on
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid == "MIG-2222":                  # an instance of GPU 1, not in the index
            return ("handle", 1)
        if uuid not in self.UUIDS:
            raise self.NVMLError("Not Found")
        return ("handle", self.UUIDS.index(uuid))

    def nvmlDeviceGetUUID(self, handle):
        return self.UUIDS[handle[1]].encode()

    def _answer(self, name, handle, value):
        self.calls.append((name, handle))
        if name in self.unsupported:
            raise self.NVMLError_NotSupported("Not Supported")
        return value

    def nvmlDeviceGetName(self, handle):
        return self._answer("name", handle, f"NVIDIA H100 80GB HBM3 #{handle[1]}")

    def nvmlDeviceGetPciInfo(self, handle):
        return self._answer("pci", handle, types.SimpleNamespace(busId=b"00000000:65:00.0"))

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetPerformanceState(self, handle):
        return self._answer("pstate", handle, 0)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self._answer("gen.max", handle, 5)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._answer("gen.current", handle, 4)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._answer("temperature", handle, 41)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._answer("utilization", handle, types.SimpleNamespace(gpu=87, memory=35))

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is None:     # version 1: used counts what the driver reserves
            return self._answer("memory", handle, types.SimpleNamespace(
                total=80 << 30, free=60 << 30, used=20 << 30))
        assert version == self.nvmlMemory_v2
        if not self.memory_v2:
            raise self.NVMLError_FunctionNotFound("Function Not Found")
        return self._answer("memory", handle, types.SimpleNamespace(
            total=80 << 30, reserved=512 << 20, free=60 << 30, used=(20 << 30) - (512 << 20)))


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_fields_are_nvidia_smis_beside_the_pools(fake_nvml):
    pool = Pool(SimulatedDevice(64 * MiB, device_id=1))
    block = pool.malloc(5 * MiB)                # a 20 MiB segment
    info = numba_alloc.device_info(pool)
    fields = numba_alloc.observe.nvml.NVIDIA_SMI_FIELDS + numba_alloc.observe.nvml.POOL_FIELDS
    assert tuple(info) == fields
    assert re.fullmatch(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}", info.pop("timestamp"))
    assert info == {
        "name": "NVIDIA H100 80GB HBM3 #1", "pci.bus_id": "00000000:65:00.0",
        "driver_version": "550.54.15", "pstate": "P0", "pcie.link.gen.max": 5,
        "pcie.link.gen.current": 4, "temperature.gpu": 41, "utilization.gpu": 87,
        "utilization.memory": 35, "memory.total": 80 << 30, "memory.reserved": 512 << 20,
        "memory.free": 60 << 30, "memory.used": (20 << 30) - (512 << 20),
        "pool.reserved_bytes": 20 * MiB, "pool.allocated_bytes": 5 * MiB}
    assert all(call[1] == ("handle", 1) for call in fake_nvml.calls if isinstance(call, tuple))
    assert fake_nvml.calls[0] == "init" and fake_nvml.calls[-1] == "shutdown"
    pool.free(block)


def test_the_pools_figures_are_of_one_instant(fake_nvml, monkeypatch):
    """A thread growing the pool between the two reads cannot make
    allocated exceed reserved: both are read under the pool's lock."""
    import threading
    pool = Pool(SimulatedDevice(64 * MiB))
    read, grower = pool.current, []

    def current(family, *args):
        value = read(family, *args)
        if not grower:       # the first read: another thread grows the pool now
            grower.append(threading.Thread(target=pool.malloc, args=(30 * MiB,)))
            grower[0].start()
            grower[0].join(0.5)     # blocked on the lock held across the reads
        return value

    monkeypatch.setattr(pool, "current", current)
    info = numba_alloc.device_info(pool)
    grower[0].join()
    assert (info["pool.reserved_bytes"], info["pool.allocated_bytes"]) == (0, 0)


def test_a_gpu_number_reads_the_pool_numba_alloc_has_there_if_any(fake_nvml, monkeypatch):
    monkeypatch.setattr(numba_alloc.plugin.registry, "_pools", {})
    info = numba_alloc.device_info(0)
    assert info["name"] == "NVIDIA H100 80GB HBM3 #0"
    assert info["pool.reserved_bytes"] is None and info["pool.allocated_bytes"] is None
    pool = numba_alloc.plugin.registry.create_pool(SimulatedDevice(64 * MiB, device_id=0))
    pool.malloc(5000)
    info = numba_alloc.device_info(0)
    assert (info["pool.reserved_bytes"], info["pool.allocated_bytes"]) == (2 * MiB, 5120)


def test_unsupported_queries_read_none_as_nvidia_smi_prints_na(monkeypatch):
    fake = FakeNVML(unsupported={"pci", "utilization", "temperature"})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = numba_alloc.device_info(0)
    assert info["pci.bus_id"] is info["temperature.gpu"] is None
    assert info["utilization.gpu"] is info["utilization.memory"] is None
    assert info["memory.total"] == 80 << 30


def test_cuda_visible_devices_maps_the_gpu_number(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert numba_alloc.device_info(0)["name"].endswith("#1")
    for uuid in ("GPU-1111abcd-bbbb", "GPU-1111", "MIG-2222"):   # a UUID's start too
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)
        assert numba_alloc.device_info(0)["name"].endswith("#1")
    with pytest.raises(ValueError, match="gpu_id 1 names no GPU: CUDA_VISIBLE_DEVICES"):
        numba_alloc.device_info(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9999")
    with pytest.raises(ValueError, match="'GPU-9999' is unknown to NVML"):
        numba_alloc.device_info(0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-")
    with pytest.raises(ValueError, match="'GPU-' is the start of 2 GPUs' UUIDs"):
        numba_alloc.device_info(0)


@pytest.mark.parametrize("visible, why", [
    ("1,-1,0", "'-1' is no GPU's index (NVML sees 2)"),
    ("1,2,0", "'2' is no GPU's index (NVML sees 2)"),
    ("GPU-1111,GPU-9999,0", "'GPU-9999' is unknown to NVML"),
    ("GPU-1111,GPU-,0", "'GPU-' is the start of 2 GPUs' UUIDs"),
    ("1,,0", "'' is empty"), ("1, ,0", "'' is empty")])
def test_cuda_visible_devices_ends_at_its_first_entry_naming_no_gpu(fake_nvml, monkeypatch,
                                                                     visible, why):
    """As CUDA reads the variable, an entry that names no GPU ends the
    list, an empty one too: each of these makes one GPU visible, NVML's
    GPU 1 (GPU 2, and "GPU:2", read NVML's GPU 0 when every entry was
    counted, empty ones skipped)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert numba_alloc.device_info(0)["name"].endswith("#1")
    for gpu_id in (1, 2):
        with pytest.raises(ValueError) as refused:
            numba_alloc.device_info(gpu_id)
        assert str(refused.value) == (f"gpu_id {gpu_id} names no GPU: CUDA_VISIBLE_DEVICES="
                                      f"{visible!r} makes 1 visible: its entry {why}, and "
                                      "CUDA stops there")
    with pytest.raises(ValueError, match="gpu_id"):
        numba_alloc.device_info("GPU:2")
    assert fake_nvml.calls[-1] == "shutdown"


def test_memory_is_read_as_nvidia_smi_reads_it_before_and_after_r510(fake_nvml):
    """From R510 nvidia-smi's memory.used leaves out what the driver
    reserves (NVML's version 2, memory.reserved apart); before, version 1."""
    info = numba_alloc.device_info(0)
    assert (info["memory.reserved"], info["memory.used"]) == (512 << 20, (20 << 30) - (512 << 20))
    fake_nvml.memory_v2 = False
    info = numba_alloc.device_info(0)
    assert (info["memory.reserved"], info["memory.used"]) == (None, 20 << 30)


def test_a_gpu_number_nvml_does_not_know_names_gpu_id(fake_nvml):
    with pytest.raises(ValueError, match="gpu_id 2 names no GPU: NVML sees 2"):
        numba_alloc.device_info(2)
    assert fake_nvml.calls[-1] == "shutdown"


@pytest.mark.parametrize("gpu_id, error", [("GPU", ValueError), (1.5, TypeError),
                                           (True, TypeError), (-1, ValueError)])
def test_bad_gpu_ids_are_refused_before_nvml_is_asked(fake_nvml, gpu_id, error):
    with pytest.raises(error, match="gpu_id"):
        numba_alloc.device_info(gpu_id)
    assert fake_nvml.calls == []


def test_a_driver_that_is_not_loaded_is_named(monkeypatch):
    fake = FakeNVML()

    def init():
        raise fake.NVMLError_DriverNotLoaded("Driver Not Loaded")
    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(RuntimeError, match="driver is not loaded"):
        numba_alloc.device_info(0)


def test_a_missing_pynvml_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(RuntimeError, match=r"pip install 'numba-alloc\[nvml\]'"):
        numba_alloc.device_info(0)


# -- on a GPU -------------------------------------------------------------------

from gpu_marks import gpu_only, needs_gpu
from numba import cuda


@needs_gpu
@needs_pynvml
@gpu_only("NVML reads the real driver")
def test_the_real_driver_view_matches_numba():
    info = numba_alloc.device_info(0)
    total = cuda.current_context().get_memory_info()[1]
    assert abs(info["memory.total"] - total) < 0.03 * total   # NVML counts a little more
    name = cuda.gpus[0].name
    assert info["name"] == (name.decode() if isinstance(name, bytes) else name)
    assert info["driver_version"] and info["pstate"].startswith("P")
    assert info["memory.used"] + info["memory.free"] <= info["memory.total"]


def test_without_pynvml_the_ledger_has_no_per_process_figure_and_no_error(monkeypatch):
    from numba_alloc.observe.nvml import process_usage
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert process_usage(0) is None


@pytest.mark.parametrize("visible, again", [
    ("1,1", "'1'"), ("0,1,0", "'0'"), ("0,1,0,-1", "'0'"), ("GPU-1111,1", "'1'"),
    ("1,GPU-1111abcd-bbbb", "'GPU-1111abcd-bbbb'")])
def test_a_gpu_named_twice_in_cuda_visible_devices_makes_none_visible(fake_nvml, monkeypatch,
                                                                      visible, again):
    """A GPU named twice, by index or UUID, makes no GPU visible (the
    reading of nvml._visible_handles), even after entries that name one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    for gpu_id in (0, 1):
        with pytest.raises(ValueError) as refused:
            numba_alloc.device_info(gpu_id)
        assert str(refused.value) == (f"gpu_id {gpu_id} names no GPU: CUDA_VISIBLE_DEVICES="
                                      f"{visible!r} makes 0 visible: its entry {again} names "
                                      "a GPU an entry before it named, which is read as none "
                                      "visible")
    with pytest.raises(ValueError, match="gpu_id"):
        numba_alloc.device_info("GPU:0")
