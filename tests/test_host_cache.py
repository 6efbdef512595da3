"""The pinned host memory cache (policy/host_cache.py) on a simulated device:
reuse after GPU work, sizes and flags, the host_cache_limit, running out of
host memory, resets. The Numba path (cuda.pinned_array, mapped_array under
the plugin) runs over the driver stand-in in test_standin.py."""

import threading

import pytest

import numba_alloc
from numba_alloc import HostOutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.policy.host_cache import HostCache, block_size

MiB = 1 << 20
MAPPED = 2          # flags are opaque to the cache: any int


def make(host_capacity=None):
    device = SimulatedDevice(64 * MiB)
    device.host_capacity = host_capacity
    return device, Pool(device)


def test_sizes_round_to_powers_of_two_from_512():
    assert [block_size(n) for n in (0, 1, 512, 513, 4096, 5000, MiB + 1)] == \
        [512, 512, 512, 1024, 4096, 8192, 2 * MiB]


def test_a_block_is_reused_once_the_work_before_its_return_is_done():
    device, pool = make()
    cache = pool.host_cache
    first = cache.take(3000)
    device.launch()                     # GPU work that may use the block
    cache.give_back(first)
    other = cache.take(1000)            # another size: a new block, nothing waited for
    assert other is not first and device.pending_work == 1
    assert cache.take(4000) is first    # its size (4096): reused after the work
    assert device.pending_work == 0
    stats = numba_alloc.host_memory_stats(pool)
    assert stats["num_host_alloc"] == 2 and stats["allocations.current"] == 2
    assert stats["active_requests.allocated"] == 3 and stats["active_requests.current"] == 2
    assert stats["allocated_bytes.current"] == 4096 + 1024 and stats["cached_bytes"] == 0


def test_a_block_whose_work_is_done_is_reused_without_waiting():
    device, pool = make()
    cache = pool.host_cache
    block = cache.take(MiB)
    cache.give_back(block)
    cache.stats()                       # the next operation covers the return: nothing queued
    device.launch()                     # queued after: not waited for
    assert cache.take(MiB) is block
    assert device.pending_work == 1
    assert cache.stats()["num_host_alloc"] == 1


def test_flags_and_sizes_keep_their_own_blocks():
    device, pool = make()
    cache = pool.host_cache
    plain, mapped = cache.take(4096), cache.take(4096, MAPPED)
    cache.give_back(plain)
    cache.give_back(mapped)
    device.synchronize()
    assert cache.take(4096, MAPPED) is mapped and cache.take(4096) is plain
    assert cache.take(2048) not in (plain, mapped)
    assert cache.stats()["mapped_bytes.current"] == 0     # flags alone do not make it mapped
    cache.give_back(mapped)
    device.synchronize()
    assert cache.take(4096, MAPPED, mapped=True) is mapped
    assert cache.stats()["mapped_bytes.current"] == 4096
    states = sorted((r["size"], r["flags"], r["state"]) for r in pool.snapshot()["host_blocks"])
    assert states == [(2048, 0, "in_use"), (4096, 0, "in_use"), (4096, MAPPED, "in_use")]


def test_a_block_given_back_twice_is_cached_once():
    device, pool = make()
    cache = pool.host_cache
    block = cache.take(4096)
    cache.give_back(block)
    cache.give_back(block)
    device.synchronize()
    assert cache.take(4096) is block and cache.take(4096) is not block
    states = sorted((r["size"], r["flags"], r["state"]) for r in pool.snapshot()["host_blocks"])
    assert states == [(4096, 0, "in_use"), (4096, 0, "in_use")]


def test_the_limit_caps_what_is_held_and_a_limit_below_the_blocks_in_use_is_refused():
    device, pool = make()
    cache = pool.host_cache
    held = cache.take(8 * MiB)
    spare = cache.take(4 * MiB)
    cache.give_back(spare)
    device.synchronize()
    before = numba_alloc.host_memory_stats(pool)
    with pytest.raises(RuntimeError, match="host_cache_limit 4194304 is below the 8388608"):
        pool.configure(host_cache_limit="4MiB")
    assert pool.settings().host_cache_limit is None
    assert numba_alloc.host_memory_stats(pool) == before
    pool.configure(host_cache_limit="10MiB")        # the cached 4 MiB goes back
    stats = numba_alloc.host_memory_stats(pool)
    assert stats["allocated_bytes.current"] == 8 * MiB and stats["num_host_free"] == 1
    assert stats["host_cache_limit"] == 10 * MiB
    with pytest.raises(HostOutOfMemoryError, match="host_cache_limit of 10485760"):
        cache.take(4 * MiB)
    with pytest.raises(HostOutOfMemoryError, match="more than the host_cache_limit of 10485760 "
                                                   "by itself; raise host_cache_limit"):
        cache.take(16 * MiB)                        # no freeing would make room for it
    assert numba_alloc.host_memory_stats(pool)["allocated_bytes.current"] == 8 * MiB
    cache.give_back(held)
    assert cache.take(4 * MiB).size == 4 * MiB     # the cached 8 MiB went back to fit it
    stats = numba_alloc.host_memory_stats(pool)
    assert stats["allocated_bytes.current"] == 4 * MiB and stats["num_host_free"] == 2


