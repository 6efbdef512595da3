"""Frees that arrive from garbage-collector finalizers: they may run in the
middle of a pool operation (any allocation can start a collection) or on a
thread that holds a lock another thread waits on inside the pool."""

import gc
import threading

import numpy as np
import pytest
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.policy import core

from invariants import check
from test_emm import _manager


class Cycle:
    """A device array only the cyclic garbage collector frees."""

    def __init__(self, manager, nbytes):
        self.array = DeviceNDArray((nbytes,), (1,), np.dtype(np.uint8),
                                   gpu_data=manager.memalloc(nbytes))
        self.me = self


def test_a_collection_inside_a_pool_operation_frees_safely(monkeypatch):
    manager, _ = _manager(monkeypatch)
    pool = manager.pool
    before = compat.memory_allocated(pool)
    first = manager.memalloc(512)
    x = manager.memalloc(512)
    garbage = [Cycle(manager, 512)]            # the block right after x
    del first
    pool.synchronize()                         # [free][x][cycle's block]...
    del x                                      # x pending
    retire = core.retire

    def collecting_retire(*args):              # inside _retire(x): handles dead, not yet relinked
        if garbage:                            # (the compiled relink itself runs no Python)
            garbage.clear()
            gc.collect()
        return retire(*args)

    gc.disable()
    try:
        monkeypatch.setattr(core, "retire", collecting_retire)
        pool.synchronize()
        monkeypatch.setattr(core, "retire", retire)
    finally:
        gc.enable()
    assert not garbage
    assert compat.memory_allocated(pool) == before   # the cycle's block was freed too
    check(pool)


def test_a_finalizer_never_waits_for_the_pool_lock():
    pool = Pool(SimulatedDevice(1 << 30))
    block = pool.malloc(100)
    from numba_alloc.plugin.emm import _free_block
    finalizer = _free_block(pool, block, {})
    done = threading.Event()
    with pool.lock:                            # another thread is inside the pool
        thread = threading.Thread(target=lambda: (finalizer(), done.set()))
        thread.start()
        assert done.wait(5), "the finalizer blocked on the pool's lock"
    thread.join()
    assert compat.memory_allocated(pool) == 0        # freed at the next read
    check(pool)


READS = {
    "memory_allocated": compat.memory_allocated,
    "get_bytes_in_use": compat.get_bytes_in_use,
    "get_num_allocs": compat.get_num_allocs,
    "get_bytes_reclaimed": compat.get_bytes_reclaimed,
    "reset_peak_memory_stats": compat.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": compat.reset_accumulated_memory_stats,
    "memory_stats": Pool.memory_stats,
    "snapshot": Pool.snapshot,
    "synchronize": Pool.synchronize,
    "peak": lambda pool: pool.peak("active_bytes"),
    "current, retiring": lambda pool: pool.current("active_bytes", retire_completed=True),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_every_read_sees_the_finalizers_frees(read):
    pool = Pool(SimulatedDevice(1 << 30))
    block = pool.malloc(100)
    pool.free_later(block)
    read(pool)
    assert pool.stats.current("allocated_bytes") == 0


def test_a_launch_and_a_defragmentation_on_two_threads_do_not_deadlock(monkeypatch):
    """Up to Python 3.11 cached_property locks every instance while computing;
    a launch computes a pool array's shim (taking the pool's lock) while a
    defragmentation, holding the pool's lock, launches on its scratch arrays."""
    from numba.cuda.cudadrv.driver import MemoryPointer, binding
    manager, _ = _manager(monkeypatch)
    pool = manager.pool
    ours = DeviceNDArray((1024,), (4,), np.dtype(np.float32), gpu_data=manager.memalloc(4096))
    scratch = DeviceNDArray((1024,), (1,), np.dtype(np.uint8),
                            gpu_data=MemoryPointer(None, binding.CUdeviceptr(1 << 40), 1024))
    in_pool_lock, launching, done = threading.Event(), threading.Event(), []

    def defragmentation():
        with pool.lock:
            in_pool_lock.set()
            launching.wait(5)
            threading.Event().wait(0.2)        # the launch is now inside the property
            scratch._strided_memory_view_shim
        done.append("defragmentation")

    def launch():
        in_pool_lock.wait(5)
        launching.set()
        ours._strided_memory_view_shim
        done.append("launch")

    threads = [threading.Thread(target=f, daemon=True) for f in (defragmentation, launch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(done) == ["defragmentation", "launch"], "deadlock"


class _Buffer:
    """cuda-core's Buffer as staging uses it: made over a pool block's
    address, owned by ``mr``, whose deallocate runs when it is closed
    (or collected)."""

    def __init__(self, ptr, size, mr):
        self.handle, self.size, self._mr = ptr, size, mr

    @classmethod
    def from_handle(cls, ptr, size, mr=None, owner=None, *, stream=None):
        return cls(ptr, size, mr)

    def close(self):
        mr, self._mr = self._mr, None
        if mr is not None:
            mr.deallocate(self.handle, self.size, stream=None)


def test_a_staged_buffer_that_outlives_its_context_frees_nothing_of_the_next_one(monkeypatch):
    """numba-cuda's staged copies of a launch's host arrays: a buffer kept
    past cuda.close() (a traceback's frame holds it) is closed later, when
    the next context's pool has staged a live buffer at the same address
    (a fresh context's allocations land where the last one's did): it must
    not unstage that one, which is still in use."""
    from types import SimpleNamespace

    from numba.cuda.cudadrv import devicearray, devices

    from numba_alloc.plugin import staging
    context = SimpleNamespace(memory_manager=SimpleNamespace(is_numba_alloc=True, pool=None))
    monkeypatch.setattr(devices, "get_context", lambda *args: context)
    monkeypatch.setattr(devicearray, "Buffer", _Buffer)
    resource = staging.PoolMemoryResource(0, None)
    context.memory_manager.pool = first = Pool(SimulatedDevice(1 << 30))
    old = resource.allocate(4096)
    first.reset()                                # cuda.close(): a new context, a new pool
    context.memory_manager.pool = second = Pool(SimulatedDevice(1 << 30))
    new = resource.allocate(4096)
    assert new.handle == old.handle              # the same address, another pool's block
    old.close()                                  # the old buffer goes at last
    assert second.current("staged_bytes") == compat.memory_allocated(second) == 4096
    new.close()
    assert second.current("staged_bytes") == compat.memory_allocated(second) == 0
    check(second)
