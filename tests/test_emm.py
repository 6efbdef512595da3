"""The Numba plugin's parts that run without a GPU."""

import os
import subprocess
import sys

import pytest

from numba_alloc import Pool, SimulatedDevice


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
    from numba_alloc.emm import _free_block
    pool = Pool(SimulatedDevice(1 << 30))
    a, b = pool.malloc(100), pool.malloc(100)
    _free_block(pool, a, {})()
    assert pool.memory_allocated() == 512
    pool.reset()
    _free_block(pool, b, {})()      # after reset: no error, nothing changes
    assert pool.memory_allocated() == 0


def test_package_imports_under_the_cuda_simulator():
    code = ("import numba_alloc\n"
            "pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(1 << 20))\n"
            "print(pool.malloc(10).allocated_size)\n"
            "try:\n    numba_alloc.install()\nexcept RuntimeError as e:\n    print(e)\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "512"
    assert "simulator" in out.stdout


class _Device:
    id = 0


class _Context:
    """Stands in for Numba's Context: the manager reads only ``device``
    before it builds its backend, which the test replaces."""
    device = _Device()


def _manager(monkeypatch):
    from numba_alloc import emm
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
    assert mem.size == 4000 and pool.memory_allocated() == 4096
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
    assert pool.memory_allocated() == 4096          # v2 still holds the block
    del v2
    gc.collect()
    assert pool.memory_allocated() == 0
    assert not manager.allocations                  # the manager let the pointer go


def test_manager_memory_info_defer_cleanup_and_reset(monkeypatch):
    import gc
    manager, device = _manager(monkeypatch)
    pool = manager.pool
    keep = manager.memalloc(100)
    with manager.defer_cleanup():
        gone = manager.memalloc(MiB := 1 << 20)
        del gone
        gc.collect()
        assert pool.get_bytes_active() == 512 + MiB   # held back while deferred
    assert pool.get_bytes_active() == 512
    free, total = manager.get_memory_info()
    assert total == device.capacity
    assert free == device.memory_info()[0] + pool.get_bytes_inactive()
    manager.reset()
    assert pool.memory_reserved() == 0 and not manager.allocations
    del keep
    gc.collect()                                    # its finalizer runs after the reset
    assert pool.memory_allocated() == 0


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
    manager.pool.relocator.prepare(manager.pool)
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


def test_initialize_builds_one_pool_when_numba_calls_it_again_from_inside(monkeypatch):
    from numba_alloc import emm
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


def test_launch_caches_of_other_memory_are_numbas_own(monkeypatch):
    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import MemoryPointer, binding

    from numba_alloc.relocation import MovableShim
    manager, _ = _manager(monkeypatch)
    foreign = MemoryPointer(None, binding.CUdeviceptr(1 << 40), 4096)
    array = DeviceNDArray((1024,), (4,), np.dtype(np.float32), gpu_data=foreign)
    shim = array._strided_memory_view_shim
    assert shim.ptr == 1 << 40 and not isinstance(shim, MovableShim)
    ours = DeviceNDArray((1024,), (4,), np.dtype(np.float32), gpu_data=manager.memalloc(4096))
    assert isinstance(ours._strided_memory_view_shim, MovableShim)
