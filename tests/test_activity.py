"""Reclaim under the Numba plugin, without a GPU: Numba's own arrays, views,
copies and kernel-launch argument preparation over a manager whose pool is
on the simulated device. Stood in: the kernel (a launch prepares its
arguments with Numba's real ``_Kernel._prepare_args`` and then runs a NumPy
function over the addresses it read), the driver's four copy functions and
the context check (all over the simulated device's memory). The hooks under
test (numba_alloc.plugin.activity) wrap these stand-ins exactly as they wrap
Numba's own functions."""

import contextlib
import gc
import random
import threading
import types

import numpy as np
import pytest
from numba import typeof
from numba.cuda import dispatcher
from numba.cuda.cudadrv import devices
from numba.cuda.cudadrv import driver as numba_driver
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from numba_alloc import OutOfMemoryError, SimulatedDevice
from numba_alloc.plugin import activity
from numba_alloc.policy import reclaim
from numba_alloc.plugin.relocation import block_of
from numba_alloc.policy.block import ALLOCATED

from invariants import check

MiB = 1 << 20
ORIGINAL_LAUNCH = dispatcher._Kernel.__dict__["launch"]


class StandInKernel:
    """What a launch needs of a Numba kernel: its argument preparation (Numba's
    own, with ``extensions``) and a body ``run(kernel, arrays)`` over NumPy
    views of the device memory at the addresses the preparation read for the
    top-level device arrays; ``kernel.kernelargs`` holds everything it read.
    ``argument_types``: as Numba's kernel has them (None: each argument's
    typeof)."""
    _prepare_args = dispatcher._Kernel._prepare_args

    def __init__(self, run, argument_types=None, extensions=()):
        self.run, self.argument_types, self.extensions = run, argument_types, list(extensions)


def stand_in_launch(device):
    def launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
        retr, kernelargs, arrays = [], [], []
        for i, value in enumerate(args):
            if isinstance(value, np.ndarray):
                continue                    # a host array: Numba copies it with cuda-core
            try:
                ty = self.argument_types[i] if self.argument_types else typeof(value)
            except ValueError:
                continue                    # nothing Numba could pass
            start = len(kernelargs)
            self._prepare_args(ty, value, stream, retr, kernelargs)
            if getattr(value, "__cuda_memory__", False):
                # an array's arguments: meminfo, parent, size, itemsize, address, shape..., strides...
                size, itemsize, address = kernelargs[start + 2: start + 5]
                device.synchronize()        # the GPU runs queued copies before the kernel
                arrays.append(device.view(address, size * itemsize).view(value.dtype))
        self.kernelargs = kernelargs
        self.run(self, arrays)
        for writeback in retr:
            writeback()
    return launch


def stand_in_copies(device):
    def host_to_device(dst, src, size, stream=0):
        device.synchronize()
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)[:size]
        device.write(numba_driver.device_pointer(dst), data)

    def device_to_host(dst, src, size, stream=0):
        device.synchronize()
        dst.reshape(-1).view(np.uint8)[:size] = device.read(numba_driver.device_pointer(src),
                                                           size)

    def device_to_device(dst, src, size, stream=0):
        device.synchronize()
        data = device.read(numba_driver.device_pointer(src), size)
        device.write(numba_driver.device_pointer(dst), data)

    def device_memset(dst, val, size, stream=0):
        device.synchronize()
        device.write(numba_driver.device_pointer(dst), np.full(size, val, np.uint8))

    return {f.__name__: f for f in (host_to_device, device_to_host, device_to_device,
                                    device_memset)}


def plugin(monkeypatch):
    """(device, manager, pool): Numba's plugin over a 64 MiB simulated device,
    with the stand-ins in place."""
    from numba_alloc.plugin import emm
    assert activity.unsupported_reason() is None
    device = SimulatedDevice(64 * MiB)
    monkeypatch.setattr(emm, "CudaDevice", lambda context: device)
    monkeypatch.setattr(dispatcher._Kernel, "launch", stand_in_launch(device))
    for name, copy in stand_in_copies(device).items():
        monkeypatch.setattr(numba_driver, name, copy)
    monkeypatch.setattr(devices._runtime, "ensure_context", contextlib.nullcontext)

    def memset(pointer, byte, count=None, stream=0):
        device.synchronize()
        device.write(pointer.device_ctypes_pointer.value,
                     np.full(pointer.size if count is None else count, byte, np.uint8))
    monkeypatch.setattr(numba_driver.MemoryPointer, "memset", memset)

    class Context:
        class device:
            id = 0
            _dev = types.SimpleNamespace(memory_resource=None)     # cuda-core's Device

    manager = emm.NumbaAllocManager(context=Context())
    return device, manager, manager.initialize()


@pytest.fixture
def numba_pool(monkeypatch):
    """plugin()'s (device, manager, pool) with reclaim on; the hooks are
    removed again at the end."""
    device, manager, pool = plugin(monkeypatch)
    pool.configure(reclaim=True)
    yield device, manager, pool
    gc.collect()                        # the test's arrays: freed at the next pool call
    pool.synchronize()
    pool.configure(reclaim=False)
    assert not activity.installed()


