"""Reclaim (the reclaim setting) on the simulated device: inactive blocks
go to host memory under pressure and come back on their next use, intact;
the counters agree with a recount after every step."""

import contextlib
import random
import threading

import numpy as np
import pytest

import numba_alloc
from numba_alloc import OutOfMemoryError, Pool, ReclaimError, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.policy import reclaim
from numba_alloc.policy.block import ALLOCATED, DEAD
from numba_alloc.policy.observers import PoolObserver

from faults import FaultyDevice, InjectedFault
from error_cycles import assert_freed_without_the_collector
from invariants import check

MiB = 1 << 20


def fill(device, block, value):
    """Write ``value`` over the block's requested bytes (inside its use;
    after the copies queued to bring it back, as a GPU orders a copy from
    the host after them)."""
    device.synchronize()
    device.write(block.address, np.full(block.size, value % 251, np.uint8))


def intact(device, block, value):
    """Whether the block holds ``value`` (inside its use; after the copies
    queued to bring it back: the simulated device runs queued work when
    asked, as a GPU runs it before a later kernel or copy)."""
    device.synchronize()
    return bool((device.read(block.address, block.size) == value % 251).all())


def host_memory_returned(device, pool):
    """Whether no pinned host memory is left once the device is idle and the
    host cache emptied: every chunk reclaim took went back to the cache, and
    every chunk the cache held to the device."""
    device.synchronize()
    pool.host_cache.empty()
    return device.host_used == 0 and pool._residency.host_bytes == 0


def cache_holds_all(device, pool):
    """Whether every byte of host memory handed out is the host cache's."""
    return device.host_used == pool.host_cache.stats()["allocated_bytes.current"]


def filled_pool(capacity, count, size, device_type=SimulatedDevice, **settings):
    """(device, pool with reclaim on, ``count`` blocks of ``size`` bytes,
    block i filled with i)."""
    device = device_type(capacity)
    pool = Pool(device, reclaim=True, **settings)
    blocks = []
    for i in range(count):
        block = pool.malloc(size)
        with pool.use(block):
            fill(device, block, i)
        blocks.append(block)
        check(pool)
    return device, pool, blocks


def test_a_workload_three_times_the_device_keeps_every_byte():
    device, pool, blocks = filled_pool(64 * MiB, 12, 15 * MiB)    # 12 x 16 MiB on 64 MiB
    assert sum(pool.is_resident(b) for b in blocks) == 4
    values = list(range(len(blocks)))
    rng = random.Random(5)
    for step in range(40):
        chosen = rng.sample(range(len(blocks)), rng.choice([1, 2, 3]))
        with pool.use(*(blocks[i] for i in chosen)):
            assert all(pool.is_resident(blocks[i]) for i in chosen)
            for i in chosen:
                assert intact(device, blocks[i], values[i])
                values[i] += 1
                fill(device, blocks[i], values[i])
        check(pool)
    stats = pool.memory_stats()
    assert stats["reclaimed.current"] == 8
    assert stats["reclaimed_bytes.current"] == 8 * 16 * MiB == pool._residency.host_bytes
    # the cache's chunks: the 8 blocks', and while a use of three brought
    # them back (each reclaiming another first) those 3 more, kept for reuse
    assert cache_holds_all(device, pool) and device.host_used <= 11 * 16 * MiB
    assert compat.get_bytes_reclaimed(pool) == stats["reclaimed_bytes.allocated"] > 8 * 16 * MiB
    assert compat.get_num_single_reclaims(pool) > 0
    assert compat.get_bytes_inactive(pool) == 4 * 16 * MiB and compat.get_bytes_active(pool) == 0
    assert compat.get_peak_bytes_active(pool) == 3 * 16 * MiB
    for block in blocks:
        pool.free(block)
    pool.synchronize()
    stats = check(pool)["stats"]
    assert stats["reclaimed.current"] == stats["allocation.all.current"] == 0
    assert host_memory_returned(device, pool)


def test_a_use_whose_bring_back_grows_the_block_table_counts_the_block_active():
    # bringing a back carves a new row when the table has no spare one: the
    # table's array is replaced, and the use must count and pin in the new one
    from numba_alloc.policy import core
    KiB = 1 << 10
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device, reclaim=True, limit=2 * MiB)
    a = pool.malloc(512 * KiB)
    c = pool.malloc(1536 * KiB)
    pool.malloc(512 * KiB)                     # a is reclaimed for it
    assert not pool.is_resident(a)
    pool.free(c)
    pool.synchronize()
    tiny = []
    while pool._mv[core.H_AVAIL] > 0:          # no spare row left
        tiny.append(pool.malloc(512))
    capacity = pool._mv[core.H_CAP]
    with pool.use(a):
        assert pool._mv[core.H_CAP] > capacity and pool.is_resident(a)
        assert pool.memory_stats()["lms_active_bytes.current"] == a.allocated_size
        assert a.pinned
    assert pool.memory_stats()["lms_active_bytes.current"] == 0 and not a.pinned
    check(pool)


def test_a_chunk_whose_release_fails_stays_cached_and_goes_at_the_next_try():
    device = FaultyDevice(1 << 30)
    pool = Pool(device, reclaim=True, limit=64 * MiB, host_limit=40 * MiB)
    blocks = [pool.malloc(20 * MiB) for _ in range(3)]
    pool.malloc(20 * MiB)                      # one of them is reclaimed to host memory
    gone = next(b for b in blocks if not pool.is_resident(b))
    assert pool._residency.host_bytes == 20 * MiB == device.host_used   # 8 + 8 + 4 MiB
    pool.free(gone)                            # its chunks go back to the host cache
    assert pool._residency.host_bytes == 0
    device.synchronize()
    device.fail("host_release")
    with pytest.raises(InjectedFault):
        pool.host_cache.empty()
    assert device.host_used == 20 * MiB and pool.host_cache.stats()["cached_bytes"] == 20 * MiB
    assert pool.host_cache.empty() == 20 * MiB and device.host_used == 0
    check(pool)


def test_a_request_reclaim_cannot_serve_reclaims_nothing():
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB)
    with pytest.raises(OutOfMemoryError):
        pool.malloc(65 * MiB)                   # larger than the device
    assert all(pool.is_resident(b) for b in blocks) and device.host_used == 0
    check(pool)


def test_reclaim_is_off_by_default_and_out_of_memory_is_raised():
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device)
    blocks = [pool.malloc(15 * MiB) for _ in range(4)]
    with pytest.raises(OutOfMemoryError):
        pool.malloc(15 * MiB)
    assert all(pool.is_resident(b) for b in blocks) and device.host_used == 0


class _DeviceNotCurrent(SimulatedDevice):
    """A simulated device that is not current while ``current`` is False:
    work queued on stream 0 then goes to another device (Backend.is_current)."""
    current = True

    def is_current(self):
        return self.current


