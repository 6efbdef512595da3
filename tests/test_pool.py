"""The pool policy on the simulated device."""

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest

from numba_alloc import Block, OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.policy import core
from numba_alloc.policy.sizes import segment_size

from error_cycles import assert_freed_without_the_collector
from invariants import check

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def make_pool(capacity=1 * GiB, **settings):
    device = SimulatedDevice(capacity)
    return device, Pool(device, **settings)


def blocks_of(pool):
    return [b for seg in pool.snapshot()["segments"] for b in seg["blocks"]]


# -- sizes and pools ------------------------------------------------------

@pytest.mark.parametrize("nbytes, allocated", [(1, 512), (512, 512), (513, 1024),
                                               (1000, 1024), (MiB, MiB)])
def test_requests_round_up_to_512(nbytes, allocated):
    _, pool = make_pool()
    block = pool.malloc(nbytes)
    assert block.size == nbytes
    assert block.allocated_size == allocated
    assert block.address % 512 == 0
    check(pool)


def test_zero_byte_request_gets_a_distinct_block():
    _, pool = make_pool()
    a, b = pool.malloc(0), pool.malloc(0)
    assert a.size == 0 and a.allocated_size == 512
    assert a.address != b.address
    pool.free(a)
    pool.free(b)
    check(pool)


def test_small_and_large_pools_and_their_segment_sizes():
    _, pool = make_pool()
    pool.malloc(100)
    pool.malloc(MiB)            # still small
    pool.malloc(MiB + 1)        # large, 20 MiB segment
    pool.malloc(21 * MiB + 1)   # large, its own segment rounded to 2 MiB
    stats = check(pool)["stats"]
    assert stats["segment.small_pool.current"] == 1
    assert stats["reserved_bytes.small_pool.current"] == 2 * MiB
    assert stats["segment.large_pool.current"] == 2
    assert stats["reserved_bytes.large_pool.current"] == 20 * MiB + 22 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB


@pytest.mark.parametrize("request_mib, segment_mib", [(7, 14), (6, 18), (3.5, 18), (5, 20),
                                                     (1.5, 20), (9.5, 20), (2.25, 18)])