def array(manager, value, nbytes=15 * MiB):
    """A float32 DeviceNDArray of the pool, filled with ``value``."""
    a = DeviceNDArray((nbytes // 4,), (4,), np.dtype(np.float32), gpu_data=manager.memalloc(nbytes))
    a.copy_to_device(np.full(a.shape, value, np.float32))
    return a


def launch(run, *args):
    dispatcher._Kernel.launch(StandInKernel(run), args, 1, 1)


class PendingAtStart:
    """An argument extension noting, as a launch starts preparing its
    arguments, how much work is still queued on ``device``."""

    def __init__(self, device):
        self.device, self.queued = device, []

    def prepare_args(self, ty, val, stream, retr):
        self.queued.append(self.device.pending_work)
        return ty, val


def second_pool(monkeypatch):
    """(manager, pool) of the plugin on a second device (id 1, a 64 MiB
    simulated one), reclaim on."""
    from numba_alloc.plugin import emm
    second = SimulatedDevice(64 * MiB)
    monkeypatch.setattr(emm, "CudaDevice", lambda context: second)

    class Context:
        class device:
            id = 1
            _dev = types.SimpleNamespace(memory_resource=None)     # cuda-core's Device

    manager = emm.NumbaAllocManager(context=Context())
    pool = manager.initialize()
    pool.configure(reclaim=True)
    return manager, pool


def resident(pool, a):
    return pool.is_resident(block_of(a.gpu_data))


def test_the_hooks_are_in_only_while_a_numba_pool_reclaims(numba_pool):
    _, _, pool = numba_pool
    hooked = dispatcher._Kernel.__dict__["launch"]
    assert activity.installed()
    pool.configure(reclaim=False)
    assert not activity.installed()
    assert dispatcher._Kernel.__dict__["launch"] is hooked.__wrapped__     # the stand-in
    pool.configure(reclaim=True)
    assert dispatcher._Kernel.__dict__["launch"].__wrapped__ is hooked.__wrapped__


def test_only_a_pool_whose_blocks_the_hooks_watch_keeps_a_launchs_arrays_in_place(numba_pool):
    # the hooks are in for this pool's reclaim; another pool's (reclaim off)
    # launch arrays are not watched, so its staging may not move blocks
    from numba_alloc import Pool
    _, _, pool = numba_pool
    other = Pool(SimulatedDevice(64 * MiB), defrag=True)
    assert activity.installed()
    assert activity.keeps_in_place(pool) and not activity.keeps_in_place(other)
    pool.configure(reclaim=False)
    assert not activity.keeps_in_place(pool)
    pool.configure(reclaim=True)                    # for the fixture's end


def test_arrays_still_in_host_memory_come_back_after_reclaim_is_turned_off(numba_pool):
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    gone = [i for i, a in enumerate(arrays) if not resident(pool, a)]
    pool.configure(reclaim=False)
    assert activity.installed()                     # the hooks stay for them
    for i in range(len(arrays)):                    # room for them: nothing is reclaimed now
        if i not in gone:
            arrays[i] = None
    gc.collect()
    seen = []
    launch(lambda kernel, views: seen.extend(float(v[0]) for v in views),
           *(arrays[i] for i in gone[:2]))
    assert seen == [float(i) for i in gone[:2]]
    for i in gone[2:]:
        assert (arrays[i].copy_to_host() == i).all()
    assert not pool._residency.reclaimed and not activity.installed()   # the last came back
    pool.configure(reclaim=True)                    # for the fixture's end
    check(pool)


def test_a_pool_made_with_reclaim_on_installs_the_hooks(monkeypatch):
    from numba_alloc.plugin import registry
    monkeypatch.setattr(registry, "_pools", {})
    monkeypatch.setattr(registry, "_device_settings", {0: {"reclaim": True}})
    _, _, pool = plugin(monkeypatch)          # as NUMBA_ALLOC_CONF=reclaim:true makes it
    assert pool.settings().reclaim and activity.installed()
    pool.configure(reclaim=False)
    assert not activity.installed()


def test_a_launch_brings_back_every_argument_together_and_protects_them(numba_pool):
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]       # 8 x 15 MiB on 64 MiB
    gone = [a for a in arrays if not resident(pool, a)]
    assert len(gone) >= 4
    chosen = gone[:3]
    seen = {}

    def run(kernel, views):
        blocks = [block_of(a.gpu_data) for a in chosen]
        seen["resident"] = all(pool.is_resident(b) for b in blocks)
        seen["active"] = all(b in pool._residency.active for b in blocks)
        seen["addresses"] = [v.ctypes.data for v in views] == [
            device.view(b.address, 1).ctypes.data for b in blocks]
        seen["values"] = [float(v[12345]) for v in views]
        other = manager.memalloc(15 * MiB)          # room taken from the others, not these
        seen["kept"] = all(pool.is_resident(b) for b in blocks)
        for v in views:
            v += 100
        del other

    launch(run, *chosen)
    index = {id(a): i for i, a in enumerate(arrays)}
    assert seen == {"resident": True, "active": True, "addresses": True, "kept": True,
                    "values": [float(index[id(a)]) for a in chosen]}
    check(pool)
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i + 100 * any(a is c for c in chosen)).all()
    check(pool)