def test_a_use_while_another_device_is_current_waits_for_the_copies_back():
    """A block brought back by a use on stream 0 of its own device leaves
    its copies queued (work there follows them); a later use while another
    device is current (its stream 0 does not follow them) waits for them."""
    device = _DeviceNotCurrent(64 * MiB)
    pool = Pool(device, reclaim=True, limit=2 * MiB)
    a = pool.malloc(MiB)
    pool.malloc(MiB)
    c = pool.malloc(MiB)                        # a is reclaimed for it
    assert not pool.is_resident(a)
    pool.free(c)
    pool.synchronize()
    with pool.use(a):                           # back: its copy queued, not waited for
        pass
    assert not pool._residency.reclaimed        # nothing reclaimed for it
    assert pool._residency.arrival is not None and device.pending_work
    with pool.use(a):                           # its own device current: no wait
        pass
    assert pool._residency.arrival is not None and device.pending_work
    device.current = False
    with pool.use(a):
        assert pool._residency.arrival is None and not device.pending_work
    check(pool)


class _CurrentFails(SimulatedDevice):
    """A simulated device whose is_current raises once armed (on CUDA:
    cuCtxGetCurrent refused with another device's context alive)."""
    fails = False

    def is_current(self):
        if self.fails:
            raise InjectedFault("injected failure of is_current")
        return True


def test_a_use_whose_current_device_query_fails_leaves_no_pin():
    """A use that brings a block back asks, once its copies are queued,
    whether the device is current: when that query raises, the blocks the
    use pinned (the one brought back, the resident one beside it) are
    unpinned, as when waiting for the copies raises, and the next use works."""
    device = _CurrentFails(64 * MiB)
    pool = Pool(device, reclaim=True, limit=2 * MiB)
    a = pool.malloc(MiB)
    b = pool.malloc(MiB)
    c = pool.malloc(MiB)                        # a is reclaimed for it
    assert not pool.is_resident(a)
    pool.free(c)
    pool.synchronize()
    device.fails = True
    with pytest.raises(InjectedFault):
        with pool.use(a, b):
            pass
    device.fails = False
    assert pool.pins_of(a) == 0 and pool.pins_of(b) == 0
    with pool.use(a, b):
        pass
    assert pool.pins_of(a) == 0 and pool.pins_of(b) == 0
    check(pool)


def test_the_least_recently_used_goes_first_and_in_use_blocks_never():
    device, pool, (a, b, c, d) = filled_pool(64 * MiB, 4, 15 * MiB)
    with pool.use(a):
        pass                                    # a: used most recently
    with pool.use(b):                           # b: in use, protected
        e = pool.malloc(15 * MiB)               # c: the least recently used goes
        assert not pool.is_resident(c) and pool.is_resident(b)
        assert pool.state_of(c) is ALLOCATED and pool.pins_of(c) == 0
        assert pool.segment_of(c) is None
        assert compat.get_bytes_active(pool) == 16 * MiB
        check(pool)
    pool.pin(a)                                 # pinned: never a victim
    pool.malloc(15 * MiB)
    assert pool.is_resident(a) and not pool.is_resident(d)
    assert compat.get_num_single_reclaims(pool) == 2
    del e
    check(pool)


def test_a_block_with_gpu_work_still_queued_is_taken_once_that_work_completes():
    device, pool, (a, b, c, d) = filled_pool(64 * MiB, 4, 15 * MiB)
    for block in (a, b, c):
        with pool.use(block):
            pass
    address = d.address
    with pool.use(d):                           # work queued inside its use
        device.launch(lambda: device.write(address, np.full(d.size, 77, np.uint8)))
    for block in (a, b, c):
        pool.pin(block)
    syncs = pool.memory_stats()["num_sync_all_streams"]
    e = pool.malloc(15 * MiB)                   # waits for d's work, not out of memory
    assert device.pending_work == 0 and not pool.is_resident(d)
    assert pool.memory_stats()["num_sync_all_streams"] > syncs
    with pool.use(d):
        assert intact(device, d, 77)            # what its queued work wrote
    check(pool)
    del e


def test_every_inactive_block_busy_is_waited_for_not_out_of_memory():
    """Five 15 MiB blocks under a 64 MiB limit, work queued on the four
    resident ones (as kernels launched on four Numba arrays), then a sixth:
    served once that work completes, with every block's bytes intact."""
    device, pool, blocks = filled_pool(64 * MiB, 5, 15 * MiB, limit=64 * MiB)
    resident = [b for b in blocks if pool.is_resident(b)]
    assert len(resident) == 4
    for block in resident:
        with pool.use(block):
            device.launch()
    sixth = pool.malloc(15 * MiB)
    assert device.pending_work == 0
    for i, block in enumerate(blocks):
        with pool.use(block):
            assert intact(device, block, i)
    check(pool)
    del sixth


def test_a_bring_back_waits_for_the_work_queued_on_the_blocks_it_must_reclaim():
    """Found by bench_reclaim_gpu.py over the driver stand-in: a use of a
    reclaimed block, every resident block's work still queued, was refused
    as out of memory."""
    device, pool, blocks = filled_pool(64 * MiB, 5, 15 * MiB, limit=64 * MiB)
    away = [b for b in blocks if not pool.is_resident(b)]
    assert len(away) == 1
    for block in blocks:
        if pool.is_resident(block):
            with pool.use(block):
                device.launch()
    with pool.use(away[0]):                     # waits for that work, reclaims, comes back
        assert intact(device, away[0], blocks.index(away[0]))
    assert sum(not pool.is_resident(b) for b in blocks) == 1 and pool.is_resident(away[0])
    check(pool)


def test_a_block_whose_work_completed_is_a_victim_whatever_later_uses_queue():
    device, pool, (a, b, c, d) = filled_pool(64 * MiB, 4, 15 * MiB)
    with pool.use(a):
        device.launch()                         # a's work
    device.complete()                           # ... has completed
    with pool.use(c):
        device.launch()                         # c's work is still running
    for block in (b, c, d):
        pool.pin(block)
    pool.malloc(15 * MiB)
    assert not pool.is_resident(a)
    check(pool)