def test_a_segment_below_10_mib_holds_a_whole_number_of_its_request(request_mib, segment_mib):
    _, pool = make_pool()
    nbytes = int(request_mib * MiB)
    blocks = [pool.malloc(nbytes) for _ in range(20 * MiB // nbytes)]
    segments = check(pool)["segments"]
    assert [s["total_size"] for s in segments] == [segment_mib * MiB]   # one, full
    assert segments[0]["total_size"] - segments[0]["allocated_size"] < 2 * MiB
    pool.malloc(nbytes)
    assert len(check(pool)["segments"]) == 2
    assert segment_size(nbytes) == segment_mib * MiB
    assert segment_size(nbytes, fitted=False) == 20 * MiB
    del blocks


def test_unfitted_a_segment_below_10_mib_is_20_mib_as_pytorchs():
    _, pool = make_pool()
    pool._core.mv[core.H_FIT_SEGMENTS] = 0
    pool.malloc(7 * MiB)
    assert [s["total_size"] for s in check(pool)["segments"]] == [20 * MiB]


def test_best_fit_takes_the_smallest_free_block_that_fits():
    device, pool = make_pool()
    # carve one small segment into free holes of 8, 3 and 5 KiB between live blocks
    holes = {}
    keep = []
    for size in (8, 3, 5):
        holes[size] = pool.malloc(size * KiB)
        keep.append(pool.malloc(512))
    addresses = {size: b.address for size, b in holes.items()}
    for b in holes.values():
        pool.free(b)
    pool.synchronize()
    got = pool.malloc(3 * KiB - 100)
    assert got.address == addresses[3]
    got = pool.malloc(4 * KiB)
    assert got.address == addresses[5]
    check(pool)


def test_split_remainders_follow_the_pool_rules():
    _, pool = make_pool()
    a = pool.malloc(1000)                  # small: 2 MiB segment split, rest free
    segs = pool.snapshot()["segments"]
    assert [b["state"] for b in segs[0]["blocks"]] == ["active_allocated", "inactive"]
    b = pool.malloc(19 * MiB + 512 * KiB)  # large: remainder 512 KiB <= 1 MiB: not split
    assert b.allocated_size == 20 * MiB
    c = pool.malloc(2 * MiB)               # new 20 MiB segment, remainder 18 MiB split
    assert c.allocated_size == 2 * MiB
    check(pool)


def test_blocks_of_max_split_size_are_never_split_nor_given_to_small_requests():
    _, pool = make_pool(max_split_size_mb=32)
    big = pool.malloc(64 * MiB)
    pool.free(big)
    pool.synchronize()
    other = pool.malloc(20 * MiB)            # below max_split: must not take the 64 MiB block
    assert other.address != big.address
    too_big = pool.malloc(40 * MiB)          # oversize, but the 64 MiB block wastes < 20 MiB? no: 24 MiB
    assert too_big.address != big.address
    fits = pool.malloc(50 * MiB)             # oversize, 64 < 50 + 20: reuses it whole, unsplit
    assert fits.address == big.address and fits.allocated_size == 64 * MiB
    stats = check(pool)["stats"]
    assert stats["max_split_size"] == 32 * MiB
    assert stats["oversize_allocations.current"] == 2
    assert stats["oversize_segments.current"] == 2


def test_a_segment_of_max_split_size_made_for_a_smaller_request_counts_as_oversize():
    """As PyTorch counts them, by the segment's size: a request just under
    max_split_size gets a segment (and a block) of that size."""
    _, pool = make_pool(max_split_size_mb=24)
    block = pool.malloc(24 * MiB - 512)
    stats = check(pool)["stats"]
    assert block.allocated_size == 24 * MiB
    assert stats["oversize_allocations.current"] == stats["oversize_segments.current"] == 1


def test_frees_coalesce_with_free_neighbours():
    _, pool = make_pool()
    blocks = [pool.malloc(4 * KiB) for _ in range(5)]
    for b in (blocks[1], blocks[3], blocks[2]):
        pool.free(b)
    pool.synchronize()
    free = [b for b in blocks_of(pool) if b["state"] == "inactive"]
    assert {"address": blocks[1].address, "size": 12 * KiB} in \
        [{"address": b["address"], "size": b["size"]} for b in free]
    for b in (blocks[0], blocks[4]):
        pool.free(b)
    pool.synchronize()
    segs = check(pool)["segments"]
    assert len(segs) == 1 and len(segs[0]["blocks"]) == 1


def test_empty_cache_returns_only_fully_free_segments():
    device, pool = make_pool()
    keep = pool.malloc(100)
    gone = pool.malloc(5 * MiB)
    pool.free(gone)
    pool.empty_cache()
    stats = check(pool)["stats"]
    assert stats["segment.all.current"] == 1
    assert stats["reserved_bytes.all.current"] == 2 * MiB
    assert stats["num_device_free"] == 1
    assert pool.count("bytes_released") == 20 * MiB
    assert pool.count("num_cache_flushes") == 1
    assert device.memory_info()[0] == GiB - 2 * MiB
    assert keep.address in [b["address"] for b in blocks_of(pool)]


# -- stream safety ----------------------------------------------------------

def test_a_block_is_not_reused_while_work_queued_before_its_free_runs():
    device, pool = make_pool()
    a = pool.malloc(4 * KiB)
    device.launch(lambda: device.write(a.address, np.full(4 * KiB, 7, np.uint8)))
    pool.free(a)
    b = pool.malloc(4 * KiB)
    assert b.address != a.address
    device.write(b.address, np.full(4 * KiB, 1, np.uint8))
    device.complete()
    assert (device.read(b.address, 4 * KiB) == 1).all()
    pool.free(b)
    pool.synchronize()
    c = pool.malloc(4 * KiB)               # the work has run: a's bytes are reusable
    assert c.address == a.address
    check(pool)


def test_pending_frees_count_as_active_until_their_work_completes():
    device, pool = make_pool()
    a = pool.malloc(4 * KiB)
    device.launch()
    pool.free(a)
    pool.malloc(512)                       # served from the segment's free rest
    assert compat.get_bytes_in_use(pool) == 512
    assert pool.current("active_bytes", retire_completed=True) == 512 + 4 * KiB
    device.complete()
    pool.malloc(8 * MiB)                   # a miss polls the event
    assert pool.current("active_bytes", retire_completed=True) == 512 + 8 * MiB
    check(pool)


def test_memory_pressure_synchronizes_the_device_to_reuse_pending_frees():
    device, pool = make_pool(capacity=2 * MiB)
    a = pool.malloc(MiB)
    pool.malloc(512 * KiB)
    device.launch()
    pool.free(a)
    b = pool.malloc(MiB)                   # fits nowhere but in a's bytes
    assert device.pending_work == 0
    assert pool.memory_stats()["num_sync_all_streams"] == 1
    assert b.address == a.address
    check(pool)


def test_hold_frees_keeps_freed_blocks_pending():
    device, pool = make_pool(capacity=2 * MiB)
    a = pool.malloc(MiB)
    pool.malloc(MiB)
    with pool.hold_frees():
        pool.free(a)
        with pytest.raises(OutOfMemoryError):
            pool.malloc(MiB)
        assert pool.current("active_bytes", retire_completed=True) == 2 * MiB
    assert pool.malloc(MiB).address == a.address
    check(pool)


# -- growth, limit, reclaim ----------------------------------------------------

@pytest.mark.parametrize("limit, expected", [(40 * MiB, 40 * MiB), ("40MiB", 40 * MiB),
                                             (0.25, 256 * MiB)])
def test_limit_caps_reserved_bytes(limit, expected):
    _, pool = make_pool(limit=limit)
    assert compat.get_bytes_limit(pool) == expected
    blocks = []
    with pytest.raises(OutOfMemoryError, match="limit"):
        while True:
            blocks.append(pool.malloc(5 * MiB))
    assert compat.get_bytes_reserved(pool) <= expected
    assert compat.get_peak_bytes_reserved(pool) <= expected
    check(pool)


def test_a_small_request_near_the_limit_gets_a_segment_of_its_own_size():
    _, pool = make_pool(limit=21 * MiB)
    pool.malloc(5 * MiB)                   # 20 MiB segment
    small = pool.malloc(100)               # 2 MiB would pass the limit: 512 B segment
    assert small.allocated_size == 512
    assert compat.get_bytes_reserved(pool) == 20 * MiB + 512
    check(pool)


def test_growth_off_reserves_an_arena_at_first_use():
    device, pool = make_pool(capacity=64 * MiB, growth=False, limit=32 * MiB)
    assert device.memory_info()[0] == 64 * MiB
    a = pool.malloc(100)
    b = pool.malloc(3 * MiB)
    stats = check(pool)["stats"]
    assert stats["segment.all.current"] == 1
    assert stats["reserved_bytes.all.current"] == 32 * MiB
    assert b.address == a.address + 512      # carved from the same arena
    with pytest.raises(OutOfMemoryError, match="growth is off"):
        pool.malloc(30 * MiB)
    with pytest.raises(RuntimeError, match="growth"):
        pool.configure(growth=True)
    with pytest.raises(RuntimeError, match="limit"):
        pool.configure(limit=16 * MiB)
    pool.free(a)
    pool.empty_cache()                        # keeps the arena
    assert compat.get_bytes_reserved(pool) == 32 * MiB


def test_growth_off_without_limit_takes_all_free_device_memory():
    device, pool = make_pool(capacity=64 * MiB, growth=False)
    pool.malloc(1)
    assert compat.get_bytes_reserved(pool) == 64 * MiB
    assert device.memory_info()[0] == 0


def test_out_of_memory_first_returns_a_single_cached_segment():
    device, pool = make_pool(capacity=60 * MiB)
    a = pool.malloc(30 * MiB)              # its own 30 MiB segment
    b = pool.malloc(16 * MiB)              # its own 16 MiB segment
    pool.free(a)
    c = pool.malloc(38 * MiB)              # needs a's segment back from the cache
    stats = check(pool)["stats"]
    assert stats["num_alloc_retries"] == 1
    assert pool.count("num_cache_trims") == 1
    assert pool.count("bytes_released") == 30 * MiB
    assert compat.get_bytes_reserved(pool) == 16 * MiB + 38 * MiB
    del b, c


def test_garbage_collection_threshold_returns_cached_segments_before_growing():
    _, pool = make_pool(capacity=GiB, limit=100 * MiB, garbage_collection_threshold=0.5)
    a = pool.malloc(40 * MiB)
    pool.free(a)
    pool.synchronize()
    pool.malloc(44 * MiB)                  # 40 + 44 > 50: the free 40 MiB segment goes first
    assert compat.get_bytes_reserved(pool) == 44 * MiB
    assert pool.count("num_cache_trims") == 1
    check(pool)


def test_limit_can_change_while_growing_but_not_below_reserved():
    _, pool = make_pool()
    pool.malloc(15 * MiB)
    pool.configure(limit=100 * MiB)
    assert compat.get_bytes_limit(pool) == 100 * MiB
    with pytest.raises(RuntimeError, match="below"):
        pool.configure(limit=10 * MiB)
    assert compat.get_bytes_limit(pool) == 100 * MiB
    with pytest.raises(RuntimeError, match="max_split_size_mb"):
        pool.configure(max_split_size_mb=64)


# -- errors leave the pool as it was ----------------------------------------------

def fill(device, pool, sizes):
    blocks = []
    for i, size in enumerate(sizes):
        block = pool.malloc(size)
        device.write(block.address, np.full(size, i % 251, np.uint8))
        blocks.append(block)
    return blocks


def assert_intact(device, blocks):
    for i, block in enumerate(blocks):
        assert (device.read(block.address, block.size) == i % 251).all()


def test_out_of_memory_leaves_pool_data_and_stats_intact():
    device, pool = make_pool(capacity=64 * MiB)
    blocks = fill(device, pool, [3 * MiB, 100, 5000, 12 * MiB])
    before = pool.memory_stats()
    snap_before = pool.snapshot()["segments"]
    with pytest.raises(OutOfMemoryError) as info:
        pool.malloc(60 * MiB)
    err = info.value
    assert isinstance(err, MemoryError)
    from numba.cuda.cudadrv.driver import CudaAPIError
    assert isinstance(err, CudaAPIError)
    from cuda.bindings.driver import CUresult
    assert err.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    message = str(err)
    for part in ("60.00 MiB", "64.00 MiB total", "allocated", "reserved but unallocated",
                 "largest free block", "Hint"):
        assert part in message
    after = pool.memory_stats()
    assert after.pop("num_ooms") == before.pop("num_ooms") + 1
    assert after == before
    assert pool.snapshot()["segments"] == snap_before
    assert_intact(device, blocks)
    assert pool.malloc(10 * MiB).allocated_size == 10 * MiB
    check(pool)


class FinalizerInsideMalloc(SimulatedDevice):
    """A device during whose next allocate() the garbage collector runs a
    finalizer that hands ``victim`` to its pool's free_later."""
    victim = None

    def allocate(self, nbytes):
        if self.victim is not None:
            victim, self.victim = self.victim, None
            victim.pool.free_later(victim)
        return super().allocate(nbytes)


def test_building_an_out_of_memory_error_changes_nothing_in_the_pool():
    from numba_alloc.policy.observers import PoolObserver

    class Recorder(PoolObserver):
        def __init__(self):
            self.events = []

        def on_free(self, pool, block):
            self.events.append(("free", block.address))

        def on_out_of_memory(self, pool, nbytes):
            self.events.append(("oom", nbytes))

    device = FinalizerInsideMalloc(64 * MiB)
    pool = Pool(device, limit=GiB)                       # the device refuses, not the limit
    blocks = [pool.malloc(4 * MiB) for _ in range(15)]      # three 20 MiB segments, full
    recorder = Recorder()
    pool.add_observer(recorder)
    victim = blocks[4]
    with pool.hold_frees():
        device.launch()                   # GPU work queued before the frees
        for block in blocks[:4]:
            pool.free(block)
        pool.synchronize()                # their event is recorded: not yet complete
        device.complete()                 # now it is: only the hold keeps them pending
        before = pool.snapshot()
        recorder.events.clear()
        device.victim = victim            # its finalizer runs inside the next malloc
        with pytest.raises(OutOfMemoryError) as info:
            pool.malloc(30 * MiB)
        # malloc itself synchronized (frees were pending) but retired nothing
        # (the hold); building the error took no free and retired none
        assert device.victim is None and recorder.events == [("oom", 30 * MiB)]
        report = info.value.report
        assert report.segments == before["segments"]
        assert report.stats == {**before["stats"],
                                "num_sync_all_streams": before["stats"]["num_sync_all_streams"] + 1}
        assert (report.allocated, report.nbytes, report.size) == (44 * MiB, 30 * MiB, 30 * MiB)
        message = info.value.msg         # one state throughout: the victim still allocated
        assert "Pool: 44.00 MiB allocated, " in message
        assert "\nPool: 60.00 MiB reserved in 3 segments, 44.00 MiB allocated, " in message
        # the finalizer's free is done at the pool's next operation, and the
        # frees held back are still pending
        after = pool.snapshot()
        assert recorder.events == [("oom", 30 * MiB), ("free", victim.address)]
        states = {b["address"]: b["state"] for s in after["segments"] for b in s["blocks"]}
        assert [states[b.address] for b in blocks[:6]] == ["active_pending_free"] * 5 + [
            "active_allocated"]
    assert pickle.loads(pickle.dumps(info.value)).report == report


def test_importing_the_pool_imports_none_of_the_numba_glue():
    """pool.py stands alone: its imports (and theirs) reach nothing outside
    the policy and the package's leaves: not the per-device functions (api),
    the registry of pools, the Numba plugin (emm) nor the presentation. The
    package's __init__, which imports everything, is left out."""
    code = (
        "import importlib.util, sys, types\n"
        "spec = importlib.util.find_spec('numba_alloc')\n"
        "package = types.ModuleType('numba_alloc')\n"
        "package.__path__ = list(spec.submodule_search_locations)\n"
        "sys.modules['numba_alloc'] = package\n"
        "import numba_alloc.policy.pool\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('numba_alloc.'))))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    loaded = set(result.stdout.split())
    assert "numba_alloc.policy.pool" in loaded and "numba_alloc.units" in loaded
    assert not loaded & {"numba_alloc.api.functions", "numba_alloc.plugin.registry", "numba_alloc.plugin.emm"}, loaded
    assert all(m.split(".")[1] in ("policy", "units", "validate") for m in loaded), loaded


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), ("10", TypeError),
                                        (True, TypeError), (None, TypeError)])
