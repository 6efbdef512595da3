"""The Numba plugin's parts that run without a GPU."""

import os
import subprocess
import sys
import types

import pytest

from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat


def test_manager_constructs_without_a_context_or_cuda_call():
    import numba_alloc
    from numba.cuda.cudadrv.driver import HostOnlyCUDAMemoryManager
    manager_class = numba_alloc._numba_memory_manager
    assert issubclass(manager_class, HostOnlyCUDAMemoryManager)
    manager = manager_class(context=None)
    assert manager.interface_version == 1
    assert manager.pool is None


def test_numba_selects_the_plugin_from_the_environment():
    code = ("from numba.cuda.cudadrv import driver\n"
            "driver._ensure_memory_manager()\n"
            "import numba_alloc\n"
            "assert driver._memory_manager is numba_alloc._numba_memory_manager\n"
            "print('selected')\n")
    env = {**os.environ, "NUMBA_CUDA_MEMORY_MANAGER": "numba_alloc"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "selected" in out.stdout


def test_finalizer_is_harmless_after_reset_and_frees_before():
    from numba_alloc.plugin.emm import _free_block
    pool = Pool(SimulatedDevice(1 << 30))
    a, b = pool.malloc(100), pool.malloc(100)
    _free_block(pool, a, {})()
    assert compat.memory_allocated(pool) == 512
    pool.reset()
    _free_block(pool, b, {})()      # after reset: no error, nothing changes
    assert compat.memory_allocated(pool) == 0


def test_package_imports_under_the_cuda_simulator():
    code = ("import numba_alloc\n"
            "pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(1 << 20))\n"
            "print(pool.malloc(10).allocated_size)\n"
            "try:\n    numba_alloc.install()\nexcept RuntimeError as e:\n    print(e)\n"
            "from numba import cuda\n"
            "for obj in (object(), cuda.to_device([1.0])):\n"
            "    try:\n        numba_alloc.pin(obj)\n"
            "    except ValueError as e:\n        print(e)\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "512"
    assert "simulator" in out.stdout
    # pin: not memory of the pool (it raised ImportError, the plugin's module not importing)
    assert out.stdout.count("is not memory numba_alloc allocated") == 2


class _Device:
    id = 0
    _dev = types.SimpleNamespace(memory_resource=None)     # cuda-core's Device


class _Context:
    """Stands in for Numba's Context: the manager reads only ``device``
    before it builds its backend, which the test replaces."""
    device = _Device()


def _manager(monkeypatch):
    from numba_alloc.plugin import emm
    device = SimulatedDevice(1 << 30)
    monkeypatch.setattr(emm, "CudaDevice", lambda context: device)
    manager = emm.NumbaAllocManager(context=_Context())
    manager.initialize()
    return manager, device


def test_memalloc_pointers_follow_numbas_ownership_rules(monkeypatch):
    import gc

    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    manager, _ = _manager(monkeypatch)
    pool = manager.pool
    mem = manager.memalloc(4000)
    assert mem.size == 4000 and compat.memory_allocated(pool) == 4096
    assert int(mem.handle) == int(mem.device_pointer) == mem.device_ctypes_pointer.value
    assert mem.refct == 1
    v1 = mem.view(16)
    v2 = v1.view(16)
    assert mem.refct == 3
    assert int(v2.handle) - 32 == int(v2.owner.handle) == int(mem.handle)
    array = DeviceNDArray((1000,), (4,), np.dtype(np.float32), gpu_data=mem)
    assert array.__cuda_array_interface__["data"][0] == int(mem.handle)
    del mem, array, v1
    gc.collect()
    assert compat.memory_allocated(pool) == 4096          # v2 still holds the block
    del v2
    gc.collect()
    assert compat.memory_allocated(pool) == 0
    assert not manager.allocations                  # the manager let the pointer go


def test_pointers_and_views_hold_the_context_weakly_as_numbas_do(monkeypatch):
    import weakref
    manager, _ = _manager(monkeypatch)
    mem = manager.memalloc(4000)
    view = mem.view(16)
    for pointer in (mem, view):
        assert type(pointer.context) is weakref.ProxyType
        assert pointer.context.device is manager.context.device


def test_manager_memory_info_defer_cleanup_and_reset(monkeypatch):
    import gc
    manager, device = _manager(monkeypatch)
    pool = manager.pool
    keep = manager.memalloc(100)
    with manager.defer_cleanup():
        gone = manager.memalloc(MiB := 1 << 20)
        del gone
        gc.collect()
        assert pool.current("active_bytes", retire_completed=True) == 512 + MiB   # held back
    assert pool.current("active_bytes", retire_completed=True) == 512
    free, total = manager.get_memory_info()
    assert total == device.capacity
    assert free == device.memory_info()[0] + pool.current("reserved_bytes") - pool.current(
        "active_bytes", retire_completed=True)
    manager.reset()
    assert compat.memory_reserved(pool) == 0 and not manager.allocations
    del keep
    gc.collect()                                    # its finalizer runs after the reset
    assert compat.memory_allocated(pool) == 0


@pytest.mark.parametrize("settings, before, after", [
    ({}, 1024, 1023),
    ({"limit": "64MiB"}, 64, 63),
    ({"limit": 0.25}, 256, 255),
    ({"growth": False}, 1024, 1023),
    ({"growth": False, "limit": "96MiB"}, 96, 95),
])
def test_memory_info_says_what_a_new_allocation_could_get(monkeypatch, settings, before,
                                                          after):
    import gc

    from numba_alloc import OutOfMemoryError
    manager, _ = _manager(monkeypatch)
    MiB = 1 << 20
    manager.pool.configure(**settings)
    assert manager.get_memory_info() == (before * MiB, 1 << 30)
    keep = manager.memalloc(MiB)
    free, total = manager.get_memory_info()
    assert (free, total) == (after * MiB, 1 << 30)
    almost = manager.memalloc(free - MiB)
    del almost
    gc.collect()
    with pytest.raises(OutOfMemoryError):
        manager.memalloc(free + MiB)
    del keep


def test_manager_memory_info_is_of_one_instant(monkeypatch):
    """A thread growing the pool between the device's and the pool's reads
    cannot make free count the new segment's cached bytes besides the
    device memory it took."""
    import threading
    manager, device = _manager(monkeypatch)
    pool = manager.pool
    read, grower = device.memory_info, []

    def memory_info():
        value = read()
        if not grower:       # the first read: another thread grows the pool now
            grower.append(threading.Thread(target=pool.malloc, args=(1 << 20,)))
            grower[0].start()
            grower[0].join(0.5)     # blocked on the lock held across the reads
        return value

    monkeypatch.setattr(device, "memory_info", memory_info)
    free, total = manager.get_memory_info()
    grower[0].join()
    assert (free, total) == (device.capacity, device.capacity)


def test_moved_blocks_take_every_numba_reference_along(monkeypatch):
    import gc

    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    manager, device = _manager(monkeypatch)
    pool = manager.pool
    # a small segment of 16 blocks of 128 KiB, every other one freed
    pointers = [manager.memalloc(128 << 10) for _ in range(16)]
    for i in range(0, 16, 2):
        pointers[i] = None
    gc.collect()
    pool.synchronize()
    survivor = pointers[1]                 # in the cheapest window: it will move
    view = survivor.view(4096)             # an OwnedPointer over a PoolView
    view_of_view = view.view(512, 1024)
    array = DeviceNDArray((1000,), (4,), np.dtype(np.float32), gpu_data=survivor)
    shim_address = array._strided_memory_view_shim.ptr
    block = survivor.block
    old = block.address
    assert shim_address == old
    assert pool.defragment(4 * (128 << 10)).blocks_moved == 2
    new = block.address
    assert new != old
    for ptr, expected in ((survivor, new), (view, new + 4096), (view_of_view, new + 4608)):
        assert ptr.device_ctypes_pointer.value == expected
        assert int(ptr.handle) == int(ptr.device_pointer) == expected
    assert array.__cuda_array_interface__["data"][0] == new
    assert array._strided_memory_view_shim.ptr == new
    assert block.pinned                    # the interface was read: the block stays now


def test_pinned_blocks_stay_and_nrt_memsys_is_pinned(monkeypatch):
    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.memory_management import nrt
    manager, _ = _manager(monkeypatch)
    memsys = DeviceNDArray((64,), (1,), np.dtype(np.int8), gpu_data=manager.memalloc(64))
    monkeypatch.setattr(nrt.rtsys, "_memsys", memsys)
    manager.pool.relocator.pin_unmovable(manager.pool)
    assert memsys.gpu_data.block.pinned == 1


def test_reading_the_array_interface_pins_for_good_even_inside_a_temporary_pin(monkeypatch):
    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    import numba_alloc
    manager, _ = _manager(monkeypatch)
    array = DeviceNDArray((64,), (1,), np.dtype(np.uint8), gpu_data=manager.memalloc(64))
    with numba_alloc.pin(array):
        array.__cuda_array_interface__       # a reader keeps this address
    assert array.gpu_data.block.pinned == 1


class _IpcDriver:
    """Numba's driver as its IPC export uses it, over pools' segments;
    ``fail``: the error cuIpcGetMemHandle raises."""

    def __init__(self, pools, fail=None):
        self.pools, self.fail = pools, fail

    def cuMemGetAddressRange(self, address):
        (segment,) = [s for pool in self.pools for s in pool._segments.values()
                      if s.address <= address < s.address + s.size]
        return segment.address, segment.size

    def cuIpcGetMemHandle(self, base):
        if self.fail is not None:
            raise self.fail
        return ("ipc", base)


def _exporting(monkeypatch, pools, fail=None):
    from numba.cuda.cudadrv import driver
    monkeypatch.setattr(driver, "driver", _IpcDriver(pools, fail))
    monkeypatch.setattr(_Device, "get_device_identity", lambda self: {"id": self.id},
                        raising=False)


def test_an_ipc_export_that_fails_leaves_the_block_unpinned(monkeypatch):
    from numba.cuda.cudadrv.driver import CudaAPIError
    manager, _ = _manager(monkeypatch)
    mem = manager.memalloc(4096)
    _exporting(monkeypatch, [manager.pool], CudaAPIError(1, "invalid value"))
    with pytest.raises(CudaAPIError, match="invalid value"):
        manager.get_ipc_handle(mem)
    assert mem.block.pinned == 0                 # it may still move
    _exporting(monkeypatch, [manager.pool])
    handle = manager.get_ipc_handle(mem.view(1024))
    assert mem.block.pinned == 1
    assert handle.offset == mem.block.address + 1024 - mem.block.segment.address


def test_an_ipc_export_of_another_devices_array_pins_it_in_its_own_pool(monkeypatch):
    """Numba exports through the current context's manager, whichever
    device the array is on."""
    first, _ = _manager(monkeypatch)
    second, _ = _manager(monkeypatch)
    mem = first.memalloc(4096)
    _exporting(monkeypatch, [first.pool, second.pool])
    handle = second.get_ipc_handle(mem)
    assert mem.block.pinned == 1 and handle.handle == ("ipc", mem.block.segment.address)


def test_initialize_builds_one_pool_when_numba_calls_it_again_from_inside(monkeypatch):
    from numba_alloc.plugin import emm
    built = []
    manager = emm.NumbaAllocManager(context=_Context())

    def backend(context):
        built.append(context)
        manager.initialize()                  # Numba ensuring a context, re-entering
        return SimulatedDevice(1 << 30)

    monkeypatch.setattr(emm, "CudaDevice", backend)
    pool = manager.initialize()
    assert pool is manager.pool and len(built) == 1


def test_launch_caches_of_views_and_bound_copies_follow_a_move_past_dead_proxies(monkeypatch):
    import gc
    import weakref

    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    manager, _ = _manager(monkeypatch)
    pool = manager.pool
    pointers = [manager.memalloc(128 << 10) for _ in range(16)]
    for i in range(0, 16, 2):
        pointers[i] = None
    gc.collect()
    pool.synchronize()
    survivor = pointers[1]
    array = DeviceNDArray((1000,), (4,), np.dtype(np.float32), gpu_data=survivor)
    part = DeviceNDArray((256,), (4,), np.dtype(np.float32),      # as array[256:512]
                         gpu_data=survivor.view(1024, 2048))
    launch_caches = [array._strided_memory_view_shim, part._strided_memory_view_shim]
    bound = array.bind(stream=1)            # a copy sharing the array's cached shim
    block = survivor.block

    class Gone:
        pass

    gone = Gone()
    dead = [weakref.proxy(gone)]            # as Numba leaves after cuda.close()
    del gone
    with pytest.raises(ReferenceError):
        isinstance(dead[0], DeviceNDArray)

    def no_walk():
        raise AssertionError("relocation walked every Python object")
    monkeypatch.setattr(gc, "get_objects", no_walk)
    assert pool.defragment(4 * (128 << 10)).blocks_moved == 2
    new = block.address
    assert array._strided_memory_view_shim.ptr == new
    assert part._strided_memory_view_shim.ptr == new + 1024
    assert bound._strided_memory_view_shim.ptr == new
    assert [c.ptr for c in launch_caches] == [new, new + 1024]
    assert not block.pinned                 # nothing read the array interface
    assert dead


def _weak_sets(pointer):
    import weakref
    return [value for value in vars(pointer).values() if isinstance(value, weakref.WeakSet)]


def _one_survivor(manager):
    """16 blocks of 128 KiB in one segment, every other one freed: the
    pointer of the second block, which defragment(512 KiB) moves, and the
    list of the others still live."""
    import gc
    pointers = [manager.memalloc(128 << 10) for _ in range(16)]
    for i in range(0, 16, 2):
        pointers[i] = None
    gc.collect()
    manager.pool.synchronize()
    return pointers[1], [p for p in pointers[2:] if p is not None]


def test_sets_of_views_and_shims_are_made_on_first_use_and_follow_later_moves(monkeypatch):
    import gc

    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    manager, _ = _manager(monkeypatch)
    pool = manager.pool
    survivor, others = _one_survivor(manager)
    root = manager.allocations[survivor.block]
    array = DeviceNDArray((1000,), (4,), np.dtype(np.float32), gpu_data=survivor)
    assert _weak_sets(root) == []               # no view, no launch cache yet: no set
    assert pool.defragment(4 * (128 << 10)).blocks_moved == 2
    first = survivor.block.address
    assert survivor.device_ctypes_pointer.value == int(survivor.handle) == first
    view = survivor.view(4096)                  # made after the move
    shim = array._strided_memory_view_shim      # computed after the move
    assert int(view.handle) == view.device_ctypes_pointer.value == first + 4096
    assert shim.ptr == first
    assert len(_weak_sets(root)) == 2
    del others                                  # alone in its segment: compaction slides it down
    gc.collect()
    pool.synchronize()
    assert pool.defragment().blocks_moved == 1
    second = survivor.block.address
    assert second != first
    assert int(view.handle) == view.device_ctypes_pointer.value == second + 4096
    assert shim.ptr == array._strided_memory_view_shim.ptr == second
    assert survivor.device_ctypes_pointer.value == second


def test_views_made_at_once_on_several_threads_all_follow_a_move(monkeypatch):
    """The first view makes the set; threads racing to make it, each under
    the pool's lock, must share one set."""
    import threading
    import time
    import types
    import weakref

    from numba_alloc.plugin import emm
    manager, _ = _manager(monkeypatch)
    survivor, others = _one_survivor(manager)

    class SlowWeakSet(weakref.WeakSet):
        def __init__(self):
            time.sleep(0.05)                    # a window for another thread to make one too
            super().__init__()

    monkeypatch.setattr(emm, "weakref", types.SimpleNamespace(
        WeakSet=SlowWeakSet, proxy=weakref.proxy))
    start, views = threading.Barrier(4), [None] * 4

    def make(i):
        start.wait()
        views[i] = survivor.view(1024 * i)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert manager.pool.defragment(4 * (128 << 10)).blocks_moved == 2
    new = survivor.block.address
    assert [int(v.handle) for v in views] == [new + 1024 * i for i in range(4)]
    assert [v.device_ctypes_pointer.value for v in views] == [new + 1024 * i for i in range(4)]
    del others


def test_launch_caches_of_other_memory_are_numbas_own(monkeypatch):
    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import MemoryPointer, binding

    from numba_alloc.plugin.relocation import MovableShim
    manager, _ = _manager(monkeypatch)
    foreign = MemoryPointer(None, binding.CUdeviceptr(1 << 40), 4096)
    array = DeviceNDArray((1024,), (4,), np.dtype(np.float32), gpu_data=foreign)
    shim = array._strided_memory_view_shim
    assert shim.ptr == 1 << 40 and not isinstance(shim, MovableShim)
    ours = DeviceNDArray((1024,), (4,), np.dtype(np.float32), gpu_data=manager.memalloc(4096))
    assert isinstance(ours._strided_memory_view_shim, MovableShim)


# -- the CUDA backend over a stand-in driver: which context each call runs in --

class _StandInDriver:
    """Numba's driver as CudaDevice uses it: a stack of current contexts,
    device memory as bookkeeping, and an error for a call that needs its
    context current when it is not (as CUDA_ERROR_INVALID_CONTEXT)."""

    def __init__(self):
        self.stack, self.allocated, self.freed = [], {}, []
        self._next = 1 << 32
        self.devices = {}           # Numba's devices (their primary contexts), by id

    def require(self, context):
        if not self.stack or self.stack[-1] != context.handle:
            from numba.cuda.cudadrv.driver import CudaAPIError
            raise CudaAPIError(201, f"context {context.handle} is not current")

    def context(self):
        return next(c for c in _StandInContext.made if c.handle == self.stack[-1])

    def cuCtxGetCurrent(self):
        return self.stack[-1] if self.stack else 0

    def cuCtxPushCurrent(self, handle):
        self.stack.append(handle)

    def cuCtxPopCurrent(self):
        return self.stack.pop()

    def cuMemAlloc(self, nbytes):
        address, self._next = self._next, self._next + nbytes + 4096
        self.allocated[address] = self.context()
        return address

    def cuMemFree(self, pointer):
        self.freed.append(int(pointer))

    def cuMemGetInfo(self):
        self.context()
        return 1 << 34, 1 << 35

    def cuMemsetD8(self, pointer, value, nbytes):
        self.context()


class _StandInEvent:
    handle = None

    def __init__(self, context):
        self.context = context

    def record(self, stream):
        self.context.driver.require(self.context)

    def query(self):
        return True


class _StandInContext:
    """A Numba Context whose calls need it current in the stand-in driver."""
    made = []
    device = _Device()

    def __init__(self, driver, handle):
        self.driver, self.handle, self.synchronized = driver, handle, 0
        _StandInContext.made.append(self)

    def create_event(self, timing=True):
        self.driver.require(self)
        return _StandInEvent(self)

    def get_legacy_default_stream(self):
        return "legacy"

    def synchronize(self):
        self.driver.require(self)
        self.synchronized += 1


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """(driver, manager) for a context made current, over a real CudaDevice."""
    from numba_alloc.backends import cuda_device as cuda_backend
    from numba_alloc.backends import cuda_events
    from numba_alloc.plugin import emm
    driver = _StandInDriver()
    monkeypatch.setattr(cuda_backend, "driver", driver)
    monkeypatch.setattr(cuda_events, "driver", driver)
    monkeypatch.setattr(cuda_events, "_event_done", lambda handle: True)
    context = _StandInContext(driver, handle=7)
    driver.stack.append(context.handle)
    manager = emm.NumbaAllocManager(context=context)
    manager.initialize()
    yield driver, manager
    _StandInContext.made.clear()


@pytest.mark.parametrize("current", ["none", "another device's"])
def test_reset_runs_in_its_own_context_whatever_is_current(stand_in_gpu, current):
    import gc
    driver, manager = stand_in_gpu
    pool, context = manager.pool, manager.context
    live = manager.memalloc(64 << 20)
    freed = manager.memalloc(1 << 20)
    del freed
    gc.collect()                        # a pending free: the pool must wait for the device
    segments = [a for a, c in driver.allocated.items() if c is context][1:]  # not the scratch
    other = _StandInContext(driver, handle=9)
    driver.stack[:] = [] if current == "none" else [other.handle]   # as cuda.close() leaves it
    before = list(driver.stack)
    manager.reset()
    assert driver.stack == before       # pushed and popped around its own calls
    assert context.synchronized >= 1 and other.synchronized == 0
    assert sorted(driver.freed) == sorted(segments)
    assert compat.memory_reserved(pool) == 0
    del live


def test_calls_in_another_context_run_in_the_backends(stand_in_gpu):
    driver, manager = stand_in_gpu
    pool, context = manager.pool, manager.context
    other = _StandInContext(driver, handle=9)
    driver.stack[:] = [other.handle]
    block = pool.malloc(100 << 20)      # a new segment, in the pool's context
    assert driver.allocated[block.segment.address] is context
    pool.free(block)
    pool.synchronize()
    pool.empty_cache()
    assert driver.stack == [other.handle] and other.synchronized == 0


def test_a_session_makes_the_backends_context_current_once(stand_in_gpu):
    """Inside CudaDevice.session (a defragmentation: hundreds of releases)
    the backend's calls run in its context without asking the driver which
    is current; another thread's calls still ask; after it the stack is as
    it was."""
    import threading
    driver, manager = stand_in_gpu
    backend, context = manager.pool.backend, manager.context
    other = _StandInContext(driver, handle=9)
    driver.stack[:] = [other.handle]
    asked, get = [], driver.cuCtxGetCurrent
    driver.cuCtxGetCurrent = lambda: asked.append(1) or get()
    with backend.session():
        assert driver.stack == [other.handle, context.handle] and len(asked) == 1
        addresses = [backend.allocate(1 << 20) for _ in range(3)]
        for address in addresses:
            backend.release(address)
        backend.synchronize()
        assert len(asked) == 1 and context.synchronized == 1
        thread = threading.Thread(target=backend.memory_info)
        thread.start()
        thread.join()
        assert len(asked) == 2
    assert driver.stack == [other.handle] and sorted(driver.freed)[-3:] == sorted(addresses)
    assert all(driver.allocated[a] is context for a in addresses)
    backend.memory_info()                   # outside it: asks again, pushes and pops
    assert len(asked) == 3 and driver.stack == [other.handle]


def test_defragmenting_a_reset_pool_asks_the_driver_nothing(stand_in_gpu):
    """A pool whose context was reset (Numba's Context.reset) has nothing
    to move: defragment() answers without a driver call (its session
    starts only for a compaction)."""
    driver, manager = stand_in_gpu
    manager.reset()

    def refused(*args):
        raise AssertionError("a driver call")

    driver.cuCtxGetCurrent = driver.cuCtxPushCurrent = refused
    assert tuple(manager.pool.defragment()) == (0, 0, 0, True)
    assert tuple(manager.pool.defragment(1 << 20)) == (0, 0, 0, False)


def test_an_event_over_every_device_records_and_waits_in_each_live_context(stand_in_gpu,
                                                                          monkeypatch):
    """With the backend's context the only live one, event_all_devices is
    its plain event and synchronize_other_devices calls nothing; with
    another device's primary context live, each part is made and recorded
    with its own context current (the stack left as found), the other
    context is synchronized, and once it is reset (no longer its device's
    primary context) its event is never asked, the backend's still is."""
    import types

    from numba_alloc.backends import cuda_device as cuda_backend
    from numba_alloc.backends import cuda_events
    driver, manager = stand_in_gpu
    backend, context = manager.pool.backend, manager.context
    assert type(backend.event_all_devices()) is cuda_backend.CudaEvent
    driver.cuCtxPushCurrent = driver.cuCtxPopCurrent = None      # any call would fail
    backend.synchronize_other_devices()
    del driver.cuCtxPushCurrent, driver.cuCtxPopCurrent
    device = types.SimpleNamespace(primary_context=None)
    other = _StandInContext(driver, handle=9)
    other.device = device
    driver.devices = {0: types.SimpleNamespace(primary_context=context), 1: device}
    device.primary_context = other
    driver.stack[:] = []                                         # none current
    event = backend.event_all_devices()
    event.record()                  # _StandInEvent.record: refused unless its context is current
    assert driver.stack == []
    backend.synchronize_other_devices()
    assert other.synchronized == 1 and context.synchronized == 0 and driver.stack == []
    asked = []
    monkeypatch.setattr(cuda_events, "_event_done", lambda handle: asked.append(handle) or True)
    assert event.query() and len(asked) == 2
    device.primary_context = None                                # device 1 reset
    asked.clear()
    assert event.query() and len(asked) == 1
    backend.synchronize_other_devices()
    assert other.synchronized == 1


def test_is_current_asks_the_driver_only_with_another_live_context(stand_in_gpu):
    """CudaDevice.is_current: with no other live context Numba knows, True
    without a driver call; with one, whether the backend's context is the
    current one."""
    import types
    driver, manager = stand_in_gpu
    backend, context = manager.pool.backend, manager.context
    asked = []
    get = driver.cuCtxGetCurrent
    driver.cuCtxGetCurrent = lambda: asked.append(1) or get()
    driver.stack[:] = []
    assert backend.is_current() and not asked
    other = _StandInContext(driver, handle=9)
    driver.devices = {1: types.SimpleNamespace(primary_context=other)}
    assert not backend.is_current() and asked
    driver.stack[:] = [other.handle, context.handle]
    assert backend.is_current()


# -- loading the copy kernel: never under the pool's lock, before the arena --

class _KernelDevice(SimulatedDevice):
    """A simulated device with a copy kernel to load, recording how it was
    loaded: whether the pool's lock was free and the arena not reserved."""

    def __init__(self, capacity, error=None):
        super().__init__(capacity)
        self.loads, self.copy_error, self.pool = [], None, None
        self._error = error

    @property
    def copy_ready(self):
        return bool(self.loads) and self.copy_error is None

    def load_copy_kernel(self):
        import threading
        result = []

        def probe():                    # can another thread take the pool's lock?
            result.append(self.pool.lock.acquire(blocking=False))
            if result[0]:
                self.pool.lock.release()
        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        self.loads.append((result[0], self.pool.initialized))
        self.copy_error = self._error
        return self._error


def _kernel_manager(monkeypatch, error=None, **settings):
    from numba_alloc.plugin import emm
    device = _KernelDevice(1 << 30, error)
    monkeypatch.setattr(emm, "CudaDevice", lambda context: device)
    manager = emm.NumbaAllocManager(context=_Context())
    device.pool = manager.initialize()
    device.pool.configure(**settings)
    return manager, device


def test_the_copy_kernel_loads_outside_the_lock_before_the_arena(monkeypatch):
    manager, device = _kernel_manager(monkeypatch, growth=False, limit="64MiB", defrag=True)
    assert device.loads == []                       # not in initialize()
    first = manager.memalloc(100)
    assert device.loads == [(True, False)]          # lock free, arena not reserved yet
    second = manager.memalloc(100)
    assert len(device.loads) == 1
    manager.reset()
    third = manager.memalloc(100)                   # a reset context loads it again
    assert len(device.loads) == 2
    del first, second, third


def test_switching_defrag_on_loads_the_kernel_at_the_next_allocation(monkeypatch):
    manager, device = _kernel_manager(monkeypatch)
    keep = manager.memalloc(100)
    assert device.loads == []                       # defrag off: no compile
    manager.pool.configure(defrag=True)
    keep2 = manager.memalloc(100)
    assert device.loads == [(True, True)]
    del keep, keep2


def test_defragmentation_is_refused_until_the_kernel_is_loaded(monkeypatch):
    import gc

    import numba_alloc
    from numba_alloc.policy.errors import DefragmentationRefused
    manager, device = _kernel_manager(monkeypatch, error="the copy kernel could not be loaded: X")
    pointers = [manager.memalloc(128 << 10) for _ in range(4)]
    pointers[0] = None
    gc.collect()
    with pytest.raises(DefragmentationRefused, match="not loaded yet"):
        manager.pool.defragment()
    with pytest.raises(DefragmentationRefused, match="could not be loaded: X"):
        numba_alloc.defragment(manager.pool)        # loads first, outside the lock
    assert device.loads == [(True, True)]
    device._error = None
    assert numba_alloc.defragment(manager.pool).blocks_moved >= 0
    assert len(device.loads) == 2


class _SmallRangeDevice(_KernelDevice):
    """A _KernelDevice that reserves at most 8 MiB of addresses at once
    (the pool's range for expandable segments is then 8 MiB)."""

    def reserve_addresses(self, nbytes):
        from numba_alloc.policy.backend import DeviceOutOfMemory
        if nbytes > 8 << 20:
            raise DeviceOutOfMemory(f"no {nbytes} bytes of addresses")
        return super().reserve_addresses(nbytes)


def test_an_ipc_export_whose_block_another_thread_reclaims_meanwhile_loads_the_kernel(
        monkeypatch):
    """Expandable segments, reclaim on, defrag off (the copy kernel not
    loaded): an export of a block in a segment of its own (the 8 MiB range
    was full when it was made) read its segment, saw no mapped pages and
    loaded no copy kernel; another thread's request then reclaimed the
    block and emptied the cache before the export pinned it, and the pin
    brought it back into the range's pages, whence it must move: the export
    was refused (DefragmentationRefused: the copy kernel is not loaded
    yet). The schedule is forced: the other thread runs between the read
    and the pin. The kernel now loads first and the block moves."""
    import threading

    import numpy as np
    from numba_alloc.plugin import activity, emm
    mib = 1 << 20
    device = _SmallRangeDevice(1 << 30)
    monkeypatch.setattr(emm, "CudaDevice", lambda context: device)
    manager = emm.NumbaAllocManager(context=_Context())
    pool = device.pool = manager.initialize()
    pool.configure(expandable_segments=True, reclaim=True, limit="12MiB")
    try:
        first, second = pool.malloc(4 * mib), pool.malloc(4 * mib)     # the range's pages
        mem = manager.memalloc(4 * mib)                                 # a segment of its own
        block = mem.block
        with pool.use(block):
            device.write(block.address, np.full(block.size, 7, np.uint8))
        pool.free(first)
        pool.empty_cache()
        with pool.use(second):      # the export's block is the least recently used
            pass
        assert not block.segment.mapped and pool.maps_pages and device.loads == []
        _exporting(monkeypatch, [pool])
        read, pressed = threading.Barrier(2), threading.Barrier(2)
        pin_for_export, seen = pool.pin_for_export, []

        def pin_after_the_other_thread(block):
            read.wait()             # the export has read the block's segment
            pressed.wait()          # the other thread has reclaimed it
            return pin_for_export(block)

        def pressure():
            try:
                read.wait()
                pool.free(pool.malloc(8 * mib))     # reclaims the block, ...
                seen.append(pool.is_resident(block))
                pool.empty_cache()                  # ... and gives its segment back
            except BaseException as e:      # noqa: BLE001 - the test sees it in seen
                seen.append(e)
            finally:
                try:
                    pressed.wait()
                except threading.BrokenBarrierError:    # the export ended first
                    pass
        monkeypatch.setattr(pool, "pin_for_export", pin_after_the_other_thread)
        thread = threading.Thread(target=pressure)
        thread.start()
        try:
            handle = manager.get_ipc_handle(mem)
        finally:
            read.abort()
            pressed.abort()
            thread.join()
        assert seen == [False] and len(device.loads) == 1
        assert block.pinned == 1 and not block.segment.mapped
        assert handle.handle == ("ipc", block.segment.address)
        device.synchronize()
        assert (device.read(block.address, block.size) == 7).all()
    finally:
        pool.configure(reclaim=False)       # the launch hooks go: they are process-wide
    assert not activity.installed()


def test_a_failed_load_is_kept_and_the_backend_never_compiles_in_copy(stand_in_gpu, monkeypatch):
    from numba_alloc.device import kernels
    _, manager = stand_in_gpu
    backend = manager.pool.backend

    def no_nvvm():
        raise RuntimeError("libNVVM is not available")
    monkeypatch.setattr(kernels, "gpu_copy_moves", no_nvvm)
    error = backend.load_copy_kernel()
    assert error == backend.copy_error and "libNVVM is not available" in error
    assert not backend.copy_ready
    with pytest.raises(RuntimeError, match="not loaded"):
        backend.copy([], 1)


def test_the_warm_up_launch_has_the_compiled_signature(stand_in_gpu, monkeypatch):
    from numba.cuda.cudadrv import devicearray
    from numba.cuda.typing.typeof import Purpose, typeof
    from numba.cuda.core import sigutils

    from numba_alloc.device import kernels
    _, manager = stand_in_gpu
    backend = manager.pool.backend
    monkeypatch.setattr(devicearray.devices, "get_context", lambda: manager.context)
    launches = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args: launches.append(tuple(typeof(a, Purpose.argument) for a in args))

    monkeypatch.setattr(kernels, "gpu_copy_moves", Kernel)
    assert backend.load_copy_kernel() is None and backend.copy_ready
    assert launches == [sigutils.normalize_signature(kernels.COPY_MOVES_SIGNATURE)[0]]


class _Dispatcher:
    """Stands in for a copy kernel's dispatcher, which Numba ties to the
    context of its first launch for good; ``fail`` makes launches raise."""
    built = []
    fail = None

    def __init__(self):
        _Dispatcher.built.append(self)

    def __getitem__(self, grid):
        def launch(*args):
            if _Dispatcher.fail:
                raise RuntimeError(_Dispatcher.fail)
        return launch


@pytest.fixture
def dispatchers(stand_in_gpu, monkeypatch):
    """The _Dispatchers kernels.gpu_copy_moves builds (as cuda.jit), over
    stand_in_gpu."""
    from numba.cuda.cudadrv import devicearray

    from numba_alloc.device import kernels
    driver, _ = stand_in_gpu
    monkeypatch.setattr(devicearray.devices, "get_context", driver.context)
    monkeypatch.setattr(kernels.cuda, "jit", lambda signature, cache: lambda fn: _Dispatcher())
    monkeypatch.setattr(_Dispatcher, "built", [])
    monkeypatch.setattr(_Dispatcher, "fail", None)
    return _Dispatcher.built


def test_a_reset_refuses_to_move_until_a_new_kernel_is_loaded(stand_in_gpu, dispatchers):
    from numba_alloc.policy.errors import DefragmentationRefused
    _, manager = stand_in_gpu
    pool = manager.pool
    backend = pool.backend
    assert backend.load_copy_kernel() is None and backend.load_copy_kernel() is None
    assert len(dispatchers) == 1            # loaded: launched again, not built again
    pool.relocator.pin_unmovable(pool)
    manager.reset()                         # Numba's Context.reset(): its modules are unloaded
    assert not backend.copy_ready
    with pytest.raises(DefragmentationRefused, match="not loaded yet"):
        pool.relocator.pin_unmovable(pool)
    _Dispatcher.fail = "CUDA_ERROR_OUT_OF_MEMORY"
    assert "CUDA_ERROR_OUT_OF_MEMORY" in backend.load_copy_kernel()
    assert len(dispatchers) == 2 and not backend.copy_ready    # a failed load keeps nothing
    with pytest.raises(DefragmentationRefused, match="CUDA_ERROR_OUT_OF_MEMORY"):
        pool.relocator.pin_unmovable(pool)
    with pytest.raises(RuntimeError, match="not loaded"):
        backend.copy([], 1)
    _Dispatcher.fail = None
    assert backend.load_copy_kernel() is None
    assert len(dispatchers) == 3 and backend._kernel is dispatchers[2]
    pool.relocator.pin_unmovable(pool)


def test_a_failed_launch_of_a_loaded_kernel_drops_it(stand_in_gpu, dispatchers):
    _, manager = stand_in_gpu
    backend = manager.pool.backend
    assert backend.load_copy_kernel() is None
    _Dispatcher.fail = "CUDA_ERROR_INVALID_HANDLE"
    assert "CUDA_ERROR_INVALID_HANDLE" in backend.load_copy_kernel()
    assert not backend.copy_ready
    _Dispatcher.fail = None
    assert backend.load_copy_kernel() is None and backend._kernel is dispatchers[1]


def test_a_new_context_gets_a_new_kernel(stand_in_gpu, dispatchers):
    from numba_alloc.plugin import emm
    driver, manager = stand_in_gpu
    assert manager.pool.backend.load_copy_kernel() is None
    context = _StandInContext(driver, handle=9)         # as after cuda.close()
    driver.stack.append(context.handle)
    second = emm.NumbaAllocManager(context=context)
    second.initialize()
    assert second.pool.backend.load_copy_kernel() is None
    assert second.pool.backend._kernel is dispatchers[1] is not dispatchers[0]


def test_no_launch_warns_of_low_occupancy(stand_in_gpu, monkeypatch):
    """Numba warns at a grid of few blocks; ``-W error`` would make the
    warm-up raise and refuse defragmentation."""
    import warnings

    from numba.cuda.cudadrv import devicearray
    from numba.cuda.dispatcher import _LaunchConfiguration, normalize_kernel_dimensions

    from numba_alloc.device import kernels
    from numba_alloc.device.kernels import launch_config
    driver, manager = stand_in_gpu
    monkeypatch.setattr(devicearray.devices, "get_context", driver.context)

    class Kernel:
        def __getitem__(self, grid):            # Numba's own check of the grid
            _LaunchConfiguration(self, *normalize_kernel_dimensions(*grid), 0, 0)
            return lambda *args: None

    monkeypatch.setattr(kernels, "gpu_copy_moves", Kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manager.pool.backend.load_copy_kernel() is None
        for chunks in (0, 1, 127, 128, 4096):
            for resident in (None, 96, 1056):
                Kernel()[launch_config(chunks, resident)]


def test_a_block_moves_only_once_its_pointer_is_registered(monkeypatch):
    import numpy as np

    from numba_alloc.policy import defrag
    from numba_alloc.policy.core import ROW_MASK
    manager, _ = _manager(monkeypatch)
    pool = manager.pool
    mem = manager.memalloc(1000)
    (registered,) = manager.allocations    # the manager's block -> pointer entries
    assert pool.relocator.movable(registered)
    in_flight = pool.malloc(1000)          # as memalloc between pool.malloc and storing its pointer
    assert not pool.relocator.movable(in_flight)
    rows = np.array([block._ticket & ROW_MASK for block in (registered, in_flight)], np.int64)
    assert pool.relocator.movable_blocks(pool._handles, rows).tolist() == [True, False]
    layout = defrag._layout(pool, registered.segment.kind)     # what the planner may move
    fixed = dict(zip(layout.address.tolist(), layout.fixed.tolist()))
    assert (fixed[registered.address], fixed[in_flight.address]) == (0, 1)
    pool.free(in_flight)
    del mem
