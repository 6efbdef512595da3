"""The pool under threads: malloc and free wait for another thread's lock,
finalizers' frees wait for the next operation, and threads allocating,
freeing, resetting, defragmenting and reconfiguring at once leave the
pool, its data and its counters exact."""

import sys
import threading
import weakref

import pytest

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.policy import core
from numba_alloc.policy.block import ALLOCATED, DEAD, PENDING

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
    two bytecodes of an operation is hit."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_a_malloc_waits_while_another_thread_holds_the_lock():
    pool = Pool(SimulatedDevice(64 * MiB))
    pool.free(pool.malloc(1000))          # initialized
    took = threading.Event()
    with pool.lock:
        thread = threading.Thread(target=lambda: (pool.malloc(1000), took.set()))
        thread.start()
        assert not took.wait(0.5)         # it waits for the lock
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


def test_free_later_frees_at_the_next_operation_never_under_its_caller():
    pool = Pool(SimulatedDevice(64 * MiB))
    a, b = pool.malloc(1000), pool.malloc(1000)
    pool.free_later(a)                    # as a finalizer: no lock taken
    assert a.state is ALLOCATED
    assert compat.memory_allocated(pool) == 1024      # a stats read is an operation
    assert a.state is PENDING
    with pool.lock:                       # as a finalizer inside a pool operation
        pool.free_later(b)
        assert b.state is ALLOCATED       # deferred, not freed under the holder
    pool.synchronize()                    # the next operation frees it
    assert a.state is DEAD and b.state is DEAD
    pool.free_later(b)                    # no longer live: skipped, no error
    pool.synchronize()
    check(pool)


def test_a_freed_handle_dies_with_its_users_last_reference():
    """A free unregisters the handle, so that it is not kept (and its
    deallocation not delayed) until its batch is retired: a free, one under
    the lock this thread holds, and via free_later."""
    pool = Pool(SimulatedDevice(64 * MiB))
    pool.malloc(1000)
    with pool.hold_frees():                   # nothing is retired meanwhile
        for how in ("free", "locked", "later", "later, busy"):
            block = pool.malloc(1000)
            ref = weakref.ref(block)
            if how == "free":
                pool.free(block)
            elif how == "locked":
                with pool.lock:
                    pool.free(block)
            elif how == "later":
                pool.free_later(block)
                pool.synchronize()
            else:
                with pool.lock:
                    pool.free_later(block)
                    assert block.state is ALLOCATED
                pool.synchronize()
            assert block.state is PENDING, how
            del block
            assert ref() is None, how
    check(pool)


def test_threads_allocating_beside_locked_operations_keep_the_pool_exact(fast_switching):
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


def test_reset_racing_allocations_and_frees_leaves_a_consistent_pool(fast_switching):
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