class _SideStreamDevice(SimulatedDevice):
    """A simulated device with a second, non-blocking stream: a kernel
    queued there (:meth:`side_launch`, writing a block's bytes) runs only
    when the device is synchronized, and the device's copies do not wait
    for it, as on a GPU a copy on the legacy default stream does not wait
    for a non-blocking stream. A copy queued from a block such a kernel
    still writes is a race: recorded in ``races``."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.side, self.races = [], []

    def side_launch(self, block, value):
        self.side.append((block.address, block.size, value))

    def synchronize(self):
        super().synchronize()
        for address, nbytes, value in self.side:
            self.write(address, np.full(nbytes, value % 251, np.uint8))
        self.side.clear()

    def copy_to_host(self, address, buffer, nbytes):
        if any(a < address + nbytes and address < a + n for a, n, _ in self.side):
            self.races.append(address)
        super().copy_to_host(address, buffer, nbytes)


def test_a_block_whose_last_use_may_have_work_queued_is_taken_only_after_a_synchronize():
    """No event marks a use's end (a kernel launch's, under the Numba
    plugin): the pool knows its work has completed once it has synchronized
    the device since, which covers every stream. Here the work is a kernel
    on a non-blocking stream still writing x: reclaim synchronizes before it
    copies x out (an event on the legacy default stream would not wait for
    it), and x comes back with what the kernel wrote."""
    device, pool, (x, b, c, d) = filled_pool(64 * MiB, 4, 15 * MiB, device_type=_SideStreamDevice)
    with pool.use(x):
        device.side_launch(x, 99)
    for block in (b, c, d):
        pool.pin(block)
    with pool.lock:
        assert reclaim.victims(pool) == [] and reclaim._busy(pool)
    syncs = pool.memory_stats()["num_sync_all_streams"]
    more = pool.malloc(15 * MiB)
    assert not pool.is_resident(x) and device.races == []
    assert pool.memory_stats()["num_sync_all_streams"] > syncs
    pool.free(more)
    with pool.use(x):
        assert intact(device, x, 99)
    check(pool)


def test_a_synchronous_use_keeps_an_earlier_uses_protection():
    """A use whose work has completed when it ends (a synchronous copy)
    leaves x waiting for an earlier use's work on another stream; once the
    pool has synchronized the device, x is a victim again, and a later
    synchronous use does not make it wait."""
    device, pool, (x, b, c, d) = filled_pool(64 * MiB, 4, 15 * MiB, device_type=_SideStreamDevice)
    with pool.use(x):
        device.side_launch(x, 99)                            # a kernel on another stream
    pool._end_use(pool._begin_use([x]), completed=True)      # then a synchronous copy
    for block in (b, c, d):
        pool.pin(block)
    with pool.lock:
        assert x not in [handle for _, handle in reclaim.victims(pool)]
        reclaim._reusable(pool)                              # the device synchronized
        assert [handle for _, handle in reclaim.victims(pool)] == [x]
    pool._end_use(pool._begin_use([x]), completed=True)
    with pool.lock:
        assert [handle for _, handle in reclaim.victims(pool)] == [x]
        assert not reclaim._busy(pool)
    check(pool)


def test_a_small_request_on_a_device_full_of_large_blocks_reclaims_one():
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB)     # four large segments
    pool.malloc(8)                              # one block's segment goes back; a small one
    assert sum(not pool.is_resident(b) for b in blocks) == 1
    assert compat.get_num_single_reclaims(pool) == 1 and compat.get_num_full_reclaims(pool) == 0
    for i, block in enumerate(blocks):
        with pool.use(block):
            assert intact(device, block, i)
    check(pool)


def test_full_reclaim_when_no_single_block_makes_room():
    device, pool, blocks = filled_pool(64 * MiB, 8, 7 * MiB)      # 8 x 8 MiB
    big = pool.malloc(40 * MiB)                 # needs several victims together
    assert compat.get_num_full_reclaims(pool) == 1
    assert sum(not pool.is_resident(b) for b in blocks) >= 5
    with pool.use(*blocks[:3]):
        pass
    for i, block in enumerate(blocks):
        with pool.use(block):
            assert intact(device, block, i)
    del big
    check(pool)


def test_use_brings_back_all_or_none():
    device, pool, (a, b, c, d) = filled_pool(64 * MiB, 4, 15 * MiB)
    others = [pool.malloc(15 * MiB) for _ in range(3)]     # a, b, c go to host memory
    for block in others:
        pool.pin(block)
    assert [pool.is_resident(x) for x in (a, b, c, d)] == [False, False, False, True]
    with pytest.raises(OutOfMemoryError):       # two blocks, room for one (d's)
        with pool.use(a, b):
            pass
    # they could never both fit: refused before anything changed (d stays)
    assert [pool.is_resident(x) for x in (a, b, c, d)] == [False, False, False, True]
    assert compat.get_bytes_active(pool) == 0
    check(pool)
    with pool.use(a):                           # one at a time fits
        assert intact(device, a, 0)
    with pool.use(b):
        assert intact(device, b, 1)
    with pool.use(d):
        assert intact(device, d, 3)
    check(pool)


def test_host_limit_caps_the_host_memory_reclaim_uses():
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB, host_limit="40MiB")
    pool.malloc(15 * MiB)                       # 16 MiB to host
    pool.malloc(15 * MiB)                       # 32 MiB
    with pytest.raises(OutOfMemoryError):       # a third would be 48 MiB
        pool.malloc(15 * MiB)
    assert pool._residency.host_bytes == device.host_used == 32 * MiB
    assert sum(not pool.is_resident(b) for b in blocks) == 2
    check(pool)


def test_host_limit_counts_the_chunks_as_the_host_cache_rounds_them():
    """A block of 5 MiB + 4 KiB is held by one 8 MiB chunk (the cache's
    power of two): 8 MiB against host_limit, while reclaimed_bytes counts
    the block's bytes."""
    for host_limit, reclaimed in ((6 * MiB, False), (8 * MiB, True)):
        device = SimulatedDevice(256 * MiB)
        pool = Pool(device, reclaim=True, limit=16 * MiB, host_limit=host_limit)
        a = pool.malloc(5 * MiB + 4096)         # a 16 MiB segment: the limit
        pool.malloc(10 * MiB)
        if not reclaimed:
            with pytest.raises(OutOfMemoryError):
                pool.malloc(5 * MiB)
            assert pool.is_resident(a) and device.host_used == 0
            continue
        pool.malloc(5 * MiB)                    # a is reclaimed for it
        assert not pool.is_resident(a)
        assert pool.memory_stats()["reclaimed_bytes.current"] == 5 * MiB + 4096
        assert pool._residency.host_bytes == device.host_used == 8 * MiB
        check(pool)


def test_host_cache_limit_caps_the_chunks_of_reclaimed_blocks_too():
    """The host cache holds reclaim's chunks beside Numba's pinned arrays:
    host_cache_limit caps them all (one reclaimed 16 MiB block fills a
    16 MiB cap: the next reclaim is refused, every block as it was), and
    cannot go below the chunks reclaimed blocks hold."""
    from numba_alloc import HostOutOfMemoryError
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB, host_cache_limit="16MiB")
    pool.malloc(15 * MiB)                       # blocks[0]: 16 MiB of chunks
    assert pool.host_cache.in_use_bytes == 16 * MiB
    before = check(pool)
    with pytest.raises(ReclaimError, match="host_cache_limit") as info:
        pool.malloc(15 * MiB)
    assert isinstance(info.value.__cause__, HostOutOfMemoryError)
    after = check(pool)
    assert after["reclaimed"] == before["reclaimed"] and after["segments"] == before["segments"]
    assert [pool.is_resident(b) for b in blocks] == [False, True, True, True]
    with pytest.raises(RuntimeError, match="host_cache_limit 8388608 is below"):
        pool.configure(host_cache_limit="8MiB")
    pool.free(blocks[1])
    with pool.use(blocks[0]):                   # back, with no other reclaimed for it
        assert intact(device, blocks[0], 0)
    assert device.host_used == 16 * MiB and pool._residency.host_bytes == 0
    check(pool)