def test_arrays_in_namedtuples_or_made_by_an_extension_come_back_before_numba_reads_them(
        numba_pool):
    import collections

    from numba import types
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    gone = [a for a in arrays if not resident(pool, a)][:3]
    stale = {block_of(a.gpu_data).address for a in gone}
    Pair = collections.namedtuple("Pair", "x y")

    class Wrapped:                       # what an argument extension unwraps
        def __init__(self, array):
            self.array = array

    class Unwrap:
        def prepare_args(self, ty, val, stream, retr):
            return (typeof(val.array), val.array) if isinstance(val, Wrapped) else (ty, val)

    seen = {}

    def run(kernel, views):
        blocks = [block_of(a.gpu_data) for a in gone]
        seen["active"] = [b in pool._residency.active for b in blocks]
        seen["addresses"] = [b.address in kernel.kernelargs for b in blocks]

    kernel = StandInKernel(run, argument_types=[typeof(Pair(gone[0], gone[1])), types.float32[:]],
                           extensions=[Unwrap()])
    dispatcher._Kernel.launch(kernel, (Pair(gone[0], gone[1]), Wrapped(gone[2])), 1, 1)
    assert seen == {"active": [True] * 3, "addresses": [True] * 3}
    assert not stale & set(kernel.kernelargs) - {block_of(a.gpu_data).address for a in arrays}
    assert not pool._residency.active
    check(pool)


def test_pool_arrays_are_found_among_any_arguments(numba_pool):
    from numba import cuda
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    gone = [a for a in arrays if not resident(pool, a)][:3]

    class Tree:                        # a foreign object with attributes named as ours
        root = block = _view = "not memory"

    seen = []

    def run(kernel, views):
        seen.extend(block_of(a.gpu_data) in pool._residency.active for a in gone)

    launch(run, 3, 2.5, np.ones(4), Tree(), cuda.In(gone[0]), (gone[1], (1, gone[2][100:])))
    assert seen == [True, True, True]
    assert all(resident(pool, a) for a in gone) and not pool._residency.active
    check(pool)


