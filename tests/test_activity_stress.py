"""Adversarial tests of reclaim under the Numba plugin (numba_alloc.plugin.activity),
over the stand-ins of tests/test_activity.py: Numba's real DeviceNDArrays,
views, copies and ``_Kernel._prepare_args`` on a 64 MiB SimulatedDevice.

Unlike test_activity's stand-in launch, the launch here is *asynchronous*:
the kernel body queues its work on the simulated device (a GPU runs it
later) at the addresses ``_prepare_args`` read, and that work checks that
every array it touches is still resident at that address when it runs (no
array of a running launch reclaimed or moved). Every live array has a NumPy
mirror, compared with the device (or the host copy of a reclaimed block)."""

import collections
import contextlib
import gc
import random
import threading
import time
import traceback

import numpy as np
import pytest
from numba import cuda, typeof
from numba.cuda import args as numba_args
from numba.cuda import dispatcher
from numba.cuda.cudadrv import devicearray, devices
from numba.cuda.cudadrv import driver as numba_driver
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from numba_alloc import OutOfMemoryError, ReclaimError
from numba_alloc.plugin import activity
from numba_alloc.policy.block import ALLOCATED
from numba_alloc.plugin.relocation import block_of

from invariants import check
from test_activity import plugin, second_pool
from test_pool_threads import race

pytestmark = pytest.mark.slow      # random workloads and threads: -m "not slow" leaves them out

MiB = 1 << 20
Pair = collections.namedtuple("Pair", "first second")


class Injected(Exception):
    """A fault the test injects."""


class Stream:
    """A stand-in for a Numba Stream (truthy, compared by identity)."""

    def __init__(self, name, device):
        self.name, self.device = name, device
        self.handle = self

    def synchronize(self):
        self.device.synchronize()

    def __repr__(self):
        return f"Stream({self.name})"


def leaves(value):
    """The leaves of a kernel argument, in the order Numba prepares them."""
    if isinstance(value, tuple):
        for v in value:
            yield from leaves(v)
    elif isinstance(value, numba_args.ArgHint):
        yield value.value
    else:
        yield value


class AsyncKernel:
    """A kernel for the asynchronous stand-in launch: ``body(kernel, args,
    places)`` runs on the host at launch, where ``places`` are (leaf,
    address) of its array leaves as Numba's argument preparation read them;
    it may queue work on the device."""
    _prepare_args = dispatcher._Kernel._prepare_args

    def __init__(self, body, extensions=(), argument_types=None):
        self.body, self.extensions = body, list(extensions)
        self.argument_types = argument_types


def async_launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
    """_Kernel.launch's stand-in: Numba's argument preparation, then the body."""
    retr, kernelargs = [], []
    for i, value in enumerate(args):
        ty = self.argument_types[i] if self.argument_types else typeof(value)
        self._prepare_args(ty, value, stream, retr, kernelargs)
    self.kernelargs = kernelargs
    places, i = [], 0
    for leaf in leaves(args):
        if getattr(leaf, "__cuda_memory__", False) and hasattr(leaf, "ndim"):
            places.append((leaf, kernelargs[i + 4]))
            i += 5 + 2 * leaf.ndim
        else:
            i += 1
    self.body(self, args, places)
    for writeback in retr:
        writeback()