def test_free_and_free_later_of_a_reclaimed_block():
    device, pool, blocks = filled_pool(64 * MiB, 6, 15 * MiB)
    a, b = blocks[:2]
    assert not pool.is_resident(a) and not pool.is_resident(b)
    pool.free(a)
    assert pool.state_of(a) is DEAD
    with pytest.raises(ValueError, match="not a live block"):
        pool.free(a)
    with pool.lock:
        pool.free_later(b)                      # as a finalizer inside a pool operation
    pool.synchronize()
    stats = check(pool)["stats"]
    assert stats["reclaimed.current"] == 0 and pool.state_of(b) is DEAD
    assert host_memory_returned(device, pool)


def test_pin_brings_a_reclaimed_block_back_and_keeps_it():
    device, pool, blocks = filled_pool(64 * MiB, 5, 15 * MiB)
    a = blocks[0]
    pool.pin(a)
    assert pool.is_resident(a) and pool.pins_of(a) == 1
    assert intact(device, a, 0)
    pool.unpin(a)
    check(pool)


@pytest.mark.parametrize("call", ["host_allocate", "copy_to_host"])
def test_a_failing_host_allocation_or_copy_leaves_the_victim_resident(call):
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB, FaultyDevice)
    before = check(pool)
    device.fail(call)
    with pytest.raises(ReclaimError, match="reclaim") as info:
        pool.malloc(15 * MiB)
    assert isinstance(info.value.__cause__, InjectedFault)
    assert all(pool.is_resident(b) for b in blocks)
    after = check(pool)
    assert after["segments"] == before["segments"] and after["reclaimed"] == []
    for i, block in enumerate(blocks):
        with pool.use(block):
            assert intact(device, block, i)
    assert host_memory_returned(device, pool)


def test_a_failing_copy_back_leaves_the_block_reclaimed_and_intact():
    device, pool, blocks = filled_pool(64 * MiB, 5, 15 * MiB, FaultyDevice)
    a = blocks[0]
    assert not pool.is_resident(a)
    device.fail("copy_from_host")
    with pytest.raises(InjectedFault):
        with pool.use(a):
            pass
    assert not pool.is_resident(a)
    check(pool)
    with pool.use(a):
        assert intact(device, a, 0)
    check(pool)


@pytest.mark.parametrize("call", ["allocate", "release"])
def test_a_driver_call_failing_after_reclaim_made_room_leaves_the_victim_reclaimed_and_intact(call):
    """A request that reclaimed a block, then failed in the driver (its
    segment's cuMemAlloc, or giving back the segment the victim emptied):
    the driver's error; the victim stays in host memory, intact, and comes
    back on its next use; every other block as before (docs/pool.md)."""
    device = FaultyDevice(64 * MiB)
    pool = Pool(device, reclaim=True)
    blocks = [pool.malloc(n * MiB) for n in (20, 20, 10)]
    for i, block in enumerate(blocks):
        with pool.use(block):
            fill(device, block, i)
    check(pool)
    device.fail(call)
    with pytest.raises(InjectedFault):
        pool.malloc(30 * MiB)
    check(pool)
    assert [pool.is_resident(b) for b in blocks] == [False, True, True]
    assert pool.memory_stats()["reclaimed.current"] == 1
    for i, block in enumerate(blocks):
        with pool.use(block):
            assert intact(device, block, i)
    check(pool)


def test_a_bring_back_failing_at_its_second_block_waits_for_the_first_blocks_copies():
    device, pool, blocks = filled_pool(64 * MiB, 6, 15 * MiB, FaultyDevice)
    a, b = blocks[:2]
    assert not pool.is_resident(a) and not pool.is_resident(b)
    pool.free(blocks[4])
    pool.free(blocks[5])
    pool.synchronize()                  # room for both to come back, no reclaim
    device.launch()                     # the device is busy: copies queue behind
    device.fail("copy_from_host", skip=2)   # a's two chunks' copies are queued, b's first fails
    with pytest.raises(InjectedFault):
        with pool.use(a, b):
            pass
    assert device.pending_work == 0     # a's copies ran before its block went back
    in_use = pool.host_cache.in_use_bytes
    pool.free(a)                        # no copy reads its chunks: reusable at once
    assert pool.host_cache.stats()["active_bytes.current"] == in_use - 16 * MiB
    taken = [pool.malloc(15 * MiB) for _ in range(2)]   # the regions a and b were given
    for block in taken:
        device.write(block.address, np.full(block.size, 99, np.uint8))
    device.synchronize()
    assert all((device.read(t.address, t.size) == 99).all() for t in taken)
    check(pool)
    with pool.use(b):
        assert intact(device, b, 1)


def test_memory_a_failed_bring_back_gave_back_gets_no_late_copy():
    """A block's chunks are copied back one by one: when one copy fails,
    those queued before it must not land in the device memory given back,
    which the next request gets (its owner may write it at once: work on a
    stream that does not wait for the copies)."""
    device, pool, blocks = filled_pool(64 * MiB, 5, 15 * MiB, FaultyDevice)
    a = blocks[0]
    assert not pool.is_resident(a)
    pool.free(blocks[4])
    pool.synchronize()                  # one 16 MiB region free: a fits without a reclaim
    device.launch()                     # the device is busy: copies queue behind
    device.fail("copy_from_host", skip=1)   # a's first chunk's copy is queued, the second fails
    with pytest.raises(InjectedFault):
        with pool.use(a):
            pass
    assert device.fired["copy_from_host"] == 1 and not pool.is_resident(a)
    b = pool.malloc(15 * MiB)           # the region a's bring-back gave back
    device.write(b.address, np.full(b.size, 99, np.uint8))
    device.synchronize()
    assert (device.read(b.address, b.size) == 99).all()
    with pool.use(a):
        assert intact(device, a, 0)
    check(pool)


