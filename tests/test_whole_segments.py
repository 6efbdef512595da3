"""keep_whole_segments: once the pool has reserved 35% of its limit, a large
request does not split a wholly free cached segment much larger than its
own, on the simulated device."""

import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice  # noqa: E402

from invariants import check  # noqa: E402

MiB = 1 << 20


def cached_segment(capacity, **settings):
    """A pool on a device of ``capacity`` holding one wholly free 100 MiB
    segment in its cache (at least 35% of the device's memory: scarce);
    separate_big_segments off unless ``settings`` say otherwise (its own
    tests are test_separate_big_segments.py)."""
    pool = Pool(SimulatedDevice(capacity), **{"separate_big_segments": False, **settings})
    pool.free(pool.malloc(100 * MiB))
    pool.synchronize()
    return pool


def segments(pool):
    return sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                  for s in check(pool)["segments"])


def test_a_small_large_request_gets_its_own_segment_and_the_big_one_stays_whole():
    pool = cached_segment(200 * MiB)
    pool.malloc(5 * MiB)
    assert segments(pool) == [(20, 5), (100, 0)]
    assert pool.stats.num_device_alloc == 2


def test_off_it_is_carved_from_the_big_segment_as_pytorch_does():
    pool = cached_segment(200 * MiB, keep_whole_segments=False)
    pool.malloc(5 * MiB)
    assert segments(pool) == [(100, 5)]


def test_while_memory_is_plentiful_a_cached_segment_serves_as_in_pytorch():
    pool = cached_segment(1024 * MiB)           # 100 MiB reserved of 1 GiB
    pool.malloc(5 * MiB)
    assert segments(pool) == [(100, 5)]
    assert pool.stats.num_device_alloc == 1


def test_once_35_percent_of_the_limit_is_reserved_the_big_segment_stays_whole():
    pool = cached_segment(1024 * MiB)
    pool.malloc(420 * MiB)                      # a segment of its own: 520 MiB reserved
    pool.malloc(5 * MiB)
    assert segments(pool) == [(20, 5), (100, 0), (420, 420)]


@pytest.mark.parametrize("limit_mib, after", [(300, [(100, 5)]),              # 33% reserved
                                               (280, [(20, 5), (100, 0)])])    # 36%
def test_scarcity_is_judged_against_the_pools_limit(limit_mib, after):
    pool = cached_segment(1024 * MiB, limit=limit_mib * MiB)
    pool.malloc(5 * MiB)
    assert segments(pool) == after


def test_a_segment_at_most_20_mib_above_the_requests_own_still_serves():
    pool = cached_segment(200 * MiB)
    pool.malloc(80 * MiB)                      # its own segment: 80 MiB
    assert segments(pool) == [(100, 80)]


def test_without_room_on_the_device_the_big_segment_goes_back_for_one_of_the_requests_size():
    pool = cached_segment(104 * MiB)           # 4 MiB left: no segment for 5 MiB fits
    pool.malloc(5 * MiB)
    assert segments(pool) == [(20, 5)]
    assert pool.stats.num_alloc_retries == 1
    assert pool.backend.memory_info()[0] == 84 * MiB


def test_off_the_big_segment_is_split_and_stays_reserved():
    pool = cached_segment(104 * MiB, keep_whole_segments=False)
    pool.malloc(5 * MiB)
    assert segments(pool) == [(100, 5)]
    assert pool.backend.memory_info()[0] == 4 * MiB


def test_it_can_change_at_any_time_and_bad_values_are_refused():
    pool = cached_segment(200 * MiB)
    pool.configure(keep_whole_segments=False)
    pool.malloc(5 * MiB)
    assert segments(pool) == [(100, 5)]
    pool.configure(keep_whole_segments="on")
    assert pool.settings().keep_whole_segments is True
    with pytest.raises(ValueError, match="keep_whole_segments"):
        pool.configure(keep_whole_segments="sometimes")
    assert pool.settings().keep_whole_segments is True


def test_a_small_request_the_small_pool_cannot_grow_for_is_carved_from_the_large_pool():
    pool = Pool(SimulatedDevice(20 * MiB))
    large = pool.malloc(5 * MiB)                # a 20 MiB segment: the device is full
    small = pool.malloc(4096)
    segment, = check(pool)["segments"]
    assert segment["segment_type"] == "large" and segment["allocated_size"] == 5 * MiB + 4096
    assert small.address == large.address + 5 * MiB
    pool.free(small)
    pool.free(large)
    pool.synchronize()
    assert check(pool)["segments"][0]["allocated_size"] == 0


def test_defragment_hole_says_what_malloc_does_beside_a_segment_kept_whole():
    """Issue 37, defect 2: core.fits ignored keep_whole_segments, so
    defragment(30 MiB).hole was True and malloc(30 MiB) then reserved a
    segment."""
    pool = cached_segment(200 * MiB)
    result = pool.defragment(30 * MiB)
    allocations = pool.stats.num_device_alloc
    pool.malloc(30 * MiB)
    assert not result.hole and pool.stats.num_device_alloc == allocations + 1
    pool.configure(keep_whole_segments=False)
    pool.free(pool.malloc(30 * MiB))            # now it is carved from the big segment
    pool.synchronize()
    assert pool.defragment(30 * MiB).hole


def _hole_is_malloc_without_reserving(sizes, frees, nbytes, keep_whole):
    device = SimulatedDevice(2048 * MiB)
    device.kernel_limit = 0                     # NumPy copies: the kernel is tested elsewhere
    pool = Pool(device, keep_whole_segments=keep_whole)
    blocks = [pool.malloc(size) for size in sizes]
    for i in sorted(set(i % len(blocks) for i in frees), reverse=True):
        pool.free(blocks.pop(i))
    pool.synchronize()
    result = pool.defragment(nbytes)
    allocations = device.allocations
    pool.malloc(nbytes)
    assert result.hole == (device.allocations == allocations)
    check(pool)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([3 * MiB, 7 * MiB, 12 * MiB, 30 * MiB, 64 * MiB,
                                       100 * MiB, 150 * MiB]), min_size=1, max_size=10),
       frees=st.lists(st.integers(0, 20), max_size=10),
       nbytes=st.sampled_from([2 * MiB, 5 * MiB, 11 * MiB, 30 * MiB, 45 * MiB, 90 * MiB]),
       keep_whole=st.booleans())
def test_defragment_hole_is_true_exactly_when_malloc_then_reserves_nothing(sizes, frees, nbytes,
                                                                           keep_whole):
    _hole_is_malloc_without_reserving(sizes, frees, nbytes, keep_whole)