def test_bad_sizes_raise_and_change_nothing(bad, error):
    _, pool = make_pool()
    pool.malloc(100)
    before = pool.memory_stats()
    with pytest.raises(error, match="nbytes"):
        pool.malloc(bad)
    assert pool.memory_stats() == before


def test_numpy_integer_sizes_are_accepted():
    _, pool = make_pool()
    assert pool.malloc(np.int64(1000)).size == 1000


def test_impossible_size_raises_out_of_memory():
    _, pool = make_pool()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(1 << 62)
    check(pool)


@pytest.mark.parametrize("nbytes", [(1 << 62) - 1, 1 << 62, (1 << 63) - 1, 1 << 63,
                                    (1 << 64) - 1, 1 << 64, 1 << 200])
def test_any_size_past_what_a_pool_holds_is_out_of_memory_with_pool_and_device_as_before(
        nbytes):
    """On a device larger than the core's int64 sizes hold, such a request
    reached the compiled core: (1 << 63) - 1 crashed the interpreter, and
    (1 << 64) - 1 raised Numba's TypingError with 2**64 bytes taken."""
    device, pool = make_pool(1 << 64)
    pool.malloc(100)
    before, device_before = pool.memory_stats(), device.memory_info()
    with pytest.raises(OutOfMemoryError) as raised:
        pool.malloc(nbytes)
    hint = "larger than any pool holds" if nbytes <= 1 << 64 else "larger than the device's"
    assert hint in raised.value.msg
    after = pool.memory_stats()
    assert after.pop("num_ooms") == before.pop("num_ooms") + 1 and after == before
    assert device.memory_info() == device_before
    check(pool)