def test_a_bring_back_that_fails_leaves_every_stat_as_before():
    """Blocks carved for a bring-back that then fails go back as if never
    allocated: running totals, peaks, largest allocation and the
    segments' blocks as before, and no observer hears of them."""
    device, pool, blocks = filled_pool(64 * MiB, 6, 15 * MiB, FaultyDevice)
    a, b = blocks[:2]
    pool.free(blocks[4])
    pool.free(blocks[5])
    pool.synchronize()                  # room for both to come back, no reclaim
    heard = []

    class Listener(PoolObserver):
        def on_malloc(self, pool, block):
            heard.append(("malloc", block))

        def on_free(self, pool, block):
            heard.append(("free", block))
    pool.add_observer(Listener())
    before = pool.memory_stats(), check(pool)
    for skip in (0, 1):                 # a's copy fails; b's fails once a's is queued
        device.fail("copy_from_host", skip=skip)
        with pytest.raises(InjectedFault):
            with pool.use(a, b):
                pass
        assert pool.memory_stats() == before[0]
        assert check(pool) == before[1]
        assert heard == []
    with pool.use(a, b):
        assert intact(device, a, 0) and intact(device, b, 1)


@pytest.mark.parametrize("expandable", [False, True])
def test_a_bring_back_that_fails_gives_back_the_segments_grown_for_it(expandable):
    """With every segment returned, a bring-back of two blocks grows for
    each; a copy fails: the segments (or the pages mapped for each block)
    go back to the device, and the pool is as before but for the
    reservations' running totals, which count the device calls made. The
    grown segment stayed reserved; then, with expandable segments, the
    pages of all but the last block mapped."""
    device = FaultyDevice(160 * MiB)
    pool = Pool(device, reclaim=True, limit=48 * MiB, host_limit=256 * MiB,
                expandable_segments=expandable)
    a, b = pool.malloc(8 * MiB), pool.malloc(8 * MiB)
    with pool.use(a, b):
        device.write(a.address, np.full(a.size, 7, np.uint8))
        device.write(b.address, np.full(b.size, 9, np.uint8))
    pool.free(pool.malloc(44 * MiB))    # no room: a and b go to host memory
    pool.synchronize()
    pool.empty_cache()
    assert not pool.is_resident(a) and not pool.is_resident(b)
    assert check(pool)["segments"] == []
    before = {k: v for k, v in pool.memory_stats().items()
              if not k.startswith(("reserved_bytes.", "segment.", "num_device_", "bytes_released"))}
    for skip in (0, 1):                 # a's copy fails; b's, once a's is queued
        device.fail("copy_from_host", skip=skip)
        with pytest.raises(InjectedFault):
            with pool.use(a, b):
                pass
        assert check(pool)["segments"] == []
        assert pool.memory_stats()["reserved_bytes.all.current"] == 0
        assert {k: v for k, v in pool.memory_stats().items() if k in before} == before
        assert device.memory_info()[0] == 160 * MiB
    with pool.use(a, b):
        device.synchronize()
        assert (device.read(a.address, a.size) == 7).all()
        assert (device.read(b.address, b.size) == 9).all()


def test_unpinning_a_reclaimed_block_says_it_is_not_pinned():
    device, pool, blocks = filled_pool(64 * MiB, 5, 15 * MiB)
    a = blocks[0]
    assert not pool.is_resident(a)
    before = check(pool)
    with pytest.raises(ValueError, match="unpin: .* is not pinned .*reclaimed"):
        pool.unpin(a)
    assert not pool.is_resident(a) and check(pool) == before


def test_reset_drops_reclaimed_blocks_and_their_host_memory():
    device, pool, blocks = filled_pool(64 * MiB, 6, 15 * MiB)
    assert device.host_used == 2 * 16 * MiB
    pool.reset()
    assert device.host_used == 0
    assert all(pool.state_of(b) is DEAD for b in blocks)
    with pytest.raises(ValueError):
        pool.free(blocks[0])
    check(pool)


def test_settings_are_checked():
    pool = Pool(SimulatedDevice(64 * MiB))
    with pytest.raises(ValueError, match="reclaim must be true or false"):
        pool.configure(reclaim="maybe")
    with pytest.raises(ValueError, match="host_limit must be a number of bytes"):
        pool.configure(host_limit="lots")
    from numba_alloc.policy.observers import Relocator

    class Refusing(Relocator):                  # glue whose hooks do not fit this Numba
        def reclaim_refused(self):
            return "reclaim under the Numba plugin: no launch hook here"
    pool.relocator = Refusing()
    with pytest.raises(RuntimeError, match="no launch hook here"):
        pool.configure(reclaim=True)
    assert not pool.settings().reclaim


def test_use_refuses_what_is_not_a_live_block():
    pool = Pool(SimulatedDevice(64 * MiB), reclaim=True)
    block = pool.malloc(100)
    pool.free(block)
    with pytest.raises(ValueError, match="use: .* not a live block"):
        with pool.use(block):
            pass
    with pytest.raises(TypeError, match="use: blocks must be Block handles"):
        with pool.use([1, 2]):
            pass
    other = pool.malloc(100)
    stranger = Pool(SimulatedDevice(64 * MiB), reclaim=True).malloc(100)
    before = pool.memory_stats()
    for wrong in (block, stranger):            # after a live block: it is not made active
        with pytest.raises(ValueError, match="use: .* not a live block"):
            with pool.use(other, wrong):
                pass
        assert pool.pins_of(other) == 0 and compat.get_bytes_active(pool) == 0
        assert pool.memory_stats() == before
    with pool.use(other, other):               # repeated: used once
        with pool.use(other):                  # nested
            assert compat.get_bytes_active(pool) == 512
    assert compat.get_bytes_active(pool) == 0 and pool.pins_of(other) == 0
    check(pool)


def test_threads_using_and_freeing_under_pressure_keep_data_and_counters_exact():
    device = SimulatedDevice(96 * MiB)      # each thread holds about 40 MiB
    pool = Pool(device, reclaim=True)
    errors = []

    def work(seed):
        rng = random.Random(seed)
        mine = []
        try:
            for step in range(60):
                if len(mine) < 6 or rng.random() < 0.3:
                    block = pool.malloc(rng.choice([2, 5, 9]) * MiB)
                    value = rng.randrange(1 << 30)
                    with pool.use(block):
                        fill(device, block, value)
                    mine.append((block, value))
                elif rng.random() < 0.2:
                    block, _ = mine.pop(rng.randrange(len(mine)))
                    pool.free(block)
                else:
                    i = rng.randrange(len(mine))
                    block, value = mine[i]
                    with pool.use(block):
                        assert intact(device, block, value)
                        value += 1
                        fill(device, block, value)
                    mine[i] = (block, value)
            for block, value in mine:
                with pool.use(block):
                    assert intact(device, block, value)
                pool.free(block)
        except Exception as e:                  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    pool.synchronize()
    stats = check(pool)["stats"]
    assert stats["reclaimed.current"] == stats["allocation.all.current"] == 0
    assert stats["reclaimed.allocated"] > 0      # the pressure did reclaim
    assert host_memory_returned(device, pool)


# -- fault injection: any backend call may fail, reclaim on ----------------------
from faults import ARRANGED_CALLS, CALLS  # noqa: E402


def _quiet(device):
    """Disarm the device's faults for a moment; returns what to re-arm."""
    armed = dict(device._faults)
    device._faults.clear()
    return armed


