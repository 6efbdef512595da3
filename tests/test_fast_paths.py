"""malloc and free without the lock: they run only while no other thread
holds the pool's lock, and never race a locked operation."""

import sys
import threading
import weakref

import pytest

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice, compat, core
from numba_alloc.block import ALLOCATED, DEAD, PENDING

from invariants import check

MiB = 1 << 20
WAIT = 30


def race(background, work, seeds, stop):
    """Run ``background`` in a thread while one thread per seed runs
    ``work(seed)``; once those are done, set ``stop`` and wait for it."""
    other = threading.Thread(target=background)
    workers = [threading.Thread(target=work, args=(seed,)) for seed in seeds]
    other.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    stop.set()
    other.join(120)


@pytest.fixture
def fast_switching():
    """Switch threads as often as CPython allows, so that any window between
    two bytecodes of a fast path is hit."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_a_malloc_waits_while_another_thread_holds_the_lock():
    pool = Pool(SimulatedDevice(64 * MiB))
    pool.free(pool.malloc(1000))          # initialized: fast paths open
    took = threading.Event()
    with pool.lock:
        thread = threading.Thread(target=lambda: (pool.malloc(1000), took.set()))
        thread.start()
        assert not took.wait(0.5)         # the fast path saw the pool busy and locked
        assert compat.memory_allocated(pool) == 0
    assert took.wait(WAIT)
    thread.join(WAIT)
    assert compat.memory_allocated(pool) == 1024


def test_a_free_waits_while_another_thread_holds_the_lock():
    pool = Pool(SimulatedDevice(64 * MiB))
    block = pool.malloc(1000)
    done = threading.Event()
    with pool.lock:
        thread = threading.Thread(target=lambda: (pool.free(block), done.set()))
        thread.start()
        assert not done.wait(0.5)
        assert block.state is ALLOCATED
    assert done.wait(WAIT)
    thread.join(WAIT)
    assert block.state is PENDING


def test_free_later_frees_at_once_unless_the_pool_is_busy():
    pool = Pool(SimulatedDevice(64 * MiB))
    a, b = pool.malloc(1000), pool.malloc(1000)
    pool.free_later(a)                    # nothing holds the lock: freed now
    assert a.state is PENDING and compat.memory_allocated(pool) == 1024
    with pool.lock:                       # as a finalizer inside a pool operation
        pool.free_later(b)
        assert b.state is ALLOCATED       # deferred, not freed under the holder
    pool.synchronize()                    # the next operation frees it
    assert a.state is DEAD and b.state is DEAD
    pool.free_later(b)                    # no longer live: skipped, no error
    check(pool)


def test_a_freed_handle_dies_with_its_users_last_reference():
    """A free unregisters the handle, so that it is not kept (and its
    deallocation not delayed) until its batch is retired: on the fast path,
    on the locked one (the pool busy in this thread), and via free_later."""
    pool = Pool(SimulatedDevice(64 * MiB))
    pool.malloc(1000)
    with pool.hold_frees():                   # nothing is retired meanwhile
        for how in ("fast", "locked", "later", "later, busy"):
            block = pool.malloc(1000)
            ref = weakref.ref(block)
            if how == "fast":
                pool.free(block)
            elif how == "locked":
                with pool.lock:
                    pool.free(block)
            elif how == "later":
                pool.free_later(block)
            else:
                with pool.lock:
                    pool.free_later(block)
                    assert block.state is ALLOCATED
                pool.synchronize()
            assert block.state is PENDING, how
            del block
            assert ref() is None, how
    check(pool)


def test_the_core_array_a_fast_path_read_stays_valid_and_busy_after_growth():
    pool = Pool(SimulatedDevice(1 << 34))
    pool.free(pool.malloc(512))
    old_p, old = pool._p, pool._core.a
    blocks = [pool.malloc(512 * (i % 50 + 1)) for i in range(3000)]   # the table grows
    assert pool._p != old_p
    assert old[core.H_BUSY] > 0           # a stale fast call on it does nothing
    assert core.try_take(old_p, 512) == -3
    for block in blocks:
        pool.free(block)
    pool.synchronize()
    check(pool)


def test_threads_on_fast_paths_and_locked_operations_keep_the_pool_exact(fast_switching):
    pool = Pool(SimulatedDevice(1 << 33), defrag=True)
    errors, stop = [], threading.Event()

    sizes = {}                             # handle -> its allocated size when handed out

    def churn(seed):
        try:
            live = []
            for i in range(3000):
                if live and (i * seed) % 3 == 0:
                    pool.free(live.pop((i * 7) % len(live)))
                else:
                    live.append(pool.malloc(512 * ((i * seed) % 40 + 1) + (i % 5) * MiB))
                    sizes[live[-1]] = live[-1].allocated_size
            for block in live:
                pool.free(block)
        except Exception as e:             # noqa: BLE001 (reported below)
            errors.append(e)

    def locked_work():
        try:
            while not stop.is_set():
                check(pool)                # an atomic snapshot agrees with the counters
                pool.synchronize()
                pool.defragment()
                pool.empty_cache()
        except Exception as e:             # noqa: BLE001
            errors.append(e)

    race(locked_work, churn, (1, 2, 3, 5), stop)
    assert errors == []
    pool.synchronize()
    stats = pool.memory_stats()
    assert stats["allocation.all.current"] == stats["active.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] > 0
    check(pool)
    # a dead handle keeps what it had, however its row changed since
    assert all(block.allocated_size == size and block.address % 512 == 0
               and block.state is DEAD for block, size in sizes.items())


def test_a_double_free_racing_in_two_threads_frees_once(fast_switching):
    pool = Pool(SimulatedDevice(64 * MiB))
    for _ in range(200):
        block = pool.malloc(1000)
        outcomes = []

        def free():
            try:
                pool.free(block)
                outcomes.append("freed")
            except ValueError:
                outcomes.append("refused")
        threads = [threading.Thread(target=free) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert sorted(outcomes) == ["freed", "refused"]
    pool.synchronize()
    assert compat.memory_allocated(pool) == 0
    check(pool)


def test_reset_racing_fast_paths_leaves_a_consistent_pool(fast_switching):
    """A reset (Numba's context reset) while other threads allocate and free:
    handles from before it become invalid (their free raises ValueError),
    and the pool, its counters and its later blocks stay consistent. A
    thread resets freely meanwhile; each worker also resets at two fixed
    points between a malloc and its free, so that a free of a handle a
    reset killed happens every run (left to the scheduler, it did not on a
    loaded machine: the workers hold one block at a time)."""
    pool = Pool(SimulatedDevice(1 << 32))
    errors, stop, refused, resets_done = [], threading.Event(), [], []

    def churn(seed):
        live = []
        try:
            for i in range(2000):
                if i in (701, 1401):
                    pool.reset()
                    resets_done.append(1)      # (list.append is atomic; += is not)
                if live and i % 2:
                    block = live.pop()
                    try:
                        pool.free(block)
                    except ValueError:
                        assert block.state is DEAD     # reset killed it
                        refused.append(block)
                else:
                    live.append(pool.malloc(512 * ((i * seed) % 30 + 1)))
        except Exception as e:             # noqa: BLE001 (reported below)
            errors.append(e)

    def resets():
        try:
            while not stop.is_set():
                pool.reset()
                resets_done.append(1)
                check(pool)
        except Exception as e:             # noqa: BLE001
            errors.append(e)

    race(resets, churn, (1, 3, 7), stop)
    assert errors == []
    assert len(resets_done) >= 6 and len(refused) >= 6     # the resets landed among the frees
    pool.reset()
    stats = check(pool)["stats"]
    assert stats["allocation.all.current"] == stats["segment.all.current"] == 0
    block = pool.malloc(1000)              # the pool works after it all
    pool.free(block)
    pool.synchronize()
    check(pool)


def test_a_full_batch_is_closed_by_the_free_that_fills_it():
    """Every BATCH frees get their event at once, and completed batches are
    retired: freed memory comes back without waiting for a request that
    needs memory, while it is still in cache."""
    pool = Pool(SimulatedDevice(64 * MiB))
    blocks = [pool.malloc(1000) for _ in range(core.BATCH)]
    for block in blocks[:-1]:
        pool.free(block)
    assert all(b.state is PENDING for b in blocks[:-1])     # not yet a batch
    pool.free(blocks[-1])                                   # fills it: event, retired
    assert all(b.state is DEAD for b in blocks)
    assert pool.current("active") == 0
    check(pool)


def test_a_full_batch_whose_event_fails_stays_open_and_free_still_succeeds():
    from faults import FaultyDevice, InjectedFault
    device = FaultyDevice(64 * MiB)
    pool = Pool(device)
    blocks = [pool.malloc(1000) for _ in range(core.BATCH)]
    device.fail("record")
    for block in blocks:
        pool.free(block)                   # the batch's event fails: free does not raise
    assert device.fired["record"] == 1
    assert all(b.state is PENDING for b in blocks)           # still open, nothing lost
    assert pool.current("allocation") == 0 and pool.current("active") == core.BATCH
    device.fail("record")
    with pytest.raises(InjectedFault):     # the next request needing memory reports it
        pool.malloc(3 * MiB)
    pool.synchronize()                     # and once the device heals, all is retired
    assert all(b.state is DEAD for b in blocks)
    check(pool)


def test_without_the_gil_no_fast_path_runs_also_after_an_observer_leaves(monkeypatch):
    """Where the GIL is disabled a compiled call is not atomic for other
    threads: the pool always locks, also once recording stops."""
    import numba_alloc
    from numba_alloc import pool as pool_module
    monkeypatch.setattr(pool_module, "_GIL", False)
    pool = Pool(SimulatedDevice(64 * MiB))
    pool.free(pool.malloc(1000))                    # initialized
    numba_alloc.record_history(device=pool)
    numba_alloc.record_history(False, device=pool)  # the observer leaves
    fast = []
    take, release = pool._try_take, pool._try_release
    monkeypatch.setattr(pool, "_try_take", lambda *a: fast.append("malloc") or take(*a))
    monkeypatch.setattr(pool, "_try_release", lambda *a: fast.append("free") or release(*a))
    pool.free(pool.malloc(1000))
    assert fast == []
    check(pool)


def _a_victim_beside_holes():
    """(pool, size, victim, core index of its row): 16 blocks of 128 KiB,
    every other one freed; the victim (the second) sits in the cheapest
    window of a 512 KiB hole, so a defragmentation for it moves the victim."""
    pool = Pool(SimulatedDevice(64 * MiB))
    size = 128 << 10
    blocks = [pool.malloc(size) for _ in range(16)]
    for i in range(0, 16, 2):
        pool.free(blocks[i])
    pool.synchronize()
    victim = blocks[1]
    return pool, size, victim, core.TABLE + (victim._ticket & core.ROW_MASK) * core.NF


class _AfterARead:
    """Stands in for a core's memoryview: the first read of ``index`` runs
    ``then`` (another thread's work) before it returns."""

    def __init__(self, real, index, then):
        self.real, self.index, self.then = real, index, then

    def __getitem__(self, index):
        value = self.real[index]
        if index == self.index and self.then is not None:
            then, self.then = self.then, None
            then()
        return value

    def __setitem__(self, index, value):
        self.real[index] = value


@pytest.mark.parametrize("free", ["free", "free_later"])
def test_a_block_moved_while_a_fast_free_keeps_its_values_keeps_where_it_was_freed(free):
    """A fast free keeps the block's address, then releases it without the
    lock: a defragmentation on another thread in between (a thread switch
    right after the read) moves the block, and its dead handle must still
    keep the address it was freed at."""
    pool, size, victim, record = _a_victim_beside_holes()
    old, moved = victim.address, []

    def defragment_on_another_thread():
        moved.append(None)                  # the window was entered
        thread = threading.Thread(target=lambda: moved.append(pool.defragment(4 * size)))
        thread.start()
        thread.join(WAIT)

    pool._mv = _AfterARead(pool._mv, record + core.SIZE, defragment_on_another_thread)
    try:
        getattr(pool, free)(victim)
    finally:
        pool._mv = pool._core.mv
    new = pool._mv[record + core.ADDR]
    assert moved[1].blocks_moved and new != old
    pool.synchronize()                      # (the deferred free of free_later goes on)
    assert victim.state is DEAD and victim.address == new
    check(pool)


@pytest.mark.parametrize("config", [dict(defrag=True, limit=128 * MiB),
                                    dict(defrag=True, growth=False, limit=128 * MiB)])
def test_threads_with_defragmentation_and_reconfiguration_keep_data_and_counters(
        config, fast_switching):
    """Threads malloc, free, free_later and hold frees, each block with its
    own data (read and written under the pool's lock, where no move can
    fall), while another defragments, changes settings and empties the
    cache: every byte survives, the pool never reserves past its limit,
    and at quiescence the counters agree with a recount."""
    import random

    from owner import pattern
    device = SimulatedDevice(256 * MiB)
    device.kernel_limit = 0                    # NumPy copies: the kernel is tested elsewhere
    pool = Pool(device, **config)
    errors, stop = [], threading.Event()

    def intact(block, seed):
        with pool.lock:
            assert (device.read(block.address, block.size) == pattern(seed, block.size)).all()

    def churn(seed):
        rng, live = random.Random(seed), []
        try:
            for i in range(250):
                op = rng.random()
                if live and op < 0.4:
                    block, data = live.pop(rng.randrange(len(live)))
                    intact(block, data)
                    (pool.free_later if op < 0.1 else pool.free)(block)
                elif live and op < 0.5:
                    with pool.hold_frees():
                        block, data = live.pop()
                        intact(block, data)
                        pool.free(block)
                else:
                    size = rng.choice([100, 3 << 10, 200 << 10, 900 << 10, 2 * MiB, 5 * MiB])
                    try:
                        block = pool.malloc(size)
                    except OutOfMemoryError:
                        continue
                    with pool.lock:
                        device.write(block.address, pattern((seed, i), size))
                    live.append((block, (seed, i)))
            for block, data in live:
                intact(block, data)
                pool.free(block)
        except Exception as e:             # noqa: BLE001 (reported below)
            errors.append(e)

    def admin():
        rng = random.Random(0)
        try:
            while not stop.is_set():
                op = rng.random()
                if op < 0.4:
                    pool.defragment(rng.choice([None, 3 * MiB, 9 * MiB]))
                elif op < 0.6:
                    try:
                        pool.configure(limit=rng.choice([32 * MiB, 96 * MiB, 128 * MiB, 0.75]),
                                       defrag=rng.random() < 0.8,
                                       garbage_collection_threshold=rng.choice([None, 0.5]))
                    except RuntimeError:       # below what is reserved, or growth off
                        pass
                elif op < 0.7:
                    pool.empty_cache()
                else:
                    with pool.lock:
                        check(pool)
                        assert compat.memory_reserved(pool) <= compat.get_bytes_limit(pool)
        except Exception as e:             # noqa: BLE001
            errors.append(e)

    race(admin, churn, (1, 2, 3), stop)
    assert errors == []
    pool.synchronize()
    stats = check(pool)["stats"]
    assert stats["allocated_bytes.all.current"] == 0
    assert compat.get_bytes_defragged(pool) > 0


@pytest.mark.parametrize("free", ["free", "free_later"])
def test_a_defragmentation_planned_before_a_fast_free_leaves_the_address_freed_at(free):
    """A defragmentation on another thread has planned (it holds the lock)
    when a fast free unregisters the block; it moves the block by its row
    after the free has read the block's values and lets go of the lock
    before the free's compiled release: the dead handle must keep the
    address the block was freed at (reading the values after unregistering
    is not enough; the release refuses when the block is no longer there)."""
    from numba_alloc import defrag
    pool, size, victim, record = _a_victim_beside_holes()
    old = victim.address
    planned, read, execute = threading.Event(), threading.Event(), defrag._execute

    def paused(pool, phases):
        planned.set()
        read.wait(WAIT)
        return execute(pool, phases)

    mover = threading.Thread(target=pool.defragment, args=(4 * size,))

    def finish_the_defragmentation():
        read.set()
        mover.join(WAIT)

    try:
        defrag._execute = paused
        mover.start()
        assert planned.wait(WAIT)
        pool._mv = _AfterARead(pool._mv, record + core.ADDR, finish_the_defragmentation)
        getattr(pool, free)(victim)
    finally:
        pool._mv = pool._core.mv
        defrag._execute = execute
        read.set()
        mover.join(WAIT)
    new = pool._mv[record + core.ADDR]
    assert read.is_set() and new != old     # the block moved in the window
    pool.synchronize()                      # (the deferred free of free_later goes on)
    assert victim.state is DEAD and victim.address == new
    check(pool)


def test_a_reset_right_after_a_fast_free_unregisters_leaves_the_handle_its_own_address():
    """A reset on another thread, and an allocation that reuses the row,
    right after a fast free has unregistered its block: the free raises
    ValueError (the block died with the reset) and the dead handle keeps
    its own address, not that of the block now at its row."""
    pool = Pool(SimulatedDevice(64 * MiB))
    victim = pool.malloc(4096)
    old, row, after, switched = victim.address, victim._ticket & core.ROW_MASK, [], []

    class Handles(list):
        """The pool's handles; right after the victim's is cleared (by the
        fast free), another thread resets the pool and allocates."""

        def __setitem__(self, index, value):
            super().__setitem__(index, value)
            if index == row and value is None and not switched:
                switched.append(True)
                thread = threading.Thread(
                    target=lambda: (pool.reset(), after.append(pool.malloc(4096))))
                thread.start()
                thread.join(WAIT)

    pool._handles = Handles(pool._handles)
    with pytest.raises(ValueError, match="not a live block"):
        pool.free(victim)
    assert after[0]._ticket & core.ROW_MASK == row and after[0].address != old
    assert victim.address == old
    check(pool)
