"""separate_big_segments (auto by default: in force while defrag is off):
once the pool has reserved 35% of its limit, a large request below 10 MiB
is not carved from the free blocks of a segment reserved for a request of
10 MiB or more while the pool can grow (it gets a segment of its own
size), on the simulated device.

Every test starts from the shape an LSTM's trace failed on without defrag:
a 60 MiB segment holding a 53 MiB block, its 7 MiB rest free. A 6 MiB
block best-fitted into that rest keeps the segment from serving the next
57 MiB request once the 53 MiB block is freed."""

import pytest

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice

from invariants import check

MiB = 1 << 20


def big_segment_with_a_rest(capacity, **settings):
    """A pool on a device of ``capacity`` whose one 60 MiB segment holds a
    53 MiB block and 7 MiB free; the 53 MiB block."""
    pool = Pool(SimulatedDevice(capacity), **settings)
    pool.free(pool.malloc(60 * MiB))
    pool.synchronize()
    return pool, pool.malloc(53 * MiB)


def segments(pool):
    return sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                  for s in check(pool)["segments"])


def test_a_medium_request_reserves_its_own_segment_and_the_big_one_serves_again():
    pool, big = big_segment_with_a_rest(80 * MiB)
    pool.malloc(6 * MiB)
    assert segments(pool) == [(6, 6), (60, 53)]     # a segment of its own size
    pool.free(big)
    pool.synchronize()
    pool.malloc(57 * MiB)                       # the big segment is whole again
    assert segments(pool) == [(6, 6), (60, 57)]
    assert pool.stats.num_device_alloc == 2 and pool.stats.num_ooms == 0


def test_off_the_rest_serves_and_the_next_big_request_runs_out_of_memory():
    pool, big = big_segment_with_a_rest(80 * MiB, separate_big_segments=False)
    pool.malloc(6 * MiB)
    assert segments(pool) == [(60, 60)]      # the rest whole: 1 MiB is no rest worth keeping
    pool.free(big)
    pool.synchronize()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(57 * MiB)                   # 53 MiB free before the 6 MiB block
    check(pool)


def test_once_the_pool_cannot_grow_the_big_segments_rest_serves():
    pool, _ = big_segment_with_a_rest(64 * MiB)       # 4 MiB left: no segment fits
    block = pool.malloc(6 * MiB)
    assert segments(pool) == [(60, 60)]
    assert pool.stats.num_ooms == 0
    pool.free(block)
    pool.synchronize()
    pool.configure(limit=None)                  # the rule is back in force
    assert pool.settings().big_segments_apart
    assert not pool.defragment(6 * MiB).hole    # the rest is passed over again


def test_while_memory_is_plentiful_best_fit_serves_as_in_pytorch():
    pool, _ = big_segment_with_a_rest(1024 * MiB)     # 60 MiB of 1 GiB reserved
    pool.malloc(6 * MiB)
    assert segments(pool) == [(60, 60)]


def test_a_medium_free_block_elsewhere_serves_before_growing():
    pool, _ = big_segment_with_a_rest(100 * MiB)
    pool.free(pool.malloc(8 * MiB))             # a segment of its own, 8 MiB, free
    pool.synchronize()
    allocations = pool.stats.num_device_alloc
    pool.malloc(6 * MiB)                        # from its 8 MiB, not the 7 MiB rest
    assert segments(pool) == [(8, 6), (60, 53)]
    assert pool.stats.num_device_alloc == allocations


def test_defragment_for_a_medium_size_opens_room_only_outside_big_segments():
    pool, big = big_segment_with_a_rest(80 * MiB)
    result = pool.defragment(7 * MiB)           # only the big segment's rest fits
    assert not result.hole and result.blocks_moved == 0
    allocations = pool.stats.num_device_alloc
    pool.malloc(7 * MiB)
    assert pool.stats.num_device_alloc == allocations + 1    # as hole said: reserved
    check(pool)


def test_with_defrag_on_auto_leaves_it_off_and_true_puts_it_in_force():
    pool, _ = big_segment_with_a_rest(80 * MiB, defrag=True)
    assert pool.settings().separate_big_segments is None
    pool.malloc(6 * MiB)
    assert segments(pool) == [(60, 59)]         # (defrag splits off even a 1 MiB rest)
    pool, _ = big_segment_with_a_rest(80 * MiB, defrag=True, separate_big_segments=True)
    pool.malloc(6 * MiB)
    assert segments(pool) == [(6, 6), (60, 53)]


def test_auto_by_default_it_changes_at_any_time_and_bad_values_are_refused():
    pool, _ = big_segment_with_a_rest(80 * MiB)
    assert pool.settings().separate_big_segments is None
    pool.configure(separate_big_segments="off")
    pool.malloc(6 * MiB)
    assert segments(pool) == [(60, 60)]
    with pytest.raises(ValueError, match="separate_big_segments must be auto"):
        pool.configure(separate_big_segments="sometimes")
    assert pool.settings().separate_big_segments is False
    pool.configure(separate_big_segments="auto")
    assert pool.settings().separate_big_segments is None
    pool.configure(separate_big_segments=True)
    pool.configure(separate_big_segments="none")
    assert pool.settings().separate_big_segments is None


def test_out_of_memory_under_the_rule_changes_nothing_and_the_rule_holds_again():
    """A medium request that neither a segment of its own nor the big
    segment's rest can serve: OutOfMemoryError, the pool's segments and
    counters as before (but num_ooms), and the rule, lifted past growing,
    in force again for the next request."""
    pool, big = big_segment_with_a_rest(64 * MiB)     # 4 MiB left on the device
    before = pool.snapshot()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(8 * MiB)                    # the 7 MiB rest is too small too
    after = pool.snapshot()
    assert after["segments"] == before["segments"]
    assert {k: v for k, v in after["stats"].items() if k != "num_ooms"} == \
        {k: v for k, v in before["stats"].items() if k != "num_ooms"}
    assert after["stats"]["num_ooms"] == before["stats"]["num_ooms"] + 1
    assert pool.settings().big_segments_apart
    assert not pool.defragment(6 * MiB).hole    # the rest is passed over again
    pool.malloc(4 * MiB)                        # and a 4 MiB segment of its own fits
    assert segments(pool) == [(4, 4), (60, 53)]