@pytest.mark.parametrize("call", [c for c in CALLS if c not in ARRANGED_CALLS])
def test_a_failing_backend_call_never_loses_data_or_breaks_the_counters(call):
    device = FaultyDevice(48 * MiB)
    device.kernel_limit = 0
    pool = Pool(device, reclaim=True, host_limit="128MiB")
    rng = random.Random(CALLS.index(call))
    live = []                   # [block, value]
    for step in range(150):
        if step % 4 == 1 and call not in device._faults:
            device.fail(call, skip=rng.randrange(2))    # armed until it fires
        op = rng.random()
        try:
            if op < 0.4 or not live:
                block = pool.malloc(rng.choice([100, 2 * MiB, 5 * MiB, 9 * MiB]))
                value = rng.randrange(250)
                try:
                    with pool.use(block):
                        armed = _quiet(device)
                        fill(device, block, value)
                        device._faults.update(armed)
                    live.append([block, value])
                except BaseException:
                    pool.free(block)
                    raise
            elif op < 0.6:
                pool.free(live.pop(rng.randrange(len(live)))[0])
            elif op < 0.85:
                entry = rng.choice(live)
                with pool.use(entry[0]):
                    armed = _quiet(device)              # the check reads without faults
                    assert intact(device, entry[0], entry[1])
                    entry[1] += 1
                    fill(device, entry[0], entry[1])
                    device._faults.update(armed)
            elif op < 0.92:
                device.launch()
            else:
                pool.memory_stats()
        except (InjectedFault, ReclaimError, OutOfMemoryError) as e:
            assert not isinstance(e, ReclaimError) or isinstance(e.__cause__, InjectedFault)
        armed = _quiet(device)
        check(pool)
        device._faults.update(armed)
    device.heal()
    live.sort(key=lambda entry: not pool.is_resident(entry[0]))
    for block, value in live:
        with pool.use(block):
            assert intact(device, block, value)
        pool.free(block)
    pool.synchronize()
    stats = check(pool)["stats"]
    assert stats["reclaimed.current"] == stats["allocation.all.current"] == 0
    assert host_memory_returned(device, pool)
    exercised = {"allocate", "event", "record", "query", "host_allocate", "copy_to_host",
                 "copy_from_host"}
    if call in exercised:
        assert device.fired[call], "the campaign never hit the injected failure"


def test_history_traces_and_the_summary_show_reclaims():
    from numba_alloc import memory_summary, record_history
    from numba_alloc.observe.history import BRING_BACK, FREE_RECLAIMED, RECLAIM, history_of
    from numba_alloc.observe.memory_viz import snapshot as viz_snapshot
    from numba_alloc.observe.trace import events_from_history
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device, reclaim=True)
    record_history(True, device=pool)
    blocks = [pool.malloc(15 * MiB) for _ in range(5)]     # the fifth reclaims the first
    first = blocks[0]
    old = first.address
    with pool.use(first):                                  # comes back; another goes
        pass
    pool.free(blocks[1])                                   # reclaimed: no device memory
    entries = list(history_of(pool).entries)
    actions = [e.action for e in entries]
    assert actions.count(RECLAIM) == 2 and actions.count(BRING_BACK) == 1
    assert actions[-1] == FREE_RECLAIMED
    back = next(e for e in entries if e.action == BRING_BACK)
    assert back.old_address == old and back.address == first.address
    assert entries[-1].allocated == pool.memory_stats()["allocated_bytes.all.current"]
    events = events_from_history(entries)                  # RMM log: every free matched
    live = set()
    for ev in events:
        if ev.action == "allocate":
            assert ev.pointer not in live
            live.add(ev.pointer)
        elif ev.action == "deallocate":
            live.remove(ev.pointer)
    assert len(live) == 4
    pool.malloc(15 * MiB)                                  # one more goes to host memory
    viz = viz_snapshot(pool)
    assert any(t["action"] == "free_completed" and t["addr"] == old
               for t in viz["device_traces"][0])
    assert len(pool.snapshot()["reclaimed"]) == 1   # where the reclaimed blocks are
    text = str(memory_summary(pool))
    assert "Reclaimed to host memory" in text and "num_single_reclaims=3" in text


def test_allocated_counts_blocks_on_the_device_and_a_return_counts_as_an_allocation():
    """As docs/stats.md says: a reclaimed block leaves allocated_bytes (counted
    freed) for reclaimed_bytes, and its return counts as an allocation, in
    get_num_allocs too."""
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB)
    size = blocks[0].allocated_size
    pool.malloc(15 * MiB)                               # reclaims the first
    stats = pool.memory_stats()
    assert not pool.is_resident(blocks[0])
    assert stats["allocated_bytes.all.current"] == compat.get_bytes_in_use(pool) == 4 * size
    assert stats["allocated_bytes.all.freed"] == stats["reclaimed_bytes.current"] == size
    assert compat.get_num_allocs(pool) == stats["allocation.all.allocated"] == 5
    with pool.use(blocks[0]):                           # back: another goes
        pass
    stats = pool.memory_stats()
    assert compat.get_num_allocs(pool) == stats["allocation.all.allocated"] == 6
    assert stats["allocated_bytes.all.freed"] == stats["reclaimed_bytes.allocated"] == 2 * size


def test_a_bring_back_failing_part_way_tells_observers_nothing_of_the_blocks_it_took():
    """The blocks a failed bring-back took and gave back were never handed
    out: the history, the memory viewer's trace and a tracker see no free
    of them (they saw no allocation)."""
    from numba_alloc import record_history, track
    from numba_alloc.observe.history import FREE, history_of
    from numba_alloc.observe.memory_viz import snapshot as viz_snapshot
    from viz_model import check_alloc_free_pairs, check_replay
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device, reclaim=True)
    record_history(True, device=pool)
    blocks = [pool.malloc(20 * MiB) for _ in range(3)]
    pool.free(pool.malloc(30 * MiB))            # reclaims all three, then cached
    assert not any(pool.is_resident(b) for b in blocks)
    before = len(history_of(pool).entries)
    with track("bring back", pool) as region:
        with pytest.raises(OutOfMemoryError):   # the third finds no room: none comes back
            with pool.use(*blocks):
                pass
    assert not any(pool.is_resident(b) for b in blocks)
    entries = list(history_of(pool).entries)
    assert FREE not in [e.action for e in entries[before:]]
    assert entries[-1].allocated == compat.memory_allocated(pool) == 0
    assert region.allocations.current == region.bytes.current == 0
    snap = viz_snapshot(pool)
    check_replay(snap)
    check_alloc_free_pairs(snap)
    check(pool)