@pytest.mark.parametrize("settings", [{}, {"limit": 0.75}, {"growth": False}])
def test_a_pool_reserves_under_2_62_bytes_of_a_larger_device(settings):
    """Its counts are int64: reserving 2**63 bytes wrapped them negative, and
    the next segment raised OverflowError with the device's memory taken."""
    device, pool = make_pool(1 << 64, **settings)
    most = (1 << 62) - 2 * MiB
    blocks = [pool.malloc(1 << 61), pool.malloc(most - (1 << 61))]
    before, device_before = pool.memory_stats(), device.memory_info()
    assert before["reserved_bytes.all.current"] == most
    with pytest.raises(OutOfMemoryError) as raised:
        pool.malloc(1 << 61)
    assert "limit" not in raised.value.msg.split("Hint: ")[1].split("\n")[0]
    after = pool.memory_stats()
    assert after.pop("num_ooms") == before.pop("num_ooms") + 1 and after == before
    assert device.memory_info() == device_before == ((1 << 64) - most, 1 << 64)
    assert [b.allocated_size for b in blocks] == [1 << 61, most - (1 << 61)]
    assert pool.limit_bytes() == most
    check(pool)


def test_double_free_and_foreign_blocks_are_refused():
    _, pool = make_pool()
    _, other = make_pool()
    a = pool.malloc(100)
    pool.free(a)
    before = pool.memory_stats()
    with pytest.raises(ValueError, match="not a live block"):
        pool.free(a)
    with pytest.raises(ValueError, match="not a live block"):
        pool.free(other.malloc(100))
    with pytest.raises(ValueError, match="not a live block"):
        pool.free("block")
    assert pool.memory_stats() == before


