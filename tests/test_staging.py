"""Staged blocks (Pool.stage, unstage_later): what the Numba plugin's
cuda-core memory resource takes from the pool for the copies of host arrays
a kernel is given (tests/test_standin.py runs that path over numba-cuda)."""

import pytest

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.policy.block import ALLOCATED, DEAD

from invariants import check

MiB = 1 << 20


def _addresses(pool):
    return [b["address"] for s in pool.snapshot()["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"]


def test_a_staged_block_is_pinned_counted_and_freed_by_its_address():
    pool = Pool(SimulatedDevice(256 * MiB))
    block, made = pool.stage(1000, lambda address: ("buffer", address))
    assert made == ("buffer", block.address)
    assert block.pinned == 1 and block.state is ALLOCATED
    stats = pool.memory_stats()
    assert stats["staged_bytes.current"] == 1024 == stats["allocated_bytes.all.current"]
    assert stats["staged.current"] == 1
    assert pool.snapshot()["staged"] == [{"address": block.address, "size": 1024,
                                          "requested_size": 1000}]
    pool.unstage_later(block)               # no lock: as a finalizer would
    assert block.state is ALLOCATED         # until the pool's next operation
    pool.synchronize()
    stats = pool.memory_stats()
    assert block.state is DEAD
    assert (stats["staged_bytes.current"], stats["staged_bytes.peak"],
            stats["staged_bytes.allocated"], stats["staged_bytes.freed"]) == (0, 1024, 1024, 1024)
    assert pool.snapshot()["staged"] == []
    again, _ = pool.stage(1000, lambda address: None)      # the row reused: one pin, not two
    assert again.pinned == 1
    check(pool)


def test_a_failing_make_or_no_room_leaves_the_pool_as_it_was():
    pool = Pool(SimulatedDevice(256 * MiB), limit=8 * MiB)
    keep = pool.malloc(MiB)
    before = pool.snapshot()

    def refuse(address):
        raise RuntimeError("no driver library")
    with pytest.raises(RuntimeError, match="no driver library"):
        pool.stage(3 * MiB, refuse)                     # grows a segment, gives it back
    after = pool.snapshot()
    assert after["segments"] == before["segments"]
    assert {k: v for k, v in after["stats"].items() if k.endswith(".current")} == \
        {k: v for k, v in before["stats"].items() if k.endswith(".current")}
    assert after["stats"]["num_device_free"] == before["stats"]["num_device_free"] + 1
    with pytest.raises(RuntimeError, match="no driver library"):
        pool.stage(1000, refuse)                        # from the cache: nothing changes
    assert pool.snapshot()["segments"] == before["segments"]
    before = pool.snapshot()
    with pytest.raises(OutOfMemoryError):
        pool.stage(16 * MiB, lambda address: None)
    after = pool.snapshot()
    assert after["stats"]["num_ooms"] == before["stats"]["num_ooms"] + 1
    after["stats"]["num_ooms"] = before["stats"]["num_ooms"]
    assert after == before
    with pytest.raises(ValueError, match="nbytes"):
        pool.stage(-1, lambda address: None)
    assert keep.state is ALLOCATED


def test_defragmentation_never_moves_a_staged_block():
    """Two-block segments. The staged block's segment, half free, would be
    emptied first but for its pin: the first segment, half free too, is
    emptied into it instead, and the staged block stays."""
    pool = Pool(SimulatedDevice(256 * MiB), defrag=True)
    blocks = [pool.malloc(MiB) for _ in range(8)]
    staged, _ = pool.stage(MiB, lambda address: None)
    tail = [pool.malloc(MiB) for _ in range(4)]
    pool.free(tail[0])                  # beside the staged block
    pool.free(blocks[1])
    where = staged.address
    done = pool.defragment()
    assert (done.blocks_moved, done.bytes_released) == (1, 2 * MiB)
    assert staged.address == where and staged.pinned == 1
    assert blocks[0].address == where + MiB
    assert all(b.state is ALLOCATED for b in [*blocks[:1], *blocks[2:], *tail[1:]])
    check(pool)


def test_a_reset_forgets_staged_blocks_and_a_late_unstage_is_ignored():
    pool = Pool(SimulatedDevice(256 * MiB))
    old, _ = pool.stage(4096, lambda address: None)
    pool.reset()
    assert pool.memory_stats()["staged_bytes.current"] == 0
    new, _ = pool.stage(4096, lambda address: None)
    pool.unstage_later(old)                      # the old buffer closes late
    pool.synchronize()
    assert new.state is ALLOCATED and pool.memory_stats()["staged.current"] == 1
    check(pool)


def test_stage_refuses_a_make_that_cannot_be_called_and_unstage_ignores_what_is_not_staged():
    pool = Pool(SimulatedDevice(256 * MiB))
    before = pool.snapshot()
    with pytest.raises(TypeError, match="make must be a callable"):
        pool.stage(1000, None)
    assert pool.snapshot() == before
    for thing in (None, 5, "block"):
        pool.unstage_later(thing)               # a finalizer's call: never raises
    pool.malloc(100)                            # the next operation frees nothing
    assert pool.memory_stats()["allocation.all.freed"] == 0
    check(pool)


def test_a_segment_grown_for_a_refused_block_goes_back_when_a_cached_one_made_room():
    # the limit makes the pool return its cached 2 MiB segment and grow a
    # 3 MiB one: the count of segments is unchanged, the new one still goes
    pool = Pool(SimulatedDevice(64 * MiB), limit=4 * MiB)
    pool.free(pool.malloc(1000))
    pool.synchronize()

    def refuse(address):
        raise RuntimeError("no driver library")
    with pytest.raises(RuntimeError, match="no driver library"):
        pool.stage(3 * MiB, refuse)
    stats = pool.memory_stats()
    assert pool.snapshot()["segments"] == [] and stats["reserved_bytes.all.current"] == 0
    assert stats["num_device_alloc"] == 2 and stats["num_device_free"] == 2
    check(pool)


def test_staging_moves_no_block_unless_told_it_may():
    # a launch staging a host argument holds its device arrays' addresses:
    # where only defragmentation could make room, staging is out of memory
    pool = Pool(SimulatedDevice(256 * MiB), defrag=True, growth=False, limit=20 * MiB)
    blocks = [pool.malloc(MiB) for _ in range(19)]
    for block in blocks[::2]:
        pool.free(block)
    pool.synchronize()
    kept = [(b, b.address) for b in blocks[1::2]]
    before = pool.snapshot()["segments"]
    with pytest.raises(OutOfMemoryError):
        pool.stage(5 * MiB, lambda address: address)
    assert pool.snapshot()["segments"] == before
    assert all(b.address == address for b, address in kept)
    block, made = pool.stage(5 * MiB, lambda address: address, moves=True)
    assert made == block.address and pool.memory_stats()["num_defragmentations"] == 1
    assert any(b.address != address for b, address in kept)
    check(pool)


@pytest.mark.parametrize("expandable", [False, True])
def test_a_failing_make_after_a_reset_of_the_running_totals_leaves_them_as_they_were(expandable):
    """reset_accumulated zeroes the running totals, not the current values:
    an undone request's repair of the totals (the free blocks its block
    joined, the pages it mapped and gave back) goes by their change, not by
    total increases - decreases = current, which put the whole current
    value back into them (the allocations of blocks live since the reset
    counted again: get_num_allocs 1 with no request served since)."""
    pool = Pool(SimulatedDevice(256 * MiB), expandable_segments=expandable)
    keep = [pool.malloc(100), pool.malloc(8 * MiB)]     # noqa: F841 - held live
    pool.reset_accumulated()
    before = pool.memory_stats()

    def refuse(address):
        raise RuntimeError("no driver library")
    for nbytes in (100, 16 * MiB):          # from the small segment's rest; pages mapped
        with pytest.raises(RuntimeError, match="no driver library"):
            pool.stage(nbytes, refuse)
    after = pool.memory_stats()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]
               and not k.startswith(("reserved_bytes.", "segment.", "num_device_",
                                     "bytes_released"))}
    assert changed == {}
    assert after["allocation.all.allocated"] == 0