class World:
    """The plugin over a 64 MiB simulated device, with every live array's
    NumPy mirror; asynchronous launches check residency when their work runs."""

    def __init__(self, device, manager, pool):
        self.device, self.manager, self.pool = device, manager, pool
        self.problems = []
        self.fault_rate = 0             # of the driver copies, where a test makes them faulty
        self.streams = [0, Stream("s1", device), Stream("s2", device)]

    # -- arrays -----------------------------------------------------------
    def array(self, values):
        a = DeviceNDArray(values.shape, (4,), np.dtype(np.float32),
                          gpu_data=self.manager.memalloc(values.nbytes))
        a.copy_to_device(values)
        return a

    def device_bytes(self, a):
        """The bytes of ``a`` where they are now (device, or reclaimed copy),
        without bringing anything back."""
        block = block_of(a.gpu_data)
        offset = getattr(a.gpu_data._view, "offset", 0)
        pool = self.pool
        self.device.synchronize()
        with pool.lock:
            saved = pool._residency.reclaimed.get(block)
            if saved is not None:
                held = np.concatenate([chunk.buffer for chunk in saved.chunks])
                data = held[offset: offset + a.nbytes].copy()
            else:
                assert pool.is_resident(block), block
                data = self.device.read(block.address + offset, a.nbytes)
        return data.view(np.float32)

    # -- launches ---------------------------------------------------------
    def launch(self, args, ops, stream=0, extensions=(), during=None):
        """Launch over ``args``; ``ops``: (i, k) adds k to leaf array i, or
        (i, j, None) adds leaf j to leaf i over their common length, all mod
        1000, in order, in work queued on the device. Checks, at launch and
        when the work runs, that each leaf is resident at the address read.
        Returns whether the work was queued."""
        pool, device, problems = self.pool, self.device, self.problems
        queued = []

        def body(kernel, args, places):
            for leaf, address in places:
                block = block_of(leaf.gpu_data)
                if not pool.is_resident(block) or (
                        pool.settings().reclaim and block not in pool._residency.active):
                    problems.append(("launch saw a non-active argument", block))
                    continue
                expect = block.address + getattr(leaf.gpu_data._view, "offset", 0)
                if address != expect:
                    problems.append(("launch read a stale address", block, address, expect))
            if during is not None:
                during(kernel, places)
            targets = [(block_of(leaf.gpu_data), address, leaf.size) for leaf, address in places]

            def work():
                views = []
                for block, address, size in targets:
                    if pool.state_of(block) is ALLOCATED and (
                            not pool.is_resident(block)
                            or block.address > address
                            or address >= block.address + block.allocated_size):
                        problems.append(("work ran on a reclaimed or moved block", block))
                        return
                    views.append(device.view(address, size * 4).view(np.float32))
                apply(views, ops)
            device.launch(work)
            queued.append(1)

        kernel = AsyncKernel(body, extensions)
        dispatcher._Kernel.launch(kernel, args, 1, 1, stream)
        return bool(queued)

    def check_quiet(self):
        """Invariants outside every launch and copy."""
        assert not self.problems, self.problems
        assert not self.pool._residency.active
        check(self.pool)
        needed = self.pool.settings().reclaim or bool(self.pool._residency.reclaimed)
        assert activity.installed() == needed


def apply(views, ops):
    for op in ops:
        if len(op) == 2:
            i, k = op
            views[i][:] = (views[i] + k) % 1000
        else:
            i, j, _ = op
            n = min(len(views[i]), len(views[j]))
            views[i][:n] = (views[i][:n] + views[j][:n]) % 1000


def setitem_stand_ins(monkeypatch, world):
    """What DeviceNDArray.__setitem__ needs beyond the plugin's stand-ins:
    the context (memalloc, its default stream) and the assign kernel (a
    launch through _Kernel.launch, as Numba's dispatcher makes it)."""
    default = Stream("default", world.device)

    class Context:
        memalloc = staticmethod(world.manager.memalloc)

        @staticmethod
        def get_default_stream():
            return default

    monkeypatch.setattr(devices, "get_context", lambda *a, **k: Context())

    def assign_kernel(ndim):
        class Forall:
            def __init__(self, n, stream=0):
                self.stream = stream

            def __call__(self, lhs, rhs):
                def body(kernel, args, places):
                    (_, lhs_address), (rhs_leaf, rhs_address) = places
                    for leaf, address in places:
                        block = block_of(leaf.gpu_data)
                        if not world.pool.is_resident(block) or (
                                world.pool.settings().reclaim
                                and block not in world.pool._residency.active):
                            world.problems.append(("assign saw a non-active argument", block))
                    n, m = max(lhs.size, 1), max(rhs.size, 1)

                    def work():
                        dst = world.device.view(lhs_address, n * 4).view(np.float32)
                        src = world.device.view(rhs_address, m * rhs_leaf.dtype.itemsize).view(
                            rhs_leaf.dtype)
                        dst[:] = src
                    world.device.launch(work)
                dispatcher._Kernel.launch(AsyncKernel(body), (lhs, rhs), 1, 1, self.stream)

        class Kernel:
            @staticmethod
            def forall(n, stream=0):
                return Forall(n, stream)
        return Kernel

    monkeypatch.setattr(devicearray, "_assign_kernel", assign_kernel)