def test_a_stale_handle_is_refused_even_when_its_bytes_are_reused():
    _, pool = make_pool()
    a = pool.malloc(100)
    pool.free(a)
    pool.synchronize()
    b = pool.malloc(100)
    assert b.address == a.address and b is not a
    with pytest.raises(ValueError):
        pool.free(a)
    assert compat.memory_allocated(pool) == 512



@pytest.mark.parametrize("observed", [False, True], ids=["fast-paths", "under-the-lock"])
def test_a_dead_handle_and_a_copy_keep_the_address_and_sizes_they_had(observed):
    """A handle reads its address and allocated size from the core while
    live and keeps them once freed: reusing or merging its row changes
    neither; a copy keeps those of when it was made."""
    import numba_alloc
    _, pool = make_pool()
    if observed:                   # an observer: no fast path
        numba_alloc.record_history(device=pool)
    a, b = pool.malloc(1000), pool.malloc(3000)       # neighbours in one segment
    duplicate = copy.copy(b)
    kept_a, kept_b = (a.address, a.size, a.allocated_size), (b.address, b.allocated_size)
    assert kept_a[2] == 1024 and kept_b == (a.address + 1024, 3072)
    pool.free(a)
    pool.free(b)
    pool.synchronize()             # both rows retire, merged with the free rest
    c = pool.malloc(5000)          # carved from a's row: same address, another size
    d = pool.malloc(100)           # the row b left may serve the rest
    assert (c.address, c.allocated_size) == (a.address, 5120)
    assert d.address == a.address + 5120
    assert (a.address, a.size, a.allocated_size) == kept_a
    assert (b.address, b.allocated_size) == kept_b
    assert (duplicate.address, duplicate.allocated_size) == kept_b
    assert repr(a) == f"Block(address={kept_a[0]:#x}, size=1000, allocated_size=1024, state=dead)"
    live = (c.address, c.allocated_size)
    pool.reset()                   # releases live blocks: their handles keep their values
    assert (c.address, c.allocated_size, c.state) == (*live, "dead")