def test_a_workload_three_times_the_pool_runs_on_numba_arrays(numba_pool):
    device, manager, pool = numba_pool
    n, per = 12, 15 * MiB                                # 180 MiB on 64 MiB
    arrays = [array(manager, i) for i in range(n)]
    model = [np.full(per // 4, i, np.float32) for i in range(n)]
    rng = random.Random(3)

    def add(kernel, views):
        views[-1][:] = (sum(views[:-1]) + views[-1]) % 1000

    for step in range(30):
        chosen = rng.sample(range(n), rng.choice([1, 2, 3]))
        launch(add, *(arrays[i] for i in chosen))
        model[chosen[-1]] = sum(model[i] for i in chosen) % 1000
        if step % 5 == 0:
            i = rng.randrange(n)
            assert arrays[i][7] == model[i][7]                   # indexing
            j = rng.randrange(n)
            window = arrays[j][1000:2000]                        # a view
            assert (window.copy_to_host() == model[j][1000:2000]).all()
            k = rng.randrange(n)
            arrays[k][10:20].copy_to_device(np.arange(10, dtype=np.float32))
            model[k][10:20] = np.arange(10)
        check(pool)
    for a, expected in zip(arrays, model):
        assert (a.copy_to_host() == expected).all()
    stats = check(pool)["stats"]
    assert stats["reclaimed_bytes.allocated"] >= 8 * per


def test_arrays_numba_makes_during_a_launch_stay_with_it(numba_pool):
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(4)]       # the pool is full
    seen = {}

    def run(kernel, views):
        # as _prepare_args copying a host array to the device: a new pool array
        copy = DeviceNDArray((per := 15 * MiB // 4,), (4,), np.dtype(np.float32),
                             gpu_data=manager.memalloc(15 * MiB))
        block = block_of(copy.gpu_data)
        seen["active"] = block in pool._residency.active
        more = manager.memalloc(15 * MiB)                # must reclaim: not the copy
        seen["kept"] = pool.is_resident(block) and pool.is_resident(block_of(arrays[0].gpu_data))
        del more, per

    launch(run, arrays[0])
    assert seen == {"active": True, "kept": True}
    assert not pool._residency.active
    check(pool)


def test_a_launch_whose_arguments_cannot_all_be_resident_changes_nothing(numba_pool):
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(7)]       # 105 MiB on 64 MiB
    before = [resident(pool, a) for a in arrays]
    stats = pool.memory_stats()
    ran = []
    with pytest.raises(OutOfMemoryError):
        launch(lambda kernel, views: ran.append(1), *arrays[:6])    # 90 MiB: never fits
    assert not ran and not pool._residency.active
    assert [resident(pool, a) for a in arrays] == before          # the seventh too
    changed = {k: (v, stats[k]) for k, v in pool.memory_stats().items() if stats[k] != v}
    assert changed == {"num_ooms": (stats["num_ooms"] + 1, stats["num_ooms"])}
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all()
    check(pool)


def test_reading_an_address_or_pinning_brings_an_array_back(numba_pool):
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    gone = [a for a in arrays if not resident(pool, a)]
    address = gone[0].device_ctypes_pointer.value
    assert resident(pool, gone[0]) and address == block_of(gone[0].gpu_data).address
    interface = gone[1].__cuda_array_interface__["data"][0]     # pins: it stays
    assert resident(pool, gone[1]) and block_of(gone[1].gpu_data).pinned
    assert interface == block_of(gone[1].gpu_data).address
    gone[2].gpu_data.memset(7)                                   # a pointer's memset
    assert resident(pool, gone[2])
    assert (gone[2].copy_to_host().view(np.uint8) == 7).all()
    arrays.append(array(manager, 9, 30 * MiB))               # pressure: the pinned one stays
    assert resident(pool, gone[1])
    assert (gone[1].copy_to_host() == [i for i, a in enumerate(arrays) if a is gone[1]]).all()
    check(pool)


class _LockSpy:
    """The pool's lock, noting when the thread named ``reader`` comes to it."""

    def __init__(self, lock, reader):
        self.lock, self.reader, self.waiting = lock, reader, threading.Event()

    def __enter__(self):
        if threading.current_thread().name == self.reader:
            self.waiting.set()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_reading_the_interface_while_another_thread_brings_the_array_back(numba_pool,
                                                                           monkeypatch):
    """A bring-back on one thread is held where the handle changes from
    reclaimed to resident; the handle reads as live there, and a reader of
    its ``__cuda_array_interface__`` on another thread waits for the lock,
    then pins the block and gets its new address (it used to read the
    block as dead in that window, skip the pin and get the parked 0)."""
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(6)]
    gone = next(a for a in arrays if not resident(pool, a))
    block = block_of(gone.gpu_data)
    spy = _LockSpy(pool._lock, "reader")
    monkeypatch.setattr(pool, "_lock", spy)
    seen, got = [], []
    give_back = reclaim.give_back

    def held_give_back(cache, chunks):          # inside the bring-back, under the lock
        give_back(cache, chunks)
        if threading.current_thread().name == "bringer" and not seen:
            seen.append(block.state)
            reader.start()
            spy.waiting.wait()          # the reader is at the lock, or done without it
            seen.append(list(got))

    def read():
        try:
            got.append(gone.__cuda_array_interface__["data"][0])
        finally:
            spy.waiting.set()

    monkeypatch.setattr(reclaim, "give_back", held_give_back)
    reader = threading.Thread(name="reader", target=read)
    bringer = threading.Thread(name="bringer", target=gone.copy_to_host)
    bringer.start()
    bringer.join()
    reader.join()
    assert seen == [ALLOCATED, []]        # live, and the reader waited
    assert got == [block.address] and block.address != 0
    assert block.pinned == 1
    check(pool)


def test_a_launch_records_no_event_and_its_arrays_wait_for_a_synchronize(numba_pool,
                                                                          monkeypatch):
    """A launch's arrays are protected after it by the pool's next device
    synchronization (reclaim synchronizes before it takes them), not by an
    event per launch. A synchronous copy leaves them waiting for the
    launch's work on its stream."""
    device, manager, pool = numba_pool
    a = array(manager, 1)
    block = block_of(a.gpu_data)
    events = []
    with monkeypatch.context() as patch:
        patch.setattr(device, "event", lambda: events.append(1))
        for stream in ("stream 7", 0):
            dispatcher._Kernel.launch(StandInKernel(lambda kernel, views: None), (a,), 1, 1,
                                      stream)
        a.copy_to_host()                                # stream 0: synchronous
    assert events == []
    with pool.lock:
        assert block not in [handle for _, handle in reclaim.victims(pool)]
    others = [array(manager, i) for i in range(5)]      # a goes to host memory, after a
    assert not resident(pool, a)                        # synchronize
    del others
    gc.collect()
    pool.synchronize()                                  # room: a comes back without waiting
    look = PendingAtStart(device)
    dispatcher._Kernel.launch(StandInKernel(lambda kernel, views: None, extensions=[look]),
                              (a,), 1, 1, "stream 7")
    assert resident(pool, a) and look.queued == [0]     # its copy back done before the launch
    check(pool)


