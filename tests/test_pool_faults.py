"""The pool under failing backend calls, impossible requests and racing
settings: after any error the pool, the live data and the stats are as
before (or, where device memory was already given back, consistent)."""

import copy
import gc
import threading

import pytest

from numba_alloc import DefragmentationError, OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.plugin import registry
from numba_alloc.policy.config import Settings

from error_cycles import assert_freed_without_the_collector
from faults import ARRANGED_CALLS, CALLS, HOST_CALLS, PAGE_CALLS, FaultyDevice, InjectedFault
from invariants import check
from owner import Owner, pattern

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.fixture
def clean_registry(monkeypatch):
    """The plugin's registry with no pool and the default settings."""
    monkeypatch.setattr(registry, "_defaults", Settings())
    monkeypatch.setattr(registry, "_device_settings", {})
    monkeypatch.setattr(registry, "_pools", {})


def live_addresses(owner):
    return [b.address for b, _ in owner.live]


def assert_data_intact(owner):
    for block, seed in owner.live:
        assert (owner.device.read(block.address, block.size) == pattern(seed, block.size)).all()


def scattered(device, pool, segments=3, per_segment=10, size=2 * MiB):
    """``segments`` large segments of ``per_segment`` blocks of ``size``, every
    other block freed: free memory only in holes between live blocks."""
    owner = Owner(device, pool)
    for _ in range(segments * per_segment):
        owner.malloc(size)
    for i in range(segments * per_segment // 2):
        owner.free(i)
    pool.synchronize()
    return owner


# -- A2: defragmentation only when it can help, limit and device included --

@pytest.mark.parametrize("expandable", [False, True])
def test_defrag_does_not_move_or_release_for_a_request_the_limit_forbids(expandable):
    """Nothing moves, nothing goes back, and the device is not even
    synchronized (num_sync_all_streams): every stat but num_ooms as before."""
    device = SimulatedDevice(GiB)
    pool = Pool(device, defrag=True, limit=60 * MiB, expandable_segments=expandable)
    owner = scattered(device, pool)            # 3 x 20 MiB reserved, 30 MiB live
    addresses = live_addresses(owner)
    before = pool.memory_stats()
    # however the 30 MiB live are packed (at best into one 30 MiB segment), a
    # 32 MiB segment for 31 MiB more is over the limit
    with pytest.raises(OutOfMemoryError):
        pool.malloc(31 * MiB)
    with pytest.raises(OutOfMemoryError):
        pool.malloc(100 * MiB)                 # more than the limit itself
    after = pool.memory_stats()
    assert after.pop("num_ooms") == before.pop("num_ooms") + 2
    assert after == before
    assert live_addresses(owner) == addresses
    assert device.releases == 0 and device.unmappings == 0


@pytest.mark.parametrize("expandable", [False, True])
def test_defrag_does_not_move_or_release_for_a_request_device_memory_forbids(expandable):
    device = SimulatedDevice(200 * MiB)
    pool = Pool(device, defrag=True, expandable_segments=expandable)
    owner = scattered(device, pool)
    device.allocate(200 * MiB - 60 * MiB)      # another user takes the rest
    addresses = live_addresses(owner)
    before = pool.memory_stats()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(31 * MiB)                  # packed, the 30 MiB live leave 30: 32 are needed
    after = pool.memory_stats()
    after.pop("num_ooms"), before.pop("num_ooms")
    assert after == before and live_addresses(owner) == addresses
    assert device.releases == 0 and device.unmappings == 0


@pytest.mark.parametrize("settings", [dict(growth=False, limit=16 * MiB),
                                      dict(limit=20 * MiB)])
def test_a_failing_device_query_does_not_refuse_what_moves_would_serve(settings):
    """A request that a move serves within the pool's segments (growth off,
    or the limit reached) needs no device query before defragmenting; one
    that fails does not fail the request."""
    device = FaultyDevice(64 * MiB)
    device.kernel_limit = 0
    pool = Pool(device, defrag=True, **settings)
    owner = Owner(device, pool)
    for _ in range(4 if "growth" in settings else 5):
        owner.malloc(4 * MiB)
    owner.free(3)
    owner.free(1)
    pool.synchronize()
    device.fail("memory_info")
    assert owner.malloc(6 * MiB) is not None
    device.heal()
    assert_data_intact(owner)
    check(pool)


def test_defrag_still_compacts_and_grows_when_that_makes_room():
    device = SimulatedDevice(GiB)
    pool = Pool(device, defrag=True, limit=60 * MiB)
    owner = scattered(device, pool)
    block = pool.malloc(20 * MiB)              # fits once one segment is emptied
    assert block.allocated_size == 20 * MiB
    assert compat.memory_reserved(pool) <= 60 * MiB
    assert_data_intact(owner)
    check(pool)


# -- A3: the garbage-collection threshold and device free memory ----------

def test_gc_threshold_keeps_the_cache_when_device_memory_forbids_the_request():
    device = SimulatedDevice(256 * MiB)
    pool = Pool(device, garbage_collection_threshold=0.1)
    keep = pool.malloc(20 * MiB)
    cached = pool.malloc(16 * MiB)
    pool.free(cached)
    pool.synchronize()
    device.allocate(256 * MiB - 22 * MiB - 16 * MiB - 4 * MiB)   # another user
    before = pool.memory_stats()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(40 * MiB)                  # 4 MiB free + 16 MiB cached < 40 MiB
    after = pool.memory_stats()
    after.pop("num_ooms"), before.pop("num_ooms")
    assert after == before
    assert device.releases == 0
    assert keep.address


def test_gc_threshold_trims_only_once_the_new_segment_is_reserved():
    # the device has room for the new segment: a failing reservation then
    # leaves the cached segment, and every counter, as they were
    device = FaultyDevice(160 * MiB)
    pool = Pool(device, garbage_collection_threshold=0.5)
    keep = [pool.malloc(12 * MiB) for _ in range(6)]
    pool.free(pool.malloc(1000))               # a wholly free small segment, cached
    pool.synchronize()
    before = pool.memory_stats()
    device.fail("allocate")
    with pytest.raises(InjectedFault):
        pool.malloc(30 * MiB)
    assert pool.memory_stats() == before and device.releases == 0
    check(pool)
    block = pool.malloc(30 * MiB)              # then the trim, once reserved
    after = pool.memory_stats()
    assert after["num_cache_trims"] == 1 and device.releases == 1
    assert after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"] + 28 * MiB
    assert block.address and keep
    check(pool)


def test_a_failing_release_in_the_trim_after_growing_serves_the_request():
    device = FaultyDevice(160 * MiB)
    pool = Pool(device, garbage_collection_threshold=0.5)
    keep = [pool.malloc(12 * MiB) for _ in range(6)]
    pool.free(pool.malloc(1000))
    pool.synchronize()
    device.fail("release")
    block = pool.malloc(30 * MiB)              # served; the cached segment stays
    stats = pool.memory_stats()
    assert stats["num_cache_trims"] == 0 and stats["segment.small_pool.current"] == 1
    assert block.address and keep
    check(pool)


# -- A4: hole=True means malloc(n) succeeds without reserving --------------

def test_a_hole_in_an_oversize_block_is_no_hole_for_a_smaller_request():
    device = SimulatedDevice(GiB)
    pool = Pool(device, max_split_size_mb=21)
    big = pool.malloc(30 * MiB)                # an oversize segment of its own
    pool.free(big)
    pool.synchronize()
    result = pool.defragment(4 * MiB)
    allocations = device.allocations
    pool.malloc(4 * MiB)
    assert result.hole == (device.allocations == allocations)
    assert not result.hole


@pytest.mark.parametrize("max_split_mb", [None, 21, 40])
def test_hole_true_always_means_malloc_reserves_nothing(max_split_mb):
    import random
    rng = random.Random(max_split_mb or 0)
    for _ in range(12):
        device = SimulatedDevice(GiB)
        device.kernel_limit = 0                # NumPy copies: the kernel is tested elsewhere
        pool = Pool(device, max_split_size_mb=max_split_mb)
        owner = Owner(device, pool)
        for _ in range(rng.randrange(4, 24)):
            owner.malloc(rng.choice([600 * KiB, 2 * MiB, 3 * MiB, 7 * MiB, 12 * MiB, 25 * MiB]))
        for _ in range(len(owner.live) // 2):
            owner.free(rng.randrange(len(owner.live)))
        pool.synchronize()
        nbytes = rng.choice([512, 700 * KiB, 2 * MiB, 5 * MiB, 11 * MiB, 22 * MiB, 30 * MiB])
        result = pool.defragment(nbytes)
        allocations = device.allocations
        pool.malloc(nbytes)
        if result.hole:
            assert device.allocations == allocations, (max_split_mb, nbytes)
        assert_data_intact(owner)
        check(pool)


# -- A6, A7, A9 and every backend call failing -------------------------------

def test_a_reset_failing_inside_hold_frees_leaves_frees_reusable_afterwards():
    device = FaultyDevice(GiB)
    pool = Pool(device)
    pool.malloc(100)
    with pool.hold_frees():
        device.fail("synchronize")
        with pytest.raises(InjectedFault):
            pool.reset()
    block = pool.malloc(4 * KiB)
    address = block.address
    pool.free(block)
    pool.synchronize()
    assert pool.malloc(4 * KiB).address == address     # the free became reusable
    check(pool)


def test_a_failing_release_keeps_the_segment_and_its_stats():
    device = FaultyDevice(GiB)
    pool = Pool(device)
    pool.free(pool.malloc(30 * MiB))
    pool.synchronize()
    device.fail("release")
    before = pool.memory_stats()
    with pytest.raises(InjectedFault):
        pool.empty_cache()
    assert pool.memory_stats() == before
    assert check(pool)["segments"]
    pool.empty_cache()                          # the driver works again: no leak
    assert compat.memory_reserved(pool) == 0 and device.memory_info()[0] == GiB
    check(pool)


def _two_blocks_to_move():
    """(device, pool, owner): three 20 MiB segments of ten 2 MiB blocks, the
    first left with two, which a compaction moves to the two others."""
    device = FaultyDevice(GiB)
    pool = Pool(device)
    owner = Owner(device, pool)
    for _ in range(30):
        owner.malloc(2 * MiB)
    for i in (20, 10, 7, 6, 5, 4, 3, 2, 1, 0):
        owner.free(i)
    pool.synchronize()
    return device, pool, owner


def test_a_copy_failing_mid_phase_counts_nothing_moved():
    device, pool, owner = _two_blocks_to_move()
    device.fail("copy")                        # the second launch of the phase fails
    with pytest.raises(Exception, match="injected"):
        pool.defragment()
    assert compat.get_bytes_defragged(pool) == 0
    assert compat.get_num_defragmentations(pool) == 0
    assert_data_intact(owner)
    result = pool.defragment()
    assert result.bytes_moved > 0
    assert compat.get_bytes_defragged(pool) == result.bytes_moved
    assert compat.get_num_defragmentations(pool) == 1
    assert_data_intact(owner)
    check(pool)


def test_a_failed_copy_keeps_no_reference_cycle():
    """A defragmentation whose copy fails leaves its callers' frames (and
    what they held) to go at once, without the cyclic collector: the
    device's error keeps no reference to itself through a frame."""
    device, pool, owner = _two_blocks_to_move()
    device.fail("copy")

    def request(held):
        return pool.defragment()

    assert_freed_without_the_collector(request, DefragmentationError)
    assert_data_intact(owner)
    check(pool)


@pytest.mark.parametrize("skip", [0, 1])       # the first of its two releases, the second
def test_a_release_failing_after_a_compaction_leaves_the_pool_whole(skip):
    """defragment()'s full compaction gives back the segments left free,
    those it empties and those already free: a refused release raises the
    driver's error with the moves done, the segment refused (and those not
    yet given back) stay free and counted, every block keeps its data, and
    a later empty_cache() gives them back."""
    device = FaultyDevice(GiB)
    pool = Pool(device)
    owner = Owner(device, pool)
    for _ in range(30):                        # three 20 MiB segments of ten blocks
        owner.malloc(2 * MiB)
    big = pool.malloc(30 * MiB)                # and a segment of its own, freed
    pool.free(big)
    for i in (20, 10, 7, 6, 5, 4, 3, 2, 1, 0):
        owner.free(i)
    pool.synchronize()
    device.fail("release", skip=skip)
    with pytest.raises(Exception, match="injected"):
        pool.defragment()
    assert compat.get_bytes_defragged(pool) > 0
    assert_data_intact(owner)
    check(pool)
    free, total = device.memory_info()
    assert compat.memory_reserved(pool) == total - free
    assert pool._free_segments()                # the refused one at least
    pool.empty_cache()
    free, total = device.memory_info()
    assert not pool._free_segments() and compat.memory_reserved(pool) == total - free
    assert_data_intact(owner)
    check(pool)


def test_two_pools_on_one_device_count_their_own_moves():
    device = SimulatedDevice(GiB)
    a, b = Pool(device), Pool(device)
    owner = scattered(device, a, segments=2, per_segment=4)
    other = scattered(device, b, segments=3, per_segment=4)
    moved_a = a.defragment().bytes_moved
    moved_b = b.defragment().bytes_moved
    assert 0 < moved_a != moved_b > 0
    assert compat.get_bytes_defragged(a) == a.memory_stats()["bytes_defragged"] == moved_a
    assert compat.get_bytes_defragged(b) == b.memory_stats()["bytes_defragged"] == moved_b
    assert compat.get_num_defragmentations(a) == compat.get_num_defragmentations(b) == 1
    assert_data_intact(owner)
    assert_data_intact(other)


def _exercise(pool, owner, rng):
    """One random pool operation."""
    op = rng.random()
    if op < 0.45 or not owner.live:
        owner.malloc(rng.choice([100, 3 * KiB, 600 * KiB, 2 * MiB, 5 * MiB, 12 * MiB, 24 * MiB]))
    elif op < 0.8:
        owner.free(rng.randrange(len(owner.live)))
    elif op < 0.84:
        owner.device.launch()
    elif op < 0.9:
        pool.empty_cache()
    elif op < 0.95:
        pool.defragment(rng.choice([None, 4 * MiB]))
    elif op < 0.975:
        pool.memory_stats()
    else:
        compat.get_bytes_reservable_limit(pool)


# reclaim off; a call only a test arranges is failed there (test_expandable_segments)
@pytest.mark.parametrize("call", [c for c in CALLS if c not in HOST_CALLS + ARRANGED_CALLS])
@pytest.mark.parametrize("settings", [dict(defrag=True, limit=120 * MiB),
                                      dict(growth=False, limit=96 * MiB, defrag=True),
                                      dict(garbage_collection_threshold=0.5, max_split_size_mb=24)])
def test_a_failing_backend_call_leaves_the_pool_consistent(call, settings):
    import random
    rng = random.Random(CALLS.index(call))
    device = FaultyDevice(160 * MiB)
    device.kernel_limit = 0                    # NumPy copies: the kernel is tested elsewhere
    pages = call in PAGE_CALLS and "max_split_size_mb" not in settings
    pool = Pool(device, expandable_segments=pages, **settings)
    owner = Owner(device, pool)
    for step in range(120):
        if step % 5 == 2:                      # armed until it fires
            device.fail(call, skip=rng.randrange(3))
        try:
            _exercise(pool, owner, rng)
        except InjectedFault:
            pass
        except Exception as e:                 # DefragmentationError wraps the fault
            assert isinstance(e.__cause__, InjectedFault), e
        try:
            check(pool)
        except InjectedFault:                  # reading the stats met the fault
            check(pool)
        if step % 10 == 0:
            assert_data_intact(owner)
    assert_data_intact(owner)
    device.heal()
    for i in reversed(range(len(owner.live))):
        owner.free(i)
    pool.empty_cache()
    check(pool)
    exercised = {"record", "query", "synchronize"}
    if settings.get("growth", True):           # an arena is reserved once and kept
        exercised |= {"allocate", "release", "memory_info"}
    if pages and settings.get("growth", True):
        exercised |= set(PAGE_CALLS)
    if call in exercised:
        assert device.fired[call], "the campaign never hit the injected failure"


@pytest.mark.parametrize("call", [c for c in CALLS if c not in ARRANGED_CALLS])
def test_a_failing_backend_call_with_reclaim_on_loses_no_byte_and_leaks_nothing(call):
    """Reclaim's host calls too: after every failure the pool is consistent,
    every block's data is intact (read inside a use, which brings it back),
    and once healed and emptied no device or host memory is held."""
    import random
    from owner import pattern
    rng = random.Random(100 + CALLS.index(call))
    device = FaultyDevice(160 * MiB)
    device.kernel_limit = 0
    pool = Pool(device, reclaim=True, limit=48 * MiB, host_limit=256 * MiB,
                expandable_segments=call in PAGE_CALLS)
    live = []                                  # (block, seed)

    def intact(block, seed):
        with pool.use(block):
            device.synchronize()
            return (device.read(block.address, block.size) == pattern(seed, block.size)).all()
    for step in range(200):    # (150 stopped meeting an event query once placement changed)
        if step % 5 == 2:
            device.fail(call, skip=rng.randrange(3))
        op = rng.random()
        try:
            if (op < 0.45 or not live) and sum(b.size for b, _ in live) < 160 * MiB:
                size = rng.choice([100, 3 * KiB, 600 * KiB, 2 * MiB, 5 * MiB, 12 * MiB, 24 * MiB])
                block = pool.malloc(size)
                with pool.use(block):
                    device.write(block.address, pattern(step, size))
                live.append((block, step))
            elif op < 0.6 or not live:
                block, _ = live[rng.randrange(len(live))]
                pool.free(block)
                live = [(b, s) for b, s in live if b is not block]
            elif op < 0.85:
                assert intact(*live[rng.randrange(len(live))])
            elif op < 0.9:
                device.launch()
            elif op < 0.95:
                pool.synchronize()
            else:
                pool.empty_cache()
                pool.host_cache.empty()        # reclaim's chunks go back to the device
        except (InjectedFault, OutOfMemoryError):
            pass
        except Exception as e:                 # ReclaimError wraps the fault
            assert isinstance(e.__cause__, InjectedFault), e
        device.heal_later = dict(device._faults)
        device.heal()
        check(pool)
        device._faults.update(device.heal_later)
    device.heal()
    assert all(intact(block, seed) for block, seed in live)
    for block, _ in live:
        pool.free(block)
    pool.synchronize()
    pool.empty_cache()
    pool.synchronize()
    device.synchronize()
    pool.host_cache.empty()
    check(pool)
    assert device.memory_info()[0] == device.capacity
    assert device.host_used == 0 and pool.memory_stats()["reclaimed.current"] == 0
    assert device.fired[call] or call == "copy", "the campaign never hit the injected failure"


# -- A8: growth off, the arena's first reservation ----------------------------

def test_an_arena_that_fails_at_first_use_is_retried_on_the_next_request():
    device = FaultyDevice(64 * MiB)
    pool = Pool(device, growth=False, limit=32 * MiB)
    device.fail("allocate")
    with pytest.raises(InjectedFault):
        pool.malloc(100)
    assert not pool.initialized
    pool.configure(limit=16 * MiB)              # not reserved yet: still allowed
    block = pool.malloc(100)
    assert compat.memory_reserved(pool) == 16 * MiB and block.address
    check(pool)


def test_an_arena_that_finds_no_memory_at_first_use_is_retried():
    device = SimulatedDevice(64 * MiB)
    other = device.allocate(63 * MiB)
    pool = Pool(device, growth=False, limit=32 * MiB)
    before = pool.memory_stats()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(100)
    assert not pool.initialized
    after = pool.memory_stats()
    after.pop("num_ooms"), before.pop("num_ooms")
    assert after == before
    device.release(other)
    pool.malloc(100)
    assert compat.memory_reserved(pool) == 32 * MiB


@pytest.mark.parametrize("limit", [1 * MiB, 2 * MiB - 512, "1MiB"])
def test_a_limit_below_the_arena_granularity_is_refused_when_set(limit):
    with pytest.raises(ValueError, match="limit"):
        Pool(SimulatedDevice(GiB), growth=False, limit=limit)
    pool = Pool(SimulatedDevice(GiB), growth=False)
    with pytest.raises(ValueError, match="limit"):
        pool.configure(limit=limit)
    with pytest.raises(ValueError, match="limit"):
        Pool(SimulatedDevice(GiB), limit=limit).configure(growth=False)


def test_a_fractional_limit_below_the_arena_granularity_is_refused():
    with pytest.raises(ValueError, match="limit"):
        Pool(SimulatedDevice(64 * MiB), growth=False, limit=0.01)


@pytest.mark.parametrize("growth", [True, False])
@pytest.mark.parametrize("limit", [1e-300, 1e-12, 511 / GiB])
def test_a_fractional_limit_below_the_smallest_block_is_refused(limit, growth):
    """As an int limit below 512 is: it left every request out of memory."""
    with pytest.raises(ValueError, match=r"limit .* of this device is \d+ bytes, below the"):
        Pool(SimulatedDevice(GiB), growth=growth, limit=limit)
    pool = Pool(SimulatedDevice(GiB), growth=growth)
    pool.malloc(MiB)
    before = pool.memory_stats()
    with pytest.raises(ValueError, match="limit"):
        pool.configure(limit=limit)
    assert pool.settings() == Settings(growth=growth) and pool.memory_stats() == before


def test_the_smallest_fractional_limit_is_the_smallest_block():
    assert Pool(SimulatedDevice(GiB), limit=512 / GiB).limit_bytes() == 512


def test_configure_refuses_a_fractional_limit_below_the_smallest_block_changing_nothing(
        clean_registry):
    pool = registry.create_pool(SimulatedDevice(GiB))
    with pytest.raises(ValueError, match="below the 512 bytes of the smallest block"):
        registry.configure(limit=1e-300, defrag=True)
    assert registry.settings() == Settings() and pool.settings() == Settings()
    with pytest.raises(ValueError, match="below the 512 bytes of the smallest block"):
        registry.set_device_settings(0, limit=1e-12)
    assert registry.settings(0) == Settings() and registry._device_settings == {}


# -- A12: configure validates and applies under one lock ----------------------

def test_registry_configure_holds_the_pools_locks_until_applied(clean_registry, monkeypatch):
    pool = registry.create_pool(SimulatedDevice(GiB))
    pool.malloc(100)
    racer_done = threading.Event()
    result = []

    def racer():
        try:
            result.append(pool.malloc(40 * MiB))
        except OutOfMemoryError as e:
            result.append(e)
        racer_done.set()

    commit = Pool.commit

    def commit_after_a_racing_malloc(self, settings):
        thread = threading.Thread(target=racer)
        thread.start()
        racer_done.wait(0.5)                   # with the lock held, the racer waits
        commit(self, settings)

    monkeypatch.setattr(Pool, "commit", commit_after_a_racing_malloc)
    registry.configure(limit=30 * MiB)
    racer_done.wait(5)
    assert compat.memory_reserved(pool) <= compat.get_bytes_limit(pool) == 30 * MiB
    assert isinstance(result[0], OutOfMemoryError)
    check(pool)


# -- A13 ------------------------------------------------------------------

def test_bytes_limit_does_not_change_at_first_use():
    pool = Pool(SimulatedDevice(GiB), limit=4 * GiB)
    before = compat.get_bytes_limit(pool)
    pool.malloc(1)
    assert before == compat.get_bytes_limit(pool) == GiB


@pytest.mark.parametrize("bad, error", [(-5, ValueError), ("abc", TypeError),
                                        (1.5, TypeError), (True, TypeError)])
def test_defragment_checks_its_argument_before_first_use(bad, error):
    pool = Pool(SimulatedDevice(GiB))
    with pytest.raises(error, match="nbytes"):
        pool.defragment(bad)
    pool.malloc(1)
    with pytest.raises(error, match="nbytes"):
        pool.defragment(bad)


def test_a_copied_handle_is_refused_and_the_original_still_frees():
    pool = Pool(SimulatedDevice(GiB))
    block = pool.malloc(1000)
    other = pool.malloc(1000)
    duplicate = copy.copy(block)
    with pytest.raises(ValueError, match="not a live block"):
        pool.free(duplicate)
    with pytest.raises(ValueError, match="not a live block"):
        pool.pin(duplicate)
    pool.free(block)
    pool.free(other)
    pool.synchronize()
    assert compat.memory_allocated(pool) == 0
    check(pool)


def test_an_index_returning_a_non_int_is_refused():
    class Weird:
        def __index__(self):
            return 1.5

    pool = Pool(SimulatedDevice(GiB))
    with pytest.raises(TypeError):
        pool.malloc(Weird())
    assert compat.memory_allocated(pool) == 0


def test_reset_handles_refuse_a_later_free_and_reset_docstring_says_so():
    pool = Pool(SimulatedDevice(GiB))
    block = pool.malloc(100)
    pool.reset()
    with pytest.raises(ValueError):
        pool.free(block)
    assert "ValueError" in Pool.reset.__doc__


def test_the_hot_path_leaves_no_cyclic_garbage_of_ours():
    from numba_alloc.policy.block import Block, Segment
    device = SimulatedDevice(GiB)
    pool = Pool(device)
    live = [pool.malloc(s) for s in (100, 5000, 2 * MiB, 3 * MiB)]
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for i in range(2000):
            a = pool.malloc(512 * (1 + i % 7))
            b = pool.malloc(3 * MiB + 512 * (i % 5))
            pool.free(a)
            pool.free(b)
            if i % 50 == 0:
                pool.synchronize()
        pool.free(live.pop())
        pool.empty_cache()
        gc.collect()
        ours = [o for o in gc.garbage if isinstance(o, (Block, Segment))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


def test_reset_drops_the_events_of_the_old_context():
    device = FaultyDevice(GiB)
    pool = Pool(device)
    pool.free(pool.malloc(100))
    pool.synchronize()                          # one event made, kept for reuse
    pool.reset()
    pool.free(pool.malloc(100))
    pool.synchronize()
    assert device.calls["event"] == 2           # a new context gets new events


# -- found by the adversarial campaign ---------------------------------------

@pytest.mark.parametrize("skip", [0, 1])
def test_configure_is_all_or_nothing_when_the_device_cannot_be_asked(skip):
    device = FaultyDevice(GiB)
    pool = Pool(device, limit=512 * MiB)
    pool.malloc(100)
    device.fail("memory_info", skip=skip)
    try:
        pool.configure(limit=4 * MiB, defrag=True)
    except InjectedFault:
        assert pool.settings() == Settings(limit=512 * MiB)
    else:
        assert pool.settings() == Settings(limit=4 * MiB, defrag=True)
    device.heal()
    limit = compat.get_bytes_limit(pool)
    assert limit == pool.settings().limit
    with pytest.raises(OutOfMemoryError):
        pool.malloc(limit)                      # the limit in force is the one reported
    assert compat.memory_reserved(pool) <= limit


def test_registry_configure_is_all_or_nothing_when_one_device_fails(clean_registry):
    ok = registry.create_pool(SimulatedDevice(GiB, device_id=0))
    failing_device = FaultyDevice(GiB, device_id=1)
    failing = registry.create_pool(failing_device)
    ok.malloc(1), failing.malloc(1)
    for change in (dict(defrag=True), dict(limit=256 * MiB, garbage_collection_threshold=0.5)):
        failing_device.fail("memory_info")
        before = registry.settings(), ok.settings(), failing.settings()
        try:
            registry.configure(**change)
        except InjectedFault:
            assert (registry.settings(), ok.settings(), failing.settings()) == before
        else:
            wanted = Settings(**{**before[0].__dict__, **change})
            assert registry.settings() == ok.settings() == failing.settings() == wanted
        failing_device.heal()


def test_registry_configure_refuses_what_some_device_could_not_use(clean_registry):
    registry.set_device_settings(1, growth=False)
    with pytest.raises(ValueError, match="max_split_size_mb"):
        registry.configure(max_split_size_mb=100)
    assert registry.settings(1) == Settings(growth=False)


def test_registry_configure_sets_every_device_alike(clean_registry):
    for device_id in (0, 1):
        registry.set_device_settings(device_id, limit=100 * MiB, defrag=True)
    registry.create_pool(SimulatedDevice(GiB, device_id=0))
    registry.configure(limit=200 * MiB)
    assert registry.settings(0).limit == registry.settings(1).limit == 200 * MiB
    assert registry.settings(1).defrag                      # other keys stay the device's
    registry.create_pool(SimulatedDevice(GiB, device_id=0))
    assert registry.settings(0).limit == 200 * MiB


def test_defragmentation_never_splits_a_free_block_of_max_split_size():
    device = SimulatedDevice(GiB)
    device.kernel_limit = 0
    pool = Pool(device, max_split_size_mb=21)
    owner = Owner(device, pool)
    big = pool.malloc(30 * MiB)
    for _ in range(10):
        owner.malloc(2 * MiB)
    pool.free(big)
    for i in (8, 6, 4, 2, 0):
        owner.free(i)
    pool.synchronize()
    pool.defragment(release=False)              # (release=True would give its segment back)
    pool.defragment(6 * MiB)
    allocations = device.allocations
    pool.malloc(30 * MiB)                       # the oversize block is still whole
    assert device.allocations == allocations
    assert_data_intact(owner)
    check(pool)


def test_a_defragmentation_leaves_no_transient_peak():
    device = SimulatedDevice(GiB)
    device.kernel_limit = 0
    pool = Pool(device)
    owner = Owner(device, pool)
    for _ in range(20):
        owner.malloc(2 * MiB)
    for i in (15, 2, 0):
        owner.free(i)
    pool.synchronize()
    compat.reset_peak_memory_stats(pool)
    before = pool.memory_stats()["inactive_split_bytes.all.current"]
    pool.defragment(6 * MiB)
    stats = pool.memory_stats()
    assert stats["inactive_split_bytes.all.peak"] == max(
        before, stats["inactive_split_bytes.all.current"])


def test_an_out_of_memory_whose_report_fails_counts_nothing():
    device = FaultyDevice(64 * MiB)
    pool = Pool(device, limit=32 * MiB)
    pool.malloc(100)
    device.fail("memory_info")
    with pytest.raises(InjectedFault):
        pool.malloc(40 * MiB)
    assert pool.memory_stats()["num_ooms"] == 0


def test_only_pool_observers_can_be_attached():
    pool = Pool(SimulatedDevice(GiB))
    with pytest.raises(TypeError, match="PoolObserver"):
        pool.add_observer(object())
    pool.malloc(10)
    assert compat.memory_allocated(pool) == 512


def test_the_simulated_device_takes_numpy_counts():
    import numpy as np
    device = SimulatedDevice(GiB)
    device.launch()
    device.launch()
    device.complete(np.int64(2))
    assert device.pending_work == 0


# -- giving back a block nobody used: as if never allocated --------------------

@pytest.mark.parametrize("seed", range(12))
def test_a_block_given_back_unused_leaves_every_stat_and_block_as_before(seed):
    """Pool._untake after _malloc_undoable (what a failed bring-back or heap
    creation does): memory_stats, running totals, peaks and largest
    allocation included, and the segments' blocks are exactly as before, in
    pools of every shape (split or exact fits, neighbours free or not, both
    pool kinds, max_split_size, growth off), several blocks given back in
    the reverse order."""
    import random
    rng = random.Random(seed)
    settings = [{}, dict(max_split_size_mb=24), dict(growth=False, limit=96 * MiB)][seed % 3]
    device = SimulatedDevice(1 * GiB)
    pool = Pool(device, **settings)
    sizes = [100, 512, 3 * KiB, 600 * KiB, MiB + 1, 2 * MiB, 5 * MiB, 12 * MiB, 24 * MiB]
    live = [pool.malloc(rng.choice(sizes[:7])) for _ in range(30)]
    for _ in range(15):
        pool.free(live.pop(rng.randrange(len(live))))
    pool.synchronize()          # nothing pending: taking retires nothing
    for _ in range(4):
        before = (pool.memory_stats(), pool.snapshot()["segments"])
        with pool.lock:
            taken = []
            for _ in range(rng.randint(1, 3)):
                try:
                    taken.append(pool._malloc_undoable(rng.choice(sizes)))
                except OutOfMemoryError:    # (growth off): counted in num_ooms
                    before[0]["num_ooms"] += 1
                    break
            grew = pool.stats.current("segment") > before[0]["segment.all.current"]   # (settles no peak)
            for block, undo in reversed(taken):     # (a mark after them: nothing grown goes)
                pool._untake(block, undo, pool._growth_mark())
        stats = check(pool)
        after = pool.memory_stats()
        if not grew:
            assert after == before[0]
            assert stats["segments"] == before[1]
        else:                   # a segment reserved on the way stays cached, free
            growth = ("reserved_bytes.", "segment.", "oversize_segments.", "num_device_alloc")
            assert {k: v for k, v in after.items() if not k.startswith(growth)} == {
                k: v for k, v in before[0].items() if not k.startswith(growth)}
        for block, _ in taken:
            with pytest.raises(ValueError, match="not a live block"):
                pool.free(block)
        live.append(pool.malloc(rng.choice(sizes[:7])))


def test_blocks_given_back_out_of_order_keep_the_counters_consistent():
    """_untake in any order (another operation may have changed a block's
    neighbours meanwhile): the counters agree with a recount after each, and
    once all are back every current figure is as before."""
    device = SimulatedDevice(1 * GiB)
    pool = Pool(device)
    keep = [pool.malloc(3 * KiB) for _ in range(4)]
    pool.free(keep[1])
    pool.synchronize()
    before = pool.memory_stats()
    with pool.lock:
        taken = [pool._malloc_undoable(size) for size in (2 * KiB, 600 * KiB, 5 * MiB, 2 * KiB)]
        for block, undo in taken:           # the order they were taken in (no growth given back)
            pool._untake(block, undo, pool._growth_mark())
            check(pool)
    after = pool.memory_stats()
    growth = ("reserved_bytes.", "segment.")     # a large segment reserved on the way
    assert {k: v for k, v in after.items() if k.endswith(".current") and not k.startswith(growth)
            } == {k: v for k, v in before.items()
                  if k.endswith(".current") and not k.startswith(growth)}


def test_a_retry_whose_first_release_fails_counts_nothing():
    """malloc returning cached segments to retry: when the driver fails the
    first release, nothing was retried, so num_alloc_retries (like every
    other stat) is as before; whether one segment would make room or only
    all of them."""
    device = FaultyDevice(64 * MiB)
    pool = Pool(device)
    keep = pool.malloc(24 * MiB)
    cached = [pool.malloc(16 * MiB) for _ in range(2)]     # two 20 MiB segments
    for block in cached:
        pool.free(block)
    pool.synchronize()
    before = pool.memory_stats(), pool.snapshot()["segments"]
    for nbytes in (20 * MiB, 30 * MiB):         # one segment makes room, or only both do
        device.fail("release")
        with pytest.raises(InjectedFault):
            pool.malloc(nbytes)
        assert (pool.memory_stats(), pool.snapshot()["segments"]) == before
    assert pool.malloc(30 * MiB).address and keep.address
    assert pool.memory_stats()["num_alloc_retries"] == 1
    check(pool)


# -- issue 37, defect 3: configure is all or nothing with a failing host free ---

def _cached_host_blocks(device, pool, count=3):
    """``count`` 1 MiB pinned host blocks, given back and cached."""
    blocks = [pool.host_cache.take(MiB) for _ in range(count)]
    for block in blocks:
        pool.host_cache.give_back(block)
    device.synchronize()
    assert pool.host_cache.stats()["cached_bytes"] == count * MiB


def _keeps_whole(pool, device):
    """Whether the pool acts on keep_whole_segments: a 30 MiB request next
    to a wholly free 100 MiB segment, half the pool's limit, gets a segment
    of its own."""
    allocations = device.allocations
    block = pool.malloc(30 * MiB)
    own = device.allocations > allocations
    pool.free(block)
    pool.synchronize()
    pool.empty_cache()
    pool.free(pool.malloc(100 * MiB))
    pool.synchronize()
    return own


def test_configure_with_a_failing_host_free_changes_no_setting():
    device = FaultyDevice(GiB)
    pool = Pool(device, limit=200 * MiB)
    pool.free(pool.malloc(100 * MiB))
    pool.synchronize()
    _cached_host_blocks(device, pool)
    before = pool.settings()
    device.fail("host_release", skip=1)        # the second block returned fails
    with pytest.raises(InjectedFault):
        pool.configure(host_cache_limit=MiB, keep_whole_segments=False)
    assert pool.settings() == before
    assert pool.host_cache.stats()["host_cache_limit"] == -1
    assert _keeps_whole(pool, device)          # the core's flag is the setting's
    pool.configure(host_cache_limit=MiB, keep_whole_segments=False)
    assert pool.settings() == Settings(host_cache_limit=MiB, keep_whole_segments=False,
                                       limit=200 * MiB)
    assert pool.host_cache.stats()["allocated_bytes.current"] <= MiB
    assert not _keeps_whole(pool, device)
    check(pool)


def test_registry_configure_with_a_failing_host_free_changes_no_pool(clean_registry):
    first = registry.create_pool(SimulatedDevice(GiB, device_id=0))
    failing_device = FaultyDevice(GiB, device_id=1)
    failing = registry.create_pool(failing_device)
    for device, pool in ((first.backend, first), (failing_device, failing)):
        pool.malloc(1)
        _cached_host_blocks(device, pool)
    failing_device.fail("host_release")
    with pytest.raises(InjectedFault):
        registry.configure(host_cache_limit=MiB, defrag=True)
    assert registry.settings() == first.settings() == failing.settings() == Settings()
    assert first.host_cache.stats()["host_cache_limit"] == -1
    registry.configure(host_cache_limit=MiB, defrag=True)
    assert registry.settings() == first.settings() == failing.settings() == \
        Settings(host_cache_limit=MiB, defrag=True)
