"""track(): scoped statistics of a region, nested as RMM's counters."""

import threading

import pytest

import numba_alloc

from workload import GiB, KiB, MiB, make_pool


def test_a_region_counts_current_peak_and_total():
    _, pool = make_pool()
    before = pool.malloc(3 * KiB)                 # allocated before the region
    with numba_alloc.track("step", pool) as t:
        a = pool.malloc(1000)                     # 1 KiB
        b = pool.malloc(5 * KiB)
        pool.free(a)
        c = pool.malloc(2 * KiB)
        pool.free(before)                         # a free of an older block counts too
    assert (t.bytes.current, t.bytes.peak, t.bytes.total) == (4 * KiB, 7 * KiB, 8 * KiB)
    assert (t.allocations.current, t.allocations.peak, t.allocations.total) == (1, 2, 3)
    assert t.reserved.total == 0                  # the segment was reserved before
    pool.malloc(MiB)                              # after the region: not counted
    assert t.bytes.total == 8 * KiB
    assert b.state == c.state == "allocated"


def test_a_region_counts_segments_reserved_and_returned():
    _, pool = make_pool()
    with numba_alloc.track("grow", pool) as t:
        block = pool.malloc(5 * MiB)              # a 20 MiB segment
        pool.free(block)
        pool.empty_cache()                        # returned
    assert (t.reserved.current, t.reserved.peak, t.reserved.total) == (0, 20 * MiB, 20 * MiB)


def test_regions_nest_and_the_outer_sees_the_inner():
    _, pool = make_pool()
    with numba_alloc.track("epoch", pool) as outer:
        keep = pool.malloc(MiB)
        with numba_alloc.track("forward", pool) as inner:
            tmp = [pool.malloc(2 * MiB) for _ in range(3)]
            for block in tmp:
                pool.free(block)
        with numba_alloc.track("backward", pool) as second:
            pool.free(pool.malloc(512))
    assert outer.children == [inner, second] and inner.children == []
    assert (inner.bytes.peak, inner.bytes.current) == (6 * MiB, 0)
    assert (outer.bytes.peak, outer.bytes.current) == (7 * MiB, MiB)
    assert outer.allocations.total == 1 + 3 + 1
    report = outer.report().splitlines()
    assert report[0] == "epoch:"
    assert report[1] == "  bytes:       peak 7.00 MiB, current +1.00 MiB, total 7.00 MiB"
    assert report[4] == "  forward:" and report[8] == "  backward:"
    assert report[5] == "    bytes:       peak 6.00 MiB, current +0 B, total 6.00 MiB"
    assert outer.as_dict()["children"][0]["bytes"] == {"current": 0, "peak": 6 * MiB,
                                                       "total": 6 * MiB}
    pool.free(keep)


def test_a_region_that_frees_more_than_it_allocates_goes_negative():
    _, pool = make_pool()
    blocks = [pool.malloc(KiB) for _ in range(4)]
    with numba_alloc.track("cleanup", pool) as t:
        for block in blocks:
            pool.free(block)
    assert (t.bytes.current, t.bytes.peak, t.bytes.total) == (-4 * KiB, 0, 0)
    assert "current -4.00 KiB" in t.report()


def test_a_block_reclaimed_to_host_memory_counts_as_freed_until_it_comes_back():
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(GiB), reclaim=True, limit=96 * MiB)
    with numba_alloc.track("reclaim", pool) as t:
        blocks = [pool.malloc(40 * MiB) for _ in range(4)]     # two are reclaimed
        assert t.bytes.current == pool.memory_stats()["allocated_bytes.all.current"]
        assert t.bytes.peak == pool.memory_stats()["allocated_bytes.all.peak"] == 80 * MiB
        with pool.use(blocks[0]):
            assert t.bytes.current == pool.memory_stats()["allocated_bytes.all.current"]
        for block in blocks:
            pool.free(block)
    assert (t.bytes.current, t.allocations.current) == (0, 0)
    assert t.bytes.peak == pool.memory_stats()["allocated_bytes.all.peak"]


def test_a_region_counts_the_frees_finalizers_hand_over_while_it_runs_and_no_others():
    """Numba's arrays are freed by finalizers through free_later(), which an
    observed pool defers to its next operation: the region's end and start
    are such operations."""
    _, pool = make_pool()
    with numba_alloc.track("outer", pool):
        older = pool.malloc(KiB)
        pool.free_later(older)                    # deferred: the pool is observed
        with numba_alloc.track("inner", pool) as inner:
            block = pool.malloc(2 * KiB)
            pool.free_later(block)                # the region's last pool call
    a = inner.allocations
    assert (a.current, a.peak, a.total) == (0, 1, 1)
    assert (inner.bytes.current, inner.bytes.peak) == (0, 2 * KiB)
    assert pool.current("allocated_bytes") == 0


def test_a_region_counts_allocations_from_every_thread():
    _, pool = make_pool()
    with numba_alloc.track("threads", pool) as t:
        workers = [threading.Thread(target=lambda: [pool.malloc(KiB) for _ in range(50)])
                   for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert t.allocations.total == 200 and t.bytes.current == 200 * KiB


def test_regions_in_other_threads_are_not_children():
    _, pool = make_pool()
    inner = []
    with numba_alloc.track("main", pool) as outer:
        def worker():
            with numba_alloc.track("worker", pool) as t:
                inner.append(t)
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert outer.children == [] and inner[0].name == "worker"


def test_the_region_detaches_even_when_its_block_raises():
    device, pool = make_pool()
    with pytest.raises(numba_alloc.OutOfMemoryError):
        with numba_alloc.track("too big", pool) as t:
            pool.malloc(device.capacity + 1)
    pool.malloc(KiB)
    assert t.allocations.total == 0


@pytest.mark.parametrize("name, error", [(None, TypeError), ("", ValueError), (3, TypeError)])
def test_a_region_needs_a_name(name, error):
    _, pool = make_pool()
    with pytest.raises(error, match="name"):
        with numba_alloc.track(name, pool):
            pass


def test_a_region_is_read_at_one_instant_from_another_thread():
    """as_dict, report and repr read a region's counters under the pool's
    lock, under which the pool changes them: never bytes of one moment and
    allocations of another."""
    _, pool = make_pool()
    with numba_alloc.track("region", pool) as region:
        keep = pool.malloc(MiB)
        results = []
        with pool.lock:                 # a pool operation under way
            reader = threading.Thread(target=lambda: results.append(
                (region.as_dict(), region.report(), repr(region))))
            reader.start()
            reader.join(0.3)
            assert reader.is_alive() and not results     # waits for the operation
            region.bytes.add(512)       # the operation's two changes, as on_malloc makes them
            region.allocations.add(1)
        reader.join()
        figures, text, summary = results[0]
        assert figures["bytes"]["current"] == MiB + 512
        assert figures["allocations"]["current"] == 2
        assert "current +2" in text and "current +2" in summary
        region.bytes.remove(512)
        region.allocations.remove(1)
        pool.free(keep)


def test_a_block_reclaimed_before_the_region_and_freed_in_it_changes_nothing():
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(GiB), reclaim=True, limit=96 * MiB)
    blocks = [pool.malloc(40 * MiB) for _ in range(4)]
    gone = [b for b in blocks if not pool.is_resident(b)]
    allocated = pool.memory_stats()["allocated_bytes.all.current"]
    with numba_alloc.track("late free", pool) as t:
        pool.free(gone[0])
    assert pool.memory_stats()["allocated_bytes.all.current"] == allocated
    assert (t.bytes.current, t.allocations.current) == (0, 0)