class _Stream:
    """A stream object as numba-cuda's launch passes one (cuda-core's):
    ``__cuda_stream__`` gives its handle."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@pytest.mark.parametrize("handle, waits", [(0, False), (1, False), (0x5000, True)])
def test_a_launch_waits_for_copies_back_only_on_a_stream_that_is_not_the_legacy_one(
        numba_pool, handle, waits):
    """numba-cuda passes stream 0 to the launch as a stream object of handle
    0; it and CU_STREAM_LEGACY (1) are the legacy default stream, where the
    copies that brought blocks back are queued: the launch is ordered after
    them without the host waiting. Any other stream waits for them."""
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    x = next(a for a in arrays if not resident(pool, a))
    look = PendingAtStart(device)
    dispatcher._Kernel.launch(StandInKernel(lambda kernel, views: None, extensions=[look]),
                              (x,), 1, 1, _Stream(handle))
    assert resident(pool, x)
    assert (look.queued == [0]) is waits
    assert (pool._residency.arrival is None) is waits
    check(pool)


def test_asking_whether_an_array_is_a_cuda_array_does_not_pin_it(numba_pool):
    from numba import cuda
    device, manager, pool = numba_pool
    a = array(manager, 1)
    assert cuda.is_cuda_array(a) and not block_of(a.gpu_data).pinned   # as @vectorize asks
    assert not cuda.is_cuda_array(np.ones(3))
    a.__cuda_array_interface__                                          # a reader: pinned
    assert block_of(a.gpu_data).pinned == 1


def test_launches_on_several_threads_see_their_arguments_resident(numba_pool):
    device, manager, pool = numba_pool
    arrays = [array(manager, i, 6 * MiB) for i in range(20)]    # 120 MiB on 64 MiB
    problems = []

    def run(kernel, views):
        for a, v in zip(kernel.args, views):
            block = block_of(a.gpu_data)
            if not pool.is_resident(block) or v.ctypes.data != device.view(
                    block.address, 1).ctypes.data:
                problems.append(block)
            v += 1

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(15):
            chosen = tuple(arrays[i] for i in rng.sample(range(len(arrays)), 2))
            kernel = StandInKernel(run)
            kernel.args = chosen
            try:
                dispatcher._Kernel.launch(kernel, chosen, 1, 1)
            except OutOfMemoryError:    # the other threads hold the rest
                pass

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems
    assert not pool._residency.active
    check(pool)


def test_reclaim_is_refused_where_numbas_internals_differ(numba_pool, monkeypatch):
    import numba_alloc
    _, _, pool = numba_pool
    pool.configure(reclaim=False)
    monkeypatch.setattr(activity, "unsupported_reason", lambda: "reclaim under the Numba "
                        "plugin: _Kernel.launch does not prepare its arguments itself")
    with pytest.raises(RuntimeError, match="does not prepare its arguments"):
        pool.configure(reclaim=True)
    with pytest.raises(ValueError, match="does not prepare its arguments"):
        numba_alloc.configure(reclaim=True)
    assert not pool.settings().reclaim and not activity.installed()


def test_the_structural_check_names_what_differs(monkeypatch):
    activity.unsupported_reason.cache_clear()
    try:
        def launch(self, args, griddim, blockdim):
            pass
        monkeypatch.setattr(dispatcher._Kernel, "launch", launch)
        assert "_Kernel.launch" in activity.unsupported_reason()
        activity.unsupported_reason.cache_clear()
        monkeypatch.setattr(dispatcher._Kernel, "launch", ORIGINAL_LAUNCH)

        def host_to_device(dst, src):
            pass
        monkeypatch.setattr(numba_driver, "host_to_device", host_to_device)
        assert "driver.host_to_device" in activity.unsupported_reason()
    finally:
        monkeypatch.undo()
        activity.unsupported_reason.cache_clear()
    assert activity.unsupported_reason() is None


def test_a_reclaimed_arrays_pointers_hold_no_address_until_it_comes_back(numba_pool):
    """Numba's pointer objects of a reclaimed array, and views made of it
    meanwhile, point at the null address (plus their offset): a use that
    bypasses the hooks faults instead of reaching another block's memory.
    The next hooked use brings the array back and every one follows."""
    from numba_alloc.plugin.emm import PARKED
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    i, gone = next((i, a) for i, a in enumerate(arrays) if not resident(pool, a))
    block = block_of(gone.gpu_data)
    raw = gone.gpu_data._view                   # the PoolPointer: read without the hooks
    assert raw.device_pointer_value is None and raw.device_ctypes_pointer.value == PARKED
    tail = gone[1000:]                          # a view made while reclaimed
    assert tail.gpu_data._view.device_pointer_value == PARKED + 4000
    assert not resident(pool, gone)
    assert (tail.copy_to_host() == i).all()     # a hooked use: back, and both follow
    assert resident(pool, gone)
    assert raw.device_pointer_value == block.address != PARKED
    assert tail.gpu_data._view.device_pointer_value == block.address + 4000
    assert raw.device_ctypes_pointer is gone.gpu_data.device_ctypes_pointer
    check(pool)


def test_reclaim_turned_on_mid_launch_waits_for_that_launch_and_then_the_device(monkeypatch):
    """A launch another thread began before reclaim was on read its
    arguments' addresses untracked: reclaim takes nothing while it is being
    issued, then synchronizes the device once, and only then reclaims."""
    device, manager, pool = plugin(monkeypatch)
    arrays = [array(manager, i) for i in range(4)]          # 60 MiB of 64
    inside, go = threading.Event(), threading.Event()

    def run(kernel, views):                 # the launch's work, at the addresses it read
        inside.set()
        go.wait(10)
        views[0] += 100

    worker = threading.Thread(target=launch, args=(run, arrays[0]))
    worker.start()
    try:
        assert inside.wait(10)
        pool.configure(reclaim=True)        # the hooks go in while that launch runs
        assert activity._issuing(activity._unsettled[pool])
        with pytest.raises(OutOfMemoryError):
            manager.memalloc(15 * MiB)          # would reclaim arrays[0] under the launch
        assert all(resident(pool, a) for a in arrays) and pool in activity._unsettled
    finally:
        go.set()
        worker.join()
    more = manager.memalloc(15 * MiB)           # reclaims now, after a synchronize
    assert pool not in activity._unsettled and not all(resident(pool, a) for a in arrays)
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i + 100 * (i == 0)).all()
    del more
    gc.collect()
    pool.synchronize()
    pool.configure(reclaim=False)
    assert not activity.installed()
    check(pool)


def test_a_hooked_launch_is_issuing_only_for_pools_that_turned_reclaim_on_after_it(numba_pool):
    device, manager, pool = numba_pool
    a = array(manager, 1)
    since = activity._unsettled.get(pool, activity._epoch)
    inside, go = threading.Event(), threading.Event()

    def run(kernel, views):
        inside.set()
        go.wait(10)

    worker = threading.Thread(target=launch, args=(run, a))
    worker.start()
    try:
        assert inside.wait(10)
        assert not activity._issuing(since)         # begun through the hooks since: tracked
        assert activity._issuing(activity._epoch + 1)   # not for a pool turned on later
    finally:
        go.set()
        worker.join()
    assert not activity._issuing(activity._epoch + 1)


def test_a_pool_turned_on_later_is_not_held_up_by_launches_begun_since(numba_pool, monkeypatch):
    device, manager, pool = numba_pool              # the hooks are in for this pool
    a = array(manager, 1)
    manager2, pool2 = second_pool(monkeypatch)
    held = [manager2.memalloc(15 * MiB) for _ in range(4)]     # the second device full
    inside, go = threading.Event(), threading.Event()

    def run(kernel, views):                         # a launch on the first pool, meanwhile
        inside.set()
        go.wait(10)

    worker = threading.Thread(target=launch, args=(run, a))
    worker.start()
    try:
        assert inside.wait(10)
        more = manager2.memalloc(15 * MiB)          # reclaims on the second pool at once
        assert sum(pool2.is_resident(block_of(h)) for h in held) == 3
    finally:
        go.set()
        worker.join()
    del more, held
    gc.collect()
    pool2.synchronize()
    pool2.configure(reclaim=False)
    check(pool2)


def test_a_launchs_own_allocation_never_reclaims_what_it_read_before_reclaim_was_on(
        monkeypatch):
    device, manager, pool = plugin(monkeypatch)     # reclaim off: the launch is untracked
    arrays = [array(manager, i) for i in range(4)]  # 60 MiB of 64
    x = arrays[0]
    seen = {}

    class TurnOnAndAllocate:                # runs after Numba read x's address
        def prepare_args(self, ty, val, stream, retr):
            if isinstance(val, float):
                pool.configure(reclaim=True)
                with pytest.raises(OutOfMemoryError):   # reclaim would take x
                    manager.memalloc(15 * MiB)
                seen["resident"] = resident(pool, x)
            return ty, val

    def run(kernel, views):
        seen["read"] = kernel.kernelargs[4]

    dispatcher._Kernel.launch(StandInKernel(run, extensions=[TurnOnAndAllocate()]),
                              (x, 1.0), 1, 1)
    assert seen == {"resident": True, "read": block_of(x.gpu_data).address}
    more = manager.memalloc(15 * MiB)               # the launch is over: reclaim works
    assert not all(resident(pool, a) for a in arrays)
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all()
    del more
    gc.collect()
    pool.synchronize()
    pool.configure(reclaim=False)
    check(pool)


class PassAddress:
    """An argument extension passing an array as its address (a uintp),
    read through DeviceNDArray.device_ctypes_pointer as the launch prepares
    its arguments."""

    def __init__(self, array):
        self.array = array

    def prepare_args(self, ty, val, stream, retr):
        from numba import types
        if val is self:
            return types.uintp, self.array.device_ctypes_pointer.value
        return ty, val


def test_an_address_read_while_a_launch_prepares_joins_the_launch(numba_pool):
    from numba import types
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(4)]          # 60 of 64 MiB
    z = arrays[0]
    with pool.lock:
        assert activity.settle(pool)
    for a in arrays[1:]:
        pool.pin(block_of(a.gpu_data))                      # z is reclaim's only victim
    passing, seen, done = PassAddress(z), {}, []

    def run(kernel, views):
        address = kernel.kernelargs[0].value
        with pytest.raises(OutOfMemoryError):               # z is in use by this launch
            manager.memalloc(15 * MiB)
        block = block_of(z.gpu_data)
        seen.update(resident=pool.is_resident(block), same=block.address == address)

        def work():                                          # the kernel, run later
            block = block_of(z.gpu_data)
            done.append(pool.is_resident(block) and block.address == address)
        device.launch(work)

    kernel = StandInKernel(run, argument_types=[types.uintp], extensions=[passing])
    dispatcher._Kernel.launch(kernel, (passing,), 1, 1, "stream 1")
    assert seen == {"resident": True, "same": True}
    assert not done                                         # its work is still queued
    more = manager.memalloc(15 * MiB)                       # waits for it; then z may go
    assert done == [True] and not resident(pool, z)
    assert (z.copy_to_host() == 0).all()
    del more
    for a in arrays[1:]:
        pool.unpin(block_of(a.gpu_data))
    check(pool)


def test_a_launch_on_another_stream_waits_for_copies_that_brought_its_arrays_back_before(
        numba_pool, monkeypatch):
    device, manager, pool = numba_pool
    arrays = [array(manager, i) for i in range(8)]
    x = next(a for a in arrays if not resident(pool, a))
    x.device_ctypes_pointer                                 # back, by an address read
    assert resident(pool, x) and pool._residency.arrival is not None
    look = PendingAtStart(device)
    dispatcher._Kernel.launch(StandInKernel(lambda kernel, views: None, extensions=[look]),
                              (x,), 1, 1, "stream 7")
    assert look.queued == [0]                               # the copy back was done first
    check(pool)


def test_a_failing_synchronize_leaves_the_pool_as_it_was(monkeypatch):
    """The device synchronize of a pool's first reclaim (settle), and the
    wait for bring-back copies before work on another stream, raising: the
    request or the launch fails with that error; arrays, stats and the
    pool's state are as before, and the next try works."""
    device, manager, pool = plugin(monkeypatch)
    arrays = [array(manager, i) for i in range(4)]          # 60 of 64 MiB
    pool.configure(reclaim=True)
    real, failing = device.synchronize, [True]

    def synchronize():
        if failing[0]:
            raise RuntimeError("injected: synchronize failed")
        real()
    monkeypatch.setattr(device, "synchronize", synchronize)
    before = pool.memory_stats()
    with pytest.raises(RuntimeError, match="injected"):
        manager.memalloc(15 * MiB)                          # settle's synchronize
    assert pool.memory_stats() == before and pool in activity._unsettled
    assert all(resident(pool, a) for a in arrays)
    check(pool)
    failing[0] = False
    more = manager.memalloc(15 * MiB)                       # settles, then reclaims
    x = next(a for a in arrays if not resident(pool, a))
    x.device_ctypes_pointer                                 # back; its copy is queued
    failing[0] = True
    before = pool.memory_stats()
    with pytest.raises(RuntimeError, match="injected"):     # waiting for it fails
        dispatcher._Kernel.launch(StandInKernel(lambda kernel, views: None), (x,), 1, 1, "s")
    assert pool.memory_stats() == before and not pool._residency.active
    assert block_of(x.gpu_data).pinned == 0
    assert pool._residency.arrival is not None              # still to wait for
    check(pool)
    failing[0] = False
    seen = []
    dispatcher._Kernel.launch(StandInKernel(lambda kernel, views: seen.append(float(views[0][0]))),
                              (x,), 1, 1, "s")
    assert seen == [float(arrays.index(x))] and pool._residency.arrival is None
    del more
    gc.collect()
    pool.synchronize()
    pool.configure(reclaim=False)
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all()
    check(pool)