# -- reading --------------------------------------------------------------------

TORCH_FAMILIES = ("allocation", "allocated_bytes", "segment", "reserved_bytes", "active",
                  "active_bytes", "inactive_split", "inactive_split_bytes", "requested_bytes")


def test_reading_stats_retires_frees_whose_work_has_completed():
    device, pool = make_pool()
    a = pool.malloc(4096)
    device.launch()
    pool.free(a)
    assert pool.memory_stats()["active_bytes.all.current"] == 4096
    device.complete()
    stats = pool.memory_stats()
    assert stats["active_bytes.all.current"] == 0
    assert stats["inactive_split_bytes.all.current"] == 0   # coalesced back whole


def test_memory_stats_has_every_key_torch_returns():
    _, pool = make_pool()
    stats = pool.memory_stats()
    for family in TORCH_FAMILIES:
        for kind in ("all", "large_pool", "small_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{family}.{kind}.{metric}" in stats
    for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                "num_device_free", "max_split_size"):
        assert key in stats
    for name in ("oversize_allocations", "oversize_segments"):
        for metric in ("current", "peak", "allocated", "freed"):
            assert f"{name}.{metric}" in stats
    assert stats["max_split_size"] == (1 << 64) - 1
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())


def test_getters_agree_with_memory_stats():
    device, pool = make_pool(capacity=GiB, limit=512 * MiB)
    a = pool.malloc(3000)
    b = pool.malloc(5 * MiB)
    device.launch()                        # a kernel that may still use a
    pool.free(a)
    s = pool.memory_stats()
    assert compat.get_num_allocs(pool) == 2
    assert compat.get_bytes_in_use(pool) == compat.memory_allocated(pool) == 5 * MiB
    assert (compat.get_peak_bytes_in_use(pool) == compat.max_memory_allocated(pool)
            == 5 * MiB + 3072)
    assert compat.get_largest_alloc_size(pool) == 5 * MiB
    assert compat.get_bytes_limit(pool) == 512 * MiB
    assert (compat.get_bytes_reserved(pool) == compat.memory_reserved(pool)
            == compat.memory_cached(pool) == 22 * MiB)
    assert compat.get_peak_bytes_reserved(pool) == compat.max_memory_reserved(pool) == 22 * MiB
    assert compat.get_bytes_reservable_limit(pool) == 512 * MiB
    assert s["active_bytes.all.current"] == 5 * MiB + 3072
    assert compat.get_bytes_active(pool) == compat.get_peak_bytes_active(pool) == 0   # no use()
    assert compat.get_bytes_inactive(pool) == 5 * MiB      # resident, live, not in use
    assert compat.get_memory_info(pool) == {"current": 5 * MiB, "peak": 5 * MiB + 3072}
    assert compat.total_memory(pool) == GiB
    assert compat.get_num_defragmentations(pool) == 0 and compat.get_bytes_defragged(pool) == 0
    compat.reset_memory_stats(pool)
    assert compat.get_memory_info(pool) == {"current": 5 * MiB, "peak": 5 * MiB}
    device.complete()
    assert pool.current("active_bytes", retire_completed=True) == 5 * MiB   # a is retired
    del b


def test_reset_memory_stats_clears_what_tensorflows_clearstats_clears():
    """TensorFlow's reset_memory_stats (BFCAllocator::ClearStats): num_allocs
    and largest_alloc_size go to 0, the peak in use to the bytes in use; the
    peak reserved stays, and so do memory_stats()' other keys. It reset
    every peak and neither count."""
    _, pool = make_pool(capacity=64 * MiB)
    a = pool.malloc(20 * MiB)
    pool.free(a)
    pool.empty_cache()
    c = pool.malloc(1 * MiB)
    before = pool.memory_stats()
    compat.reset_memory_stats(pool)
    assert compat.get_num_allocs(pool) == 0 and compat.get_largest_alloc_size(pool) == 0
    assert compat.get_peak_bytes_in_use(pool) == compat.get_bytes_in_use(pool) == 1 * MiB
    assert compat.get_memory_info(pool) == {"current": 1 * MiB, "peak": 1 * MiB}
    assert compat.get_peak_bytes_reserved(pool) == 20 * MiB
    after = pool.memory_stats()
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"allocated_bytes.all.peak", "allocated_bytes.large_pool.peak"}
    assert after["largest_alloc_size"] == 20 * MiB      # torch's key keeps its meaning
    b = pool.malloc(3 * MiB)
    assert compat.get_num_allocs(pool) == 1 and compat.get_largest_alloc_size(pool) == 3 * MiB
    assert pool.memory_stats()["largest_alloc_size"] == 20 * MiB
    compat.reset_accumulated_memory_stats(pool)         # zeroes num_allocs too, not the largest
    compat.reset_peak_memory_stats(pool)
    assert compat.get_num_allocs(pool) == 0 and compat.get_largest_alloc_size(pool) == 3 * MiB
    assert pool.memory_stats()["largest_alloc_size"] == 20 * MiB
    pool.malloc(512)
    assert compat.get_num_allocs(pool) == 1
    del b, c