def test_out_of_memory_says_what_was_active_inactive_and_reclaimed():
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB, host_limit="16MiB")
    pool.malloc(15 * MiB)                       # 16 MiB to host: the limit is reached
    with pool.use(blocks[1]):
        with pytest.raises(OutOfMemoryError) as info:
            pool.malloc(15 * MiB)
    message = info.value.msg
    assert ("Reclaim: 16.00 MiB in use (active), 48.00 MiB inactive, 16.00 MiB reclaimed to "
            "host memory (host_limit 16.00 MiB).") in message
    assert "a larger host_limit could help" in message
    plain = Pool(SimulatedDevice(64 * MiB))
    kept = [plain.malloc(15 * MiB) for _ in range(4)]
    with pytest.raises(OutOfMemoryError, match="reclaim:on could move the inactive ones"):
        plain.malloc(15 * MiB)
    del kept


# -- the policy review: holds, host room, settings ---------------------------------

def test_while_frees_are_held_reclaim_takes_nothing():
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB)
    before = check(pool)
    with pool.hold_frees():                 # a victim's memory would stay pending
        with pytest.raises(OutOfMemoryError):
            pool.malloc(15 * MiB)
    after = check(pool)
    assert after["reclaimed"] == [] and all(pool.is_resident(b) for b in blocks)
    assert after["segments"] == before["segments"] and device.host_used == 0
    assert compat.get_num_full_reclaims(pool) == compat.get_num_single_reclaims(pool) == 0
    pool.malloc(15 * MiB)                   # once released, reclaim works
    assert compat.get_num_single_reclaims(pool) == 1
    check(pool)


def test_chunks_awaiting_their_copies_are_waited_for_and_reused_not_allocated_again():
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB, host_limit="16MiB")
    e = pool.malloc(15 * MiB)               # blocks[0] to host memory: the limit
    pool.free(e)
    with pool.use(blocks[0]):               # back, its copy still queued: its chunks wait
        pass
    assert device.pending_work and device.host_used == 16 * MiB
    assert pool._residency.host_bytes == 0  # the host limit counts reclaimed blocks only
    pool.malloc(15 * MiB)                   # waits for the copy, then reuses the chunks
    assert device.host_used == 16 * MiB and pool.host_cache.stats()["num_host_alloc"] == 2
    assert sum(not pool.is_resident(b) for b in blocks) == 1
    with pool.use(blocks[0]):
        assert intact(device, blocks[0], 0)
    check(pool)


def test_a_host_limit_below_what_reclaimed_blocks_hold_is_refused():
    device, pool, blocks = filled_pool(64 * MiB, 6, 15 * MiB)
    assert device.host_used == 32 * MiB
    with pytest.raises(RuntimeError, match="host_limit .* below the 33554432 bytes"):
        pool.configure(host_limit="16MiB")
    assert pool.settings().host_limit is None
    pool.configure(host_limit="32MiB")      # exactly what they hold
    device.launch()                         # busy: a freed block's chunks wait for it,
    pool.free(blocks[0])                    # the host cache's now, not reclaim's
    pool.configure(host_limit="16MiB")
    assert pool.settings().host_limit == 16 * MiB
    assert device.host_used == 32 * MiB and pool.host_cache.in_use_bytes == 32 * MiB
    check(pool)


def _forty_mib_victim():
    """(device, pool, a, b): a pool with a 64 MiB limit holding ``a``, 40 MiB
    filled with 1 (five 8 MiB chunks in host memory), then ``b``, 20 MiB
    filled with 2, the device synchronized since: a request for 40 MiB
    more takes ``a``, the least recently used."""
    device = FaultyDevice(256 * MiB)
    pool = Pool(device, reclaim=True, limit=64 * MiB)
    a, b = pool.malloc(40 * MiB), pool.malloc(20 * MiB)
    for value, block in enumerate((a, b), 1):
        with pool.use(block):
            fill(device, block, value)
    pool.synchronize()      # the uses' work known done: the request need not wait for it
    return device, pool, a, b


@pytest.mark.parametrize("call, skip", [("host_allocate", 0), ("host_allocate", 3),
                                        ("copy_to_host", 0), ("copy_to_host", 2),
                                        ("copy_to_host", 4), ("synchronize", 0)])
def test_a_reclaim_failing_at_any_chunk_leaves_data_pool_and_stats_as_before(call, skip):
    """The victim's chunks are pinned and copied one by one: a failure at
    any of them (the first, the fourth chunk's pinning; the first, third,
    last chunk's copy), or of the wait for the copies, leaves the victim
    resident and intact, and the pool's
    blocks, segments and stats as before; the chunks taken are the host
    cache's again, reusable once their copies ran; the next try works."""
    device, pool, a, b = _forty_mib_victim()
    before = check(pool)
    device.fail(call, skip=skip)
    with pytest.raises((ReclaimError, InjectedFault)) as info:
        pool.malloc(40 * MiB)
    assert device.fired[call] == 1
    assert isinstance(info.value, InjectedFault) or isinstance(info.value.__cause__, InjectedFault)
    after = check(pool)
    assert pool.is_resident(a) and pool.is_resident(b) and after["reclaimed"] == []
    assert after["segments"] == before["segments"] and after["stats"] == before["stats"]
    assert pool._residency.host_bytes == 0
    device.synchronize()
    assert pool.host_cache.stats()["active_bytes.current"] == 0
    assert intact(device, a, 1) and intact(device, b, 2)
    c = pool.malloc(40 * MiB)               # the next try reclaims a
    assert not pool.is_resident(a) and pool._residency.host_bytes == 40 * MiB
    pool.free(c)
    with pool.use(a):
        assert intact(device, a, 1)
    check(pool)


@pytest.mark.parametrize("skip", [0, 3, 4])
def test_a_bring_back_failing_at_any_chunk_leaves_data_pool_and_stats_as_before(skip):
    """The copy back of the first, fourth or last of the five chunks fails:
    the block stays reclaimed with its chunks, every stat and segment as
    before (the device block taken for it given back once the copies
    queued before have run), and it comes back intact at the next use."""
    device, pool, a, b = _forty_mib_victim()
    pool.free(pool.malloc(40 * MiB))        # a reclaimed; room for it again
    pool.synchronize()
    assert not pool.is_resident(a)
    before = check(pool), pool.memory_stats()
    device.fail("copy_from_host", skip=skip)
    with pytest.raises(InjectedFault):
        with pool.use(a):
            pass
    assert device.fired["copy_from_host"] == 1 and device.pending_work == 0
    assert (check(pool), pool.memory_stats()) == before
    assert not pool.is_resident(a) and pool._residency.host_bytes == 40 * MiB
    with pool.use(a):
        assert intact(device, a, 1)
    assert intact(device, b, 2)
    check(pool)


@pytest.mark.parametrize("call, skip", [("host_allocate", 2), ("copy_to_host", 3),
                                        ("synchronize", 0)])