RECLAIM_AT_START_UP = """
import gc
import types
import numpy as np
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba_alloc import SimulatedDevice
from numba_alloc.plugin import emm

class Context:
    class device:
        id = 0
        _dev = types.SimpleNamespace(memory_resource=None)     # cuda-core's Device

device = SimulatedDevice(64 << 20)
emm.CudaDevice = lambda context: device
manager = emm.NumbaAllocManager(context=Context())
pool = manager.initialize()                  # NUMBA_ALLOC_CONF=reclaim:true: the hooks go in
pointers = [manager.memalloc(128 << 10) for _ in range(16)]
for i in range(0, 16, 2):
    pointers[i] = None
gc.collect()
pool.synchronize()
array = DeviceNDArray((1000,), (4,), np.dtype(np.float32), gpu_data=pointers[1])
before = array._strided_memory_view_shim.ptr  # what a launch passes
moved = pool.defragment(4 * (128 << 10)).blocks_moved
print(pool.settings().reclaim, moved, before != pointers[1].block.address,
      array._strided_memory_view_shim.ptr == pointers[1].block.address)
"""


def test_arrays_follow_moves_when_reclaim_is_on_from_start_up():
    """With NUMBA_ALLOC_CONF=reclaim:true the plugin installed reclaim's
    hooks before the launch caches that follow moves: the hooks wrapped
    Numba's own, and a launch after a defragmentation (or a bring-back)
    passed the old address. A fresh process, as at start-up."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "NUMBA_ALLOC_CONF": "reclaim:true"}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, "-c", RECLAIM_AT_START_UP], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "2", "True", "True"]


def test_launches_restore_the_threads_scope_and_leave_no_cyclic_garbage(numba_pool):
    """A launch is this thread's scope while it runs (a launch inside it,
    its own until it ends), and leaves neither a scope nor cyclic garbage
    behind (the hot path's objects: _launch.Uses and what it holds)."""
    device, manager, pool = numba_pool
    a, b = array(manager, 1.0, MiB), array(manager, 2.0, MiB)
    scopes = []

    def inner(kernel, views):
        scopes.append(activity._scope())

    def outer(kernel, views):
        scopes.append(activity._scope())
        launch(inner, b)
        scopes.append(activity._scope())

    launch(outer, a)
    assert scopes[0] is scopes[2] and scopes[1] is not scopes[0]
    assert scopes[1].arrays == [b] and scopes[0].arrays == [a]
    assert activity._scope() is None
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            launch(outer, a, 3.0, (b,))
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert activity._scope() is None
    check(pool)


def test_uses_that_fail_part_way_end_what_they_began_and_raise_the_first_error():
    """Uses over two pools whose second refuses the use: the first pool's
    use is ended, and the refusal is what raises even when ending fails
    too."""
    from numba_alloc.plugin._launch import Uses
    ended = []

    class Pool:
        def __init__(self, begin_error=None, end_error=None):
            self.begin_error, self.end_error = begin_error, end_error

        def _begin_use(self, blocks, stream):
            if self.begin_error:
                raise self.begin_error
            return blocks

        def _end_use(self, handles, completed):
            ended.append(self)
            if self.end_error:
                raise self.end_error
    first = Pool(end_error=RuntimeError("ending failed"))
    with pytest.raises(ValueError, match="refused"):
        Uses({first: {}, Pool(begin_error=ValueError("refused")): {}})
    assert ended == [first]


def test_a_launch_scope_is_its_threads_own_until_closed():
    """A scoped Uses is the scope of the thread that made it (another
    thread, meanwhile, has none) until it is closed, which puts back the
    one before, down to none."""
    from numba_alloc.plugin._launch import Uses, scope
    outer = Uses({}, scoped=True)
    inner = Uses({}, scoped=True)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(scope()))
    thread.start()
    thread.join()
    assert seen == [None] and scope() is inner
    inner.close()
    assert scope() is outer
    outer.close()
    assert scope() is None
    outer.close()                   # closed again: nothing to put back
    assert scope() is None