def _syncs_and_retries(pool):
    stats = pool.memory_stats()
    return stats["num_sync_all_streams"], stats["num_alloc_retries"]


def test_empty_cache_and_the_retry_count_syncs_and_retries_as_pytorch():
    """PyTorch's empty_cache (release_cached_blocks) counts one
    num_sync_all_streams each time, frees pending or not; a request growing
    cannot serve goes through one retry, one sync and one retry counted
    (alloc_block(isRetry=true)), whether frees were pending or segments
    cached; returning one cached segment counts no retry of its own. A
    failed request counts in num_ooms only (docs/stats.md)."""
    _, pool = make_pool(capacity=64 * MiB)
    pool.free(pool.malloc(1 * MiB))
    pool.empty_cache()
    assert _syncs_and_retries(pool) == (1, 0)
    pool.empty_cache()
    assert _syncs_and_retries(pool) == (2, 0)
    _, pool = make_pool(capacity=64 * MiB)
    x = pool.malloc(30 * MiB)
    y = pool.malloc(24 * MiB)
    pool.free(y)
    pool.synchronize()
    z = pool.malloc(30 * MiB)          # y's cached segment goes back, nothing pending
    assert _syncs_and_retries(pool) == (1, 1)
    assert pool.count("num_cache_trims") == 1
    device, pool = make_pool(capacity=64 * MiB)
    w = pool.malloc(40 * MiB)
    device.launch()
    pool.free(w)                       # pending: the retry waits for it
    v = pool.malloc(40 * MiB)
    assert _syncs_and_retries(pool) == (1, 1)
    with pytest.raises(OutOfMemoryError):
        pool.malloc(40 * MiB)          # nothing pending, nothing cached
    assert _syncs_and_retries(pool) == (1, 1) and pool.count("num_ooms") == 1
    del x, z, v


def test_the_reading_primitives_agree_with_memory_stats():
    from numba_alloc.policy.counters import EVENTS, FAMILIES, POOL
    device, pool = make_pool(capacity=GiB, limit=512 * MiB, max_split_size_mb=21)
    a = pool.malloc(3000)
    pool.malloc(24 * MiB)                  # oversize: 21 MiB or more
    device.launch()                        # a kernel that may still use a
    pool.free(a)
    s = pool.memory_stats()
    keys = [(f.name, f"{f.name}.all" if f.form == POOL else f.name) for f in FAMILIES]
    for family, key in keys:
        assert pool.current(family) == s[f"{key}.current"], family
        assert pool.peak(family) == s[f"{key}.peak"], family
        assert pool.accumulated(family) == (s[f"{key}.allocated"], s[f"{key}.freed"]), family
    for name in (*EVENTS, "largest_alloc_size"):
        assert pool.count(name) == s[name], name
    assert pool.current("oversize_allocations") == 1 and pool.accumulated("allocation") == (2, 1)
    assert pool.limit_bytes() == 512 * MiB
    device.complete()
    assert pool.current("active_bytes") == 24 * MiB + 3072     # a plain read retires nothing
    assert pool.current("active_bytes", retire_completed=True) == 24 * MiB
    for read, name in ((pool.current, "allocated"), (pool.peak, "num_ooms"),
                       (pool.accumulated, "allocation.all"), (pool.count, "allocated_bytes")):
        with pytest.raises(ValueError, match="unknown counter"):
            read(name)
    pool.reset_peaks()
    assert pool.peak("allocated_bytes") == pool.current("allocated_bytes") == 24 * MiB
    pool.reset_accumulated()
    assert pool.accumulated("allocation") == (0, 0) and pool.count("num_device_alloc") == 0
    assert pool.count("largest_alloc_size") == 24 * MiB          # not an accumulated count


def test_reservable_limit_is_bounded_by_device_free_memory():
    device, pool = make_pool(capacity=100 * MiB)
    other = Pool(device)
    other.malloc(50 * MiB)                 # another user of the device
    pool.malloc(100)
    assert compat.get_bytes_reservable_limit(pool) == 2 * MiB + (100 - 52) * MiB