def test_a_full_reclaim_failing_part_way_leaves_every_block_as_it_was(call, skip):
    device, pool, blocks = filled_pool(64 * MiB, 6, 7 * MiB, FaultyDevice)   # 3 segments, full
    pool.synchronize()
    before = pool.snapshot()
    device.fail(call, skip=skip)            # the third victim, or the wait for the copies
    with pytest.raises((ReclaimError, InjectedFault)) as info:
        pool.malloc(40 * MiB)               # only several victims together make room
    assert device.fired[call] == 1
    assert isinstance(info.value, InjectedFault) or isinstance(info.value.__cause__, InjectedFault)
    after = check(pool)
    assert all(pool.is_resident(b) for b in blocks) and after["reclaimed"] == []
    assert after["segments"] == before["segments"]
    assert after["stats"] == before["stats"]
    device.synchronize()                    # the chunks filled meanwhile are reusable
    assert pool._residency.host_bytes == pool.host_cache.stats()["active_bytes.current"] == 0
    pool.malloc(40 * MiB)                   # the next try works
    for i, block in enumerate(blocks):
        with pool.use(block):
            assert intact(device, block, i)
    check(pool)


def test_a_block_an_observer_frees_during_a_reclaim_stays_pending_until_its_work_ran():
    """Reclaim retires its victims' frees at once (their copies completed);
    a free made meanwhile by an observer (on_reclaim) is a user's free: its
    block is reusable only once the GPU work queued before it has run."""
    from numba_alloc.policy.block import PENDING
    from numba_alloc.policy.observers import PoolObserver
    device, pool, blocks = filled_pool(64 * MiB, 4, 15 * MiB)
    small = pool.malloc(4096)
    freed = []

    class FreesOnReclaim(PoolObserver):
        def on_reclaim(self, p, block):
            if not freed:
                device.launch()         # work on ``small``, queued after reclaim's wait
                pool.free(small)
                freed.append(small)
    pool.add_observer(FreesOnReclaim())
    pool.malloc(15 * MiB)               # reclaims a victim
    assert freed and device.pending_work
    assert pool.state_of(small) is PENDING
    assert pool.malloc(4096).address != small.address
    device.complete()
    check(pool)


def test_reclaim_refused_pinned_host_memory_still_lets_a_defragmentation_serve():
    """The request path goes reclaim, then defragmentation, then out of
    memory: a host cache with no room for reclaim's chunks (its limit, or
    pinned arrays filling it) raised ReclaimError before defragmentation
    was tried. Without defrag, the ReclaimError stands."""
    for defrag in (True, False):
        device = SimulatedDevice(32 * MiB)
        pool = Pool(device, growth=False, defrag=defrag, reclaim=True, host_cache_limit=4 * MiB)
        blocks = [pool.malloc(8 * MiB) for _ in range(4)]
        pool.free(blocks[1])
        pool.free(blocks[3])
        if defrag:
            served = pool.malloc(16 * MiB)          # the two free blocks gathered
            assert served.size == 16 * MiB and pool.count("num_defragmentations") == 1
        else:
            with pytest.raises(ReclaimError, match="no pinned host memory"):
                pool.malloc(16 * MiB)
        assert all(pool.is_resident(b) for b in (blocks[0], blocks[2]))
        check(pool)


@pytest.mark.parametrize("fails", [False, True])
def test_a_bring_back_is_heard_block_by_block_in_order_with_the_victims_it_reclaims(fails):
    """use(a, b): a comes back, then c is reclaimed to make room for b. The
    history hears a's bring-back before c's reclaim, so that its running
    total reaches the peak memory_stats saw (it heard every bring-back at
    the end); a bring-back that fails at b's copy is heard undone (a's
    memory reclaimed), the history's total then the pool's."""
    from numba_alloc.observe.history import recorded_events
    device = FaultyDevice(64 * MiB)
    pool = Pool(device, reclaim=True)
    a, b = pool.malloc(10 * MiB), pool.malloc(30 * MiB)
    c = pool.malloc(40 * MiB)                   # reclaims b
    with pool.use(c):
        pass
    d = pool.malloc(20 * MiB)                   # reclaims a
    pool.free(d)
    pool.synchronize()
    pool.empty_cache()
    assert [pool.is_resident(x) for x in (a, b, c)] == [False, False, True]
    pool.reset_peaks()
    numba_alloc.record_history(device=pool)
    if fails:
        device.fail("copy_from_host", skip=1)   # b's copy back
    with (pytest.raises(InjectedFault) if fails else contextlib.nullcontext()):
        with pool.use(a, b):
            pass
    events = recorded_events(pool)
    stats = pool.memory_stats()
    assert [e.action for e in events if e.action in ("bring_back", "reclaim")][:3] == [
        "bring_back", "reclaim", "bring_back"]
    assert max(e.allocated for e in events) == stats["allocated_bytes.all.peak"] == 50 * MiB
    assert events[-1].allocated == stats["allocated_bytes.all.current"]
    assert [pool.is_resident(x) for x in (a, b)] == [not fails, not fails]
    check(pool)


def test_a_reader_without_the_lock_never_sees_a_block_being_reclaimed_dead():
    """state_of takes no lock: a reader that found the block not reclaimed
    and is held before it reads the block's row, while another thread's
    request reclaims the block (the row released), still says ALLOCATED;
    is_resident says False once it is reclaimed."""
    pool = Pool(SimulatedDevice(64 * MiB), reclaim=True, limit=8 * MiB)
    victim = pool.malloc(6 * MiB)                 # inactive: a request may reclaim it
    arrived, go, seen = threading.Event(), threading.Event(), []
    live_row = pool._live_row

    def held_live_row(block):
        if threading.current_thread().name == "reader":
            arrived.set()
            go.wait()
        return live_row(block)

    pool._live_row = held_live_row
    reader = threading.Thread(target=lambda: seen.append(pool.state_of(victim)), name="reader")
    reader.start()
    assert arrived.wait(60)                     # past the reclaimed check, the row not read
    other = pool.malloc(6 * MiB)                # reclaims the victim meanwhile
    go.set()
    reader.join(60)
    del pool._live_row
    assert pool._is_reclaimed(victim) and not pool.is_resident(victim)
    assert seen == [ALLOCATED]
    pool.free(other)
    pool.free(victim)
    check(pool)


def test_a_refused_reclaim_leaves_no_cycle_that_keeps_the_callers_frames():
    """A ReclaimError raised once a defragmentation could not serve either
    (its pinned host memory refused by host_cache_limit) keeps no
    reference to itself through the frame that raised it: what the
    program's frames held goes as soon as it drops it, without the cyclic
    collector (as an OutOfMemoryError, test_pool.py)."""
    pool = Pool(SimulatedDevice(256 * MiB), limit=64 * MiB, reclaim=True, defrag=True,
                host_cache_limit=16 * MiB)
    kept = pool.malloc(40 * MiB)

    def request(held):
        return pool.malloc(60 * MiB)

    assert_freed_without_the_collector(request, ReclaimError)
    assert pool.is_resident(kept)
    pool.free(kept)
    check(pool)