def test_out_of_host_memory_returns_the_cache_then_raises_naming_it():
    device, pool = make(host_capacity=6 * MiB)
    cache = pool.host_cache
    a = cache.take(4 * MiB)
    cache.give_back(a)
    device.synchronize()
    b = cache.take(2 * MiB)                         # 4 + 2 MiB: fits
    cache.give_back(b)
    device.synchronize()
    c = cache.take(MiB)                             # no room: the cache goes back first
    assert c.size == MiB and cache.stats()["num_host_free"] == 2
    with pytest.raises(HostOutOfMemoryError, match="the host has no room"):
        cache.take(8 * MiB)
    assert cache.stats()["allocated_bytes.current"] == MiB
    device.host_capacity = None
    with pytest.raises(HostOutOfMemoryError, match="the host has no room"):
        cache.take(1 << 80)                         # more than the host could ever give
    assert cache.stats()["allocated_bytes.current"] == MiB


def test_empty_and_reset_return_cached_blocks_and_keep_those_in_use():
    device, pool = make()
    cache = pool.host_cache
    kept, dropped = cache.take(MiB), cache.take(MiB)
    cache.give_back(dropped)
    device.synchronize()
    assert numba_alloc.empty_host_cache(pool) == MiB
    assert device.host_used == MiB
    again = cache.take(MiB)
    cache.give_back(again)
    pool.reset()                                    # the device idle: nothing waits
    assert device.host_used == MiB and cache.stats()["active_requests.current"] == 1
    cache.give_back(kept)
    device.synchronize()
    assert cache.stats()["cached_bytes"] == MiB


def test_peaks_and_totals_reset():
    device, pool = make()
    cache = pool.host_cache
    cache.give_back(cache.take(MiB))
    device.synchronize()
    numba_alloc.reset_peak_host_memory_stats(pool)
    numba_alloc.reset_accumulated_host_memory_stats(pool)
    stats = cache.stats()
    assert stats["active_bytes.peak"] == 0 and stats["allocated_bytes.peak"] == MiB
    assert stats["num_host_alloc"] == 0 and stats["host_alloc_time.count"] == 0
    assert stats["allocations.allocated"] == stats["allocations.freed"] == 0


def test_threads_taking_and_giving_back_keep_the_counts_exact():
    device, pool = make()
    cache = pool.host_cache
    start = threading.Barrier(4)

    def work():
        start.wait()
        for i in range(200):
            cache.give_back(cache.take(512 << (i % 4)))
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    device.synchronize()
    stats = cache.stats()
    assert stats["active_requests.current"] == 0 and stats["active_bytes.current"] == 0
    assert stats["active_requests.allocated"] == 800
    assert stats["allocated_bytes.current"] == device.host_used == stats["cached_bytes"]


def test_host_cache_limit_is_a_setting_with_clear_errors():
    with pytest.raises(ValueError, match="host_cache_limit"):
        Pool(SimulatedDevice(MiB), host_cache_limit="lots")
    pool = Pool(SimulatedDevice(MiB), host_cache_limit="1MiB")
    assert pool.host_cache.stats()["host_cache_limit"] == MiB
    assert HostCache(pool.backend).stats()["host_cache_limit"] == -1


@pytest.mark.parametrize("nbytes, error", [(-1, ValueError), (True, TypeError), (1.5, TypeError),
                                           (None, TypeError)])
def test_a_bad_request_names_nbytes_and_takes_nothing(nbytes, error):
    _, pool = make()
    before = pool.host_cache.stats()
    with pytest.raises(error, match="nbytes"):
        pool.host_cache.take(nbytes)
    assert pool.host_cache.stats() == before