def test_an_array_passed_several_times_is_one_use_of_its_block(numba_pool):
    """A launch passing one array three times (at the top level and inside
    a tuple) makes one use of its block: one nesting in the pool's active
    blocks and one pin while it runs, none after; each argument is among
    its scope's arrays."""
    device, manager, pool = numba_pool
    a, b = array(manager, 1.0, MiB), array(manager, 2.0, MiB)
    block, other = block_of(a.gpu_data), block_of(b.gpu_data)
    seen = []

    def run(kernel, views):
        seen.append((pool._residency.active.get(block), pool.pins_of(block),
                     pool._residency.active.get(other), activity._scope().arrays))

    launch(run, a, b, a, (a, 2.0))
    assert seen == [(1, 1, 1, [a, b, a, a])]
    assert block not in pool._residency.active and pool.pins_of(block) == 0
    check(pool)


def test_a_launch_bars_moves_while_preparing_its_arguments_not_while_loading_its_module():
    """activity.preparing_arguments (the glue refuses to move blocks then,
    unless the hooks keep the launch's arrays in place): True inside
    numba-cuda's _Kernel._prepare_args (an argument extension's request,
    after earlier arguments' addresses were read), False while the launch
    loads its module (get_cufunc: the NRT heap carved there may
    defragment; no address is read yet). It was True for the whole launch."""
    seen = {}

    class Library:
        def get_cufunc(self):
            seen["module"] = activity.preparing_arguments()
            raise StopIteration

    class Kernel:
        debug = False
        _codelibrary = Library()

    class Extension:
        def prepare_args(self, ty, val, stream=0, retr=None):
            seen["argument"] = activity.preparing_arguments()
            raise StopIteration

    class Preparing:
        extensions = [Extension()]

    with pytest.raises(StopIteration):
        dispatcher._Kernel.launch(Kernel(), (), (1,), (1,))
    with pytest.raises(StopIteration):
        dispatcher._Kernel._prepare_args(Preparing(), None, 1, 0, [], [])
    assert seen == {"module": False, "argument": True}
    assert not activity.preparing_arguments()