@pytest.fixture
def world():
    with fresh_world() as w:
        yield w


# -- the random workload ------------------------------------------------------
class Workload:
    """A seeded random sequence of operations over the world, with mirrors."""

    def __init__(self, world, rng, faults=False):
        self.w, self.rng, self.faults = world, rng, faults
        self.bufs = []                  # [array, mirror]
        self.log = []

    def pick(self):
        return self.rng.choice(self.bufs)

    def view(self, buf):
        """(array or a slice of it, mirror of the same)."""
        a, m = buf
        rng = self.rng
        kind = rng.random()
        if kind < 0.5 or len(m) < 8:
            return a, m
        start = rng.randrange(0, len(m) // 2)
        if kind < 0.75:
            return a[start:], m[start:]
        stop = rng.randrange(start + 1, len(m) + 1)
        return a[start:stop], m[start:stop]

    def op_alloc(self):
        n = self.rng.choice([256, 4096, 1 << 18, 1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20])
        values = np.array(
            [self.rng.randrange(1000) for _ in range(16)], np.float32)[
            np.arange(n) % 16]
        try:
            a = self.w.array(values)
        except OutOfMemoryError:
            return "alloc oom"
        except (Injected, ReclaimError):
            return "alloc injected"
        self.bufs.append([a, values.copy()])
        return f"alloc {n * 4}"

    def op_drop(self):
        if len(self.bufs) > 1:
            self.bufs.pop(self.rng.randrange(len(self.bufs)))
            if self.rng.random() < 0.5:
                gc.collect()
        return "drop"

    def wrap(self, x):
        r = self.rng.random()
        if r < 0.55:
            return x
        if r < 0.7:
            return cuda.In(x)
        if r < 0.8:
            return cuda.Out(x)
        if r < 0.9:
            return cuda.InOut(x)
        return (x,)

    def op_launch(self):
        rng = self.rng
        chosen = [self.view(self.pick()) for _ in range(rng.choice([1, 1, 2, 2, 3]))]
        leaves_ = [a for a, _ in chosen]
        mirrors = [m for _, m in chosen]
        args = [self.wrap(a) for a in leaves_]
        if len(args) >= 2 and rng.random() < 0.3:
            args = [Pair(args[0], args[1])] + args[2:]
        ops = []
        for _ in range(rng.choice([1, 2])):
            if len(leaves_) > 1 and rng.random() < 0.5:
                i, j = rng.sample(range(len(leaves_)), 2)
                ops.append((i, j, None))
            else:
                ops.append((rng.randrange(len(leaves_)), rng.randrange(1, 999)))
        stream = rng.choice(self.w.streams)
        extensions = ()
        fail = self.faults and rng.random() < 0.15
        if fail:
            class Fail:             # raises after Numba read some arguments' addresses
                seen = 0

                def prepare_args(self, ty, val, stream, retr):
                    Fail.seen += 1
                    if Fail.seen == len(args):
                        raise Injected("in the middle of preparing the arguments")
                    return ty, val
            extensions = (Fail(),)
        during = None
        if rng.random() < 0.2:
            def allocate_meanwhile(kernel, places):    # memory Numba allocates during the launch
                try:
                    extra = self.w.manager.memalloc(rng.choice([1, 4, 8]) * MiB)
                except OutOfMemoryError:
                    return
                check(self.w.pool)          # inside the launch: its arrays are in use
                assert extra.size
                del extra
                gc.collect()
                check(self.w.pool)
            during = allocate_meanwhile
        try:
            queued = self.w.launch(tuple(args), ops, stream, extensions, during)
        except OutOfMemoryError:
            return "launch oom"
        except (Injected, ReclaimError):
            return "launch injected"
        assert queued
        apply(mirrors, ops)
        return f"launch {len(leaves_)} {ops} on {stream}"

    def op_to_host(self):
        a, m = self.view(self.pick())
        stream = self.rng.choice(self.w.streams)
        try:
            got = a.copy_to_host(stream=stream)
        except OutOfMemoryError:
            return "to_host oom"
        except (Injected, ReclaimError):
            return "to_host injected"
        self.w.device.synchronize()
        assert (got == m).all(), "copy_to_host differs from the mirror"
        return "to_host"

    def op_to_device(self):
        a, m = self.view(self.pick())
        values = np.full(len(m), self.rng.randrange(1000), np.float32)
        stream = self.rng.choice(self.w.streams)
        try:
            a.copy_to_device(values, stream=stream)
        except OutOfMemoryError:
            return "to_device oom"
        except (Injected, ReclaimError):
            return "to_device injected"
        m[:] = values
        return "to_device"

    def op_d2d(self):
        (a, m), (b, n) = self.pick(), self.pick()
        k = min(len(m), len(n))
        k = self.rng.randrange(1, k + 1)
        i, j = self.rng.randrange(len(m) - k + 1), self.rng.randrange(len(n) - k + 1)
        try:
            a[i:i + k].copy_to_device(b[j:j + k])
        except OutOfMemoryError:
            return "d2d oom"
        except (Injected, ReclaimError):
            return "d2d injected"
        m[i:i + k] = n[j:j + k].copy()
        return "d2d"

    def op_getitem(self):
        a, m = self.pick()
        i = self.rng.randrange(len(m))
        try:
            value = a[i]
        except OutOfMemoryError:
            return "getitem oom"
        except (Injected, ReclaimError):
            return "getitem injected"
        assert value == m[i], f"a[{i}] = {value}, mirror {m[i]}"
        return "getitem"

    def op_setitem(self):
        a, m = self.pick()
        rng = self.rng
        value = float(rng.randrange(1000))
        try:
            if rng.random() < 0.5:
                i = rng.randrange(len(m))
                a[i] = value
                m[i] = value
            else:
                i = rng.randrange(len(m))
                j = rng.randrange(i + 1, len(m) + 1)
                a[i:j] = value
                m[i:j] = value
        except OutOfMemoryError:
            return "setitem oom"
        except (Injected, ReclaimError):
            return "setitem injected"
        return "setitem"

    def op_memset(self):
        a, m = self.view(self.pick())
        byte = self.rng.choice([0, 0x3F])
        try:
            a.gpu_data.memset(byte, a.nbytes)
        except OutOfMemoryError:
            return "memset oom"
        except (Injected, ReclaimError):
            return "memset injected"
        m.view(np.uint8)[:] = byte
        return "memset"

    def op_sync(self):
        pool = self.w.pool
        pool.synchronize()
        self.w.device.synchronize()
        pool.synchronize()
        r = pool._residency
        held = sum(saved.host_bytes for saved in r.reclaimed.values())
        cached = pool.host_cache.stats()["allocated_bytes.current"]
        assert r.host_bytes == held and self.w.device.host_used == cached, (
            r.host_bytes, held, self.w.device.host_used, cached)
        return "synchronize"

    def op_toggle(self):
        pool = self.w.pool
        pool.configure(reclaim=not pool.settings().reclaim)
        return f"reclaim={pool.settings().reclaim}"

    def verify(self, bring_back=False):
        rate, self.w.fault_rate = self.w.fault_rate, 0
        try:
            self._verify(bring_back)
        finally:
            self.w.fault_rate = rate

    def _verify(self, bring_back):
        for a, m in self.bufs:
            got = a.copy_to_host() if bring_back else self.w.device_bytes(a)
            assert (got == m).all(), f"{block_of(a.gpu_data)} differs from its mirror"

    OPS = (("alloc", 4), ("drop", 2), ("launch", 8), ("to_host", 2), ("to_device", 2),
           ("d2d", 2), ("getitem", 2), ("setitem", 2), ("memset", 1), ("sync", 1),
           ("toggle", 1))

    def run(self, steps):
        names = [n for n, weight in self.OPS for _ in range(weight)]
        while sum(m.nbytes for _, m in self.bufs) < 80 * MiB:
            self.op_alloc()
        for step in range(steps):
            name = self.rng.choice(names)
            live = sum(m.nbytes for _, m in self.bufs)
            if name == "drop" and live < 100 * MiB:
                name = "alloc"
            elif name == "alloc" and live > 200 * MiB:
                name = "drop"
            if not self.w.pool.settings().reclaim and self.rng.random() < 0.2:
                name = "toggle"
            self.log.append(getattr(self, "op_" + name)())
            assert not self.w.problems, (self.w.problems, self.log[-5:])
            self.w.check_quiet()
            if step % 10 == 9:
                self.verify()
        self.verify()
        if not self.w.pool.settings().reclaim:
            self.w.pool.configure(reclaim=True)
        self.verify(bring_back=True)
        self.w.check_quiet()


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_keeps_data_and_counters(world, seed):
    Workload(world, random.Random(seed)).run(120)


@pytest.mark.parametrize("seed", range(3))
def test_random_workload_with_injected_faults(world, monkeypatch, seed):
    rng = random.Random(1000 + seed)
    world.pool.configure(reclaim=False)         # the hooks go, to wrap the faulty copies
    for name in ("host_to_device", "device_to_host", "device_to_device", "device_memset"):
        original = getattr(numba_driver, name)

        def flaky(dst, src, size, stream=0, original=original):
            if world.fault_rate and rng.random() < world.fault_rate:
                raise Injected("the driver's copy failed")
            return original(dst, src, size, stream)
        monkeypatch.setattr(numba_driver, name, flaky)
    for name in ("copy_to_host", "copy_from_host"):     # reclaim's and bring_back's copies
        original = getattr(world.device, name)

        def flaky_backend(*args, original=original):
            if world.fault_rate and rng.random() < world.fault_rate:
                raise Injected("the backend's copy failed")
            return original(*args)
        monkeypatch.setattr(world.device, name, flaky_backend)
    world.pool.configure(reclaim=True)
    assert activity.installed()
    world.fault_rate = 0.1
    Workload(world, rng, faults=True).run(100)



# -- targeted tests ------------------------------------------------------------
def fill(world, count=8, nbytes=15 * MiB):
    """``count`` arrays of ``nbytes`` (array i holds i): more than the device."""
    return [world.array(np.full(nbytes // 4, i, np.float32)) for i in range(count)]


def gone(world, arrays):
    return [a for a in arrays if not world.pool.is_resident(block_of(a.gpu_data))]


@pytest.mark.parametrize("seed", range(2))
def test_threads_launching_and_copying_keep_every_array_intact(world, seed):
    """Four threads, each with its own arrays (launches, copies both ways,
    slices, indexing, on random streams) and all adding to shared arrays;
    the device holds about a third of it all."""
    shared = [world.array(np.zeros(2 * MiB, np.float32)) for _ in range(2)]   # 8 MiB each
    adds = [0] * len(shared)
    counted = threading.Lock()
    errors = []

    def worker(index):
        rng = random.Random(seed * 100 + index)
        own = []
        try:
            for i in range(3):
                values = np.full(rng.choice([1, 2, 3]) * MiB, 10 * index + i, np.float32)
                for _ in range(1000):
                    try:
                        own.append([world.array(values), values.copy()])
                        break
                    except OutOfMemoryError:        # the other threads' arrays are in use
                        time.sleep(0.001)
            for step in range(40):
                r = rng.random()
                a, m = rng.choice(own)
                stream = rng.choice(world.streams)
                try:
                    if r < 0.4:
                        k = rng.randrange(1, 999)
                        s = rng.randrange(len(shared))
                        start = rng.randrange(len(m) // 2)
                        args = (a[start:], shared[s]) if rng.random() < 0.5 else \
                            (cuda.In(a[start:]), (shared[s],))
                        world.launch(args, [(0, k), (1, 1)], stream)
                        m[start:] = (m[start:] + k) % 1000
                        with counted:
                            adds[s] += 1
                    elif r < 0.6:
                        got = a.copy_to_host(stream=stream)
                        world.device.synchronize()
                        assert (got == m).all(), f"thread {index}: copy_to_host differs"
                    elif r < 0.75:
                        v = float(rng.randrange(1000))
                        a[: len(m) // 3].copy_to_device(np.full(len(m) // 3, v, np.float32))
                        m[: len(m) // 3] = v
                    elif r < 0.9:
                        i = rng.randrange(len(m))
                        assert a[i] == m[i], f"thread {index}: a[{i}] differs"
                    else:
                        b, n = rng.choice(own)
                        k = min(len(m), len(n))
                        a[:k].copy_to_device(b[:k])
                        m[:k] = n[:k]
                except OutOfMemoryError:
                    pass                # the other threads hold the rest
            for a, m in own:
                got = None
                for _ in range(2000):
                    try:
                        got = a.copy_to_host()
                        break
                    except OutOfMemoryError:    # the other threads' arrays are in use
                        time.sleep(0.001)
                assert got is not None, f"thread {index}: could never bring its array back"
                assert (got == m).all(), f"thread {index}: differs at the end"
        except BaseException as e:      # noqa: BLE001
            errors.append((e, traceback.format_exc()))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, "\n".join(tb for _, tb in errors)
    assert not world.problems, world.problems
    for s, a in zip(adds, shared):
        assert (a.copy_to_host() == s % 1000).all()
    world.check_quiet()


@pytest.mark.parametrize("seed", range(3))
def test_random_workload_with_defragmentation_on(world, seed):
    world.pool.configure(defrag=True)
    Workload(world, random.Random(2000 + seed)).run(100)


def test_threads_launching_while_another_turns_reclaim_off_and_on(world):
    """Three threads launch (asynchronous work on random streams) and copy
    their own arrays while a fourth turns reclaim off and on: no launch's
    array is reclaimed under its work, every array stays intact."""
    stop = threading.Event()
    errors = []

    def toggler():
        rng = random.Random(7)
        try:
            while not stop.is_set():
                world.pool.configure(reclaim=not world.pool.settings().reclaim)
                stop.wait(rng.random() * 0.01)
        except BaseException as e:      # noqa: BLE001
            errors.append((e, traceback.format_exc()))

    def worker(index):
        rng = random.Random(index)
        own = []
        try:
            for i in range(3):
                values = np.full(rng.choice([2, 3]) * MiB, 10 * index + i, np.float32)
                for _ in range(1000):
                    try:
                        own.append([world.array(values), values.copy()])
                        break
                    except OutOfMemoryError:        # reclaim is off just now
                        stop.wait(0.001)
            for step in range(40):
                a, m = rng.choice(own)
                try:
                    if rng.random() < 0.6:
                        k = rng.randrange(1, 999)
                        world.launch((a,), [(0, k)], rng.choice(world.streams))
                        m[:] = (m + k) % 1000
                    else:
                        got = a.copy_to_host()
                        world.device.synchronize()
                        assert (got == m).all(), f"thread {index}: copy_to_host differs"
                except OutOfMemoryError:
                    pass
        except BaseException as e:      # noqa: BLE001
            errors.append((e, traceback.format_exc()))
        return own

    results = {}
    race(toggler, lambda i: results.setdefault(i, worker(i)), range(3), stop)
    assert not errors, "\n".join(tb for _, tb in errors)
    assert not world.problems, world.problems
    if not world.pool.settings().reclaim:
        world.pool.configure(reclaim=True)
    for own in results.values():
        for a, m in own:
            assert (a.copy_to_host() == m).all()
    world.check_quiet()


def test_a_launch_over_two_pools_where_one_cannot_bring_its_arrays_back(world, monkeypatch):
    """Arrays of two devices' pools in one launch: the second pool cannot
    make its arrays resident; the first pool's arrays must end their use
    (no array stays active), nothing runs, and both pools stay consistent."""
    manager2, pool2 = second_pool(monkeypatch)
    others = []
    try:
        first = fill(world, 6)
        others += [DeviceNDArray((15 * MiB // 4,), (4,), np.dtype(np.float32),
                                 gpu_data=manager2.memalloc(15 * MiB)) for _ in range(6)]
        args = (gone(world, first)[0], *others[:5])     # 75 MiB on the second device
        with pytest.raises(OutOfMemoryError):
            world.launch(args, [(0, 1)])
        world.device.synchronize()
        assert not world.problems
        assert not world.pool._residency.active and not pool2._residency.active
        check(world.pool)
        check(pool2)
        for i, a in enumerate(first):
            assert (a.copy_to_host() == i).all()
    finally:
        others.clear()
        gc.collect()
        pool2.synchronize()
        pool2.configure(reclaim=False)
        if pool2._residency.reclaimed:
            pool2.reset()


@contextlib.contextmanager
def fresh_world():
    """A World with the stand-ins in place, for the ``world`` fixture and
    each hypothesis example; at the end, reclaim off and the hooks out."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        device, manager, pool = plugin(monkeypatch)
        monkeypatch.setattr(dispatcher._Kernel, "launch", async_launch)
        w = World(device, manager, pool)
        setitem_stand_ins(monkeypatch, w)
        pool.configure(reclaim=True)
        try:
            yield w
        finally:
            gc.collect()
            device.synchronize()
            pool.synchronize()
            if not pool.settings().reclaim:
                pool.configure(reclaim=True)
            pool.configure(reclaim=False)
            gc.collect()
            pool.synchronize()
            if activity.installed():
                pool.reset()
            assert not activity.installed()     # else the next world would run unhooked


def test_hypothesis_chosen_operation_sequences():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    names = [n for n, _ in Workload.OPS]

    @hypothesis.settings(max_examples=12, deadline=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.lists(st.sampled_from(names), min_size=5, max_size=40),
                      st.integers(0, 2 ** 16))
    def run(ops, seed):
        with fresh_world() as w:
            play(w, ops, seed)          # its arrays die before the world's end

    def play(w, ops, seed):
        load = Workload(w, random.Random(seed))
        while sum(m.nbytes for _, m in load.bufs) < 80 * MiB:
            load.op_alloc()
        for name in ops:
            load.log.append(getattr(load, "op_" + name)())
            w.check_quiet()
        load.verify()
        if not w.pool.settings().reclaim:
            w.pool.configure(reclaim=True)
        load.verify(bring_back=True)
        w.check_quiet()

    run()


def test_a_launch_that_raises_after_queuing_its_work_still_protects_its_arrays(world):
    arrays = fill(world, 4)             # 60 of 64 MiB, all resident
    x = arrays[0]

    class Late:                         # the kernel is queued, then the launch fails
        def prepare_args(self, ty, val, stream, retr):
            def fail():
                raise Injected("after the kernel was queued")
            retr.append(fail)
            return ty, val

    with pytest.raises(Injected):
        world.launch((x,), [(0, 5)], world.streams[1], extensions=[Late()])
    assert not world.pool._residency.active
    more = world.manager.memalloc(15 * MiB)      # must not take x while its work is queued
    world.device.synchronize()
    assert not world.problems, world.problems
    assert (x.copy_to_host() == 5).all()
    del more
    world.check_quiet()