def test_with_growth_off_the_reservable_limit_is_the_arena_once_reserved():
    device = SimulatedDevice(100 * MiB)
    other = Pool(device)                       # another user of the device
    other.free(other.malloc(40 * MiB))
    pool = Pool(device, growth=False)          # no limit: the arena is the free memory
    assert compat.get_bytes_reservable_limit(pool) == 60 * MiB     # before first use
    pool.malloc(100)
    arena = pool.current("reserved_bytes")
    assert 0 < arena <= 60 * MiB
    other.empty_cache()                        # the device has room again
    assert compat.get_bytes_reservable_limit(pool) == arena        # the pool never takes it


def test_reset_peak_and_accumulated_stats():
    _, pool = make_pool()
    a = pool.malloc(MiB)
    pool.free(a)
    pool.synchronize()
    compat.reset_peak_memory_stats(pool)
    assert compat.max_memory_allocated(pool) == 0
    compat.reset_accumulated_memory_stats(pool)
    stats = pool.memory_stats()
    assert stats["allocation.all.allocated"] == 0 and stats["num_device_alloc"] == 0
    assert stats["reserved_bytes.all.current"] == 2 * MiB


def test_reset_releases_everything_and_the_pool_is_usable_again():
    device, pool = make_pool()
    a = pool.malloc(100)
    pool.malloc(30 * MiB)
    pool.reset()
    assert device.memory_info()[0] == GiB
    assert not pool.initialized
    stats = check(pool)["stats"]
    assert stats["reserved_bytes.all.current"] == 0 and stats["allocation.all.current"] == 0
    with pytest.raises(ValueError):
        pool.free(a)                       # handles from before the reset are dead
    assert pool.malloc(100).allocated_size == 512


def test_pin_marks_a_live_block():
    _, pool = make_pool()
    a = pool.malloc(100)
    pool.pin(a)
    assert [b["pinned"] for b in blocks_of(pool) if b["address"] == a.address] == [True]
    pool.free(a)
    with pytest.raises(ValueError):
        pool.pin(a)


def test_block_is_the_handle_type():
    _, pool = make_pool()
    assert isinstance(pool.malloc(1), Block)


def test_observers_see_every_event_in_order():
    from numba_alloc.policy.observers import PoolObserver

    class Recorder(PoolObserver):
        def __init__(self):
            self.events = []

        def on_malloc(self, pool, block):
            self.events.append(("malloc", block.size))

        def on_free(self, pool, block):
            self.events.append(("free", block.size))

        def on_segment_alloc(self, pool, segment):
            self.events.append(("segment_alloc", segment.size))

        def on_segment_free(self, pool, segment):
            self.events.append(("segment_free", segment.size))

        def on_out_of_memory(self, pool, nbytes):
            self.events.append(("oom", nbytes))

    _, pool = make_pool(capacity=64 * MiB)
    recorder = Recorder()
    pool.add_observer(recorder)
    a = pool.malloc(100)
    pool.free(a)
    with pytest.raises(OutOfMemoryError):
        pool.malloc(100 * MiB)
    pool.empty_cache()
    pool.remove_observer(recorder)
    pool.malloc(5)
    assert recorder.events == [("segment_alloc", 2 * MiB), ("malloc", 100), ("free", 100),
                               ("oom", 100 * MiB), ("segment_free", 2 * MiB)]
    with pytest.raises(ValueError, match="remove_observer: .* is not attached to this pool"):
        pool.remove_observer(recorder)


@pytest.mark.parametrize("backend", [None, "simulated", 64 * MiB, SimulatedDevice])
def test_a_pool_needs_a_backend(backend):
    """Not a Backend: refused at once, naming the argument (it failed at the
    first malloc, with an AttributeError from deep inside the pool)."""
    with pytest.raises(TypeError, match="backend must be a numba_alloc.Backend"):
        Pool(backend)


def test_a_request_that_can_never_fit_keeps_the_cache_under_a_gc_threshold():
    _, pool = make_pool(limit=64 * MiB, garbage_collection_threshold=0.5)
    pool.malloc(20 * MiB)
    b = pool.malloc(16 * MiB)
    pool.free(b)
    pool.synchronize()
    before = pool.memory_stats()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(50 * MiB)                # 20 live + 50 > 64 whatever is released
    after = pool.memory_stats()
    assert after.pop("num_ooms") == before.pop("num_ooms") + 1
    assert after == before


def test_an_out_of_memory_error_leaves_no_cycle_that_keeps_the_callers_frames():
    """Once the program has handled an OutOfMemoryError and dropped what its
    frames held (Numba's device_array_like holds the array it copies), that
    goes at once, without the cyclic collector: the error keeps no
    reference to itself through the frame that raised it."""
    pool = Pool(SimulatedDevice(64 << 20), limit=16 << 20)

    def request(held):
        return pool.malloc(32 << 20)

    assert_freed_without_the_collector(request, OutOfMemoryError)