def test_blocks_given_back_stay_given_back_when_their_event_cannot_be_made():
    from faults import FaultyDevice, InjectedFault
    device = FaultyDevice(64 * MiB)
    cache = Pool(device).host_cache
    cache.give_back(cache.take(MiB))
    device.fail("event")                        # cuEventCreate
    with pytest.raises(InjectedFault):
        cache.stats()
    device.synchronize()
    stats = cache.stats()                       # the next call covers and caches it
    assert stats["active_bytes.current"] == 0 and stats["cached_bytes"] == MiB
    assert cache.empty() == MiB and device.host_used == 0


def test_a_host_allocation_that_fails_counts_nowhere():
    from faults import FaultyDevice, InjectedFault
    device = FaultyDevice(64 * MiB)
    cache = Pool(device).host_cache
    before = cache.stats()
    device.fail("host_allocate")                # cuMemHostAlloc
    with pytest.raises(InjectedFault):
        cache.take(MiB)
    assert cache.stats() == before and device.host_used == 0     # host_alloc_time too
    cache.take(MiB)
    stats = cache.stats()
    assert stats["num_host_alloc"] == stats["host_alloc_time.count"] == 1


def test_a_host_free_that_fails_keeps_the_block_cached_for_the_next_try():
    from faults import FaultyDevice, InjectedFault
    device = FaultyDevice(64 * MiB)
    cache = Pool(device).host_cache
    cache.give_back(cache.take(MiB))
    before = cache.stats()
    device.fail("host_release")                 # cuMemFreeHost
    with pytest.raises(InjectedFault):
        cache.empty()
    assert cache.stats() == before and device.host_used == MiB    # host_free_time too
    assert cache.empty() == MiB
    assert cache.stats()["allocated_bytes.current"] == 0 and device.host_used == 0


@pytest.mark.parametrize("room", ["host_cache_limit", "host memory"])
def test_a_request_over_the_limit_waits_for_blocks_given_back_before_refusing(room):
    device, pool = make(host_capacity=MiB if room == "host memory" else None)
    if room == "host_cache_limit":
        pool.configure(host_cache_limit=MiB)
    cache = pool.host_cache
    first = cache.take(512 * 1024)
    device.launch()                     # an async copy into it, still queued
    cache.give_back(first)              # the array dropped
    block = cache.take(MiB)             # its room is needed: wait, then return it
    assert block.size == MiB and device.pending_work == 0
    assert cache.stats()["allocated_bytes.current"] == MiB


def test_a_block_given_back_while_the_event_is_recorded_waits_for_its_own_work(monkeypatch):
    # give_back takes no lock (finalizers): a block another thread gives back
    # after the event is recorded is not covered by that event
    from numba_alloc.backends.simulated import SimulatedEvent
    device, pool = make()
    cache = pool.host_cache
    a, b = cache.take(4096), cache.take(4096)
    cache.give_back(a)
    record = SimulatedEvent.record

    def record_then_another_thread_gives_b_back(event):
        record(event)
        monkeypatch.setattr(SimulatedEvent, "record", record)
        device.launch()                 # work on b, queued after the event
        cache.give_back(b)
    monkeypatch.setattr(SimulatedEvent, "record", record_then_another_thread_gives_b_back)
    cache.stats()
    got = [cache.take(4096), cache.take(4096)]
    assert a in got
    assert b not in got or device.pending_work == 0     # reused only once its work is done


def test_a_request_the_host_cannot_meet_raises_host_out_of_memory_and_counts_nothing():
    """Issue 37, defect 4: the simulated device counted the bytes before NumPy
    had them, so take(2**62) raised NumPy's MemoryError and left host_used at
    2**62."""
    device, pool = make()
    cache = pool.host_cache
    kept = cache.take(MiB)
    before = cache.stats()
    with pytest.raises(HostOutOfMemoryError, match="the host has no room"):
        cache.take(1 << 62)
    assert device.host_used == MiB and cache.stats() == before    # the timers too
    cache.give_back(kept)


def test_a_block_given_back_while_frees_are_held_is_not_handed_out_again():
    """Numba's defer_cleanup (the plugin's, through Pool.hold_frees): work
    on a stream no event of the cache covers may still read a pinned block
    given back, so it is not reused until the hold ends; the pool's device
    frees were held already, its pinned blocks were not."""
    device, pool = make()
    cache = pool.host_cache
    first = cache.take(MiB)
    with pool.hold_frees():
        cache.give_back(first)
        device.synchronize()
        other = cache.take(MiB)                     # a new block: the first is held
        assert other.buffer is not first.buffer
        assert cache.stats()["num_host_alloc"] == 2
    cache.give_back(other)
    device.synchronize()
    again = cache.take(MiB)                         # the hold is over: cached blocks serve
    assert again.buffer is first.buffer or again.buffer is other.buffer
    assert cache.stats()["num_host_alloc"] == 2
