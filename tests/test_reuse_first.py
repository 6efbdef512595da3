"""A large request that would split a free block first makes the freed
blocks whose work has completed reusable (closes their batch and retires
it), on the simulated device: freed memory is used before other free
space is carved, whatever the batch size."""

import numpy as np

from numba_alloc import Pool, SimulatedDevice
from numba_alloc.policy import core

from faults import FaultyDevice
from invariants import check

MiB = 1 << 20
# a device on which the pool's first 18 MiB segment is 45% of the memory:
# scarce (segments.SCARCE_FROM), so reuse first is in force
SCARCE = 40 * MiB


def freed_open(pool):
    """A pool holding an 18 MiB segment whose first 6 MiB were just freed
    (open: no event covers them yet) and whose other 12 MiB are free."""
    block = pool.malloc(6 * MiB)
    address = block.address
    pool.free(block)
    assert pool._core.mv[core.H_OPEN_COUNT] == 1
    return address


def test_a_large_request_reuses_a_just_freed_block_before_splitting_another():
    pool = Pool(SimulatedDevice(SCARCE))
    address = freed_open(pool)
    again = pool.malloc(6 * MiB)
    assert again.address == address            # the freed block, not the 12 MiB rest
    assert pool._core.mv[core.H_OPEN_COUNT] == 0
    snap = check(pool)
    assert [(s["total_size"], s["allocated_size"]) for s in snap["segments"]] == \
        [(18 * MiB, 6 * MiB)]
    assert pool.stats.num_device_alloc == 1


def test_with_memory_to_spare_the_rest_is_split_as_in_pytorch_and_no_event_is_recorded():
    device = FaultyDevice(1 << 30)             # 18 MiB of 1 GiB reserved: plenty
    pool = Pool(device)
    address = freed_open(pool)
    again = pool.malloc(6 * MiB)
    assert again.address == address + 6 * MiB
    assert pool._core.mv[core.H_OPEN_COUNT] == 1
    assert device.calls["record"] == 0
    check(pool)


def test_without_it_the_rest_is_split_and_the_free_stays_pending():
    pool = Pool(SimulatedDevice(SCARCE))
    pool._reuse_first = False                   # PyTorch's policy (bench_traces.py)
    address = freed_open(pool)
    again = pool.malloc(6 * MiB)
    assert again.address == address + 6 * MiB
    assert pool._core.mv[core.H_OPEN_COUNT] == 1
    check(pool)


def test_an_exact_fit_does_not_close_the_batch():
    pool = Pool(SimulatedDevice(SCARCE))
    first, second = pool.malloc(6 * MiB), pool.malloc(6 * MiB)
    pool.malloc(6 * MiB)                        # the segment is full
    pool.free(first)
    pool.synchronize()                          # first's 6 MiB: free, retired
    pool.free(second)                           # open
    events = pool._pending._spare_events + [e for e, _, _ in pool._pending._batches]
    again = pool.malloc(6 * MiB)
    assert again.address == first.address
    assert pool._core.mv[core.H_OPEN_COUNT] == 1
    assert len(pool._pending._spare_events) + len(pool._pending._batches) == len(events)


def test_small_requests_keep_their_batch():
    pool = Pool(SimulatedDevice(SCARCE))
    block = pool.malloc(4096)
    pool.free(block)
    again = pool.malloc(4096)
    assert again.address != block.address       # carved from the segment's rest
    assert pool._core.mv[core.H_OPEN_COUNT] == 1


def test_an_event_that_cannot_be_recorded_leaves_the_frees_open_and_the_request_served():
    device = FaultyDevice(SCARCE)
    pool = Pool(device)
    address = freed_open(pool)
    device.fail("record")
    again = pool.malloc(6 * MiB)
    assert device.fired["record"] == 1
    assert again.address == address + 6 * MiB   # the block found first
    assert pool._core.mv[core.H_OPEN_COUNT] == 1
    check(pool)
    pool.free(again)
    pool.synchronize()                          # the frees retire once events work
    snap = check(pool)
    assert snap["stats"]["allocated_bytes.all.current"] == 0
    assert [b["state"] for s in snap["segments"] for b in s["blocks"]] == ["inactive"]


def test_a_freed_block_whose_work_still_runs_is_not_reused_and_the_request_does_not_wait():
    device = SimulatedDevice(SCARCE)
    pool = Pool(device)
    block = pool.malloc(6 * MiB)
    address = block.address
    device.launch()                             # a kernel that may still use the block
    pool.free(block)
    again = pool.malloc(6 * MiB)
    assert again.address == address + 6 * MiB  # carved from the rest: the event is not done
    assert device.pending_work == 1             # nothing waited for the device
    assert pool.memory_stats()["num_sync_all_streams"] == 0
    assert pool._core.mv[core.H_OPEN_COUNT] == 0 and pool._pending.batched
    device.complete()
    third = pool.malloc(6 * MiB)                # the segment's last 6 MiB: an exact fit
    assert third.address == address + 12 * MiB
    fourth = pool.malloc(6 * MiB)               # a miss polls the batch: done now
    assert fourth.address == address
    assert not pool._pending.batched and pool.stats.num_device_alloc == 1
    check(pool)


def test_data_written_after_a_reused_free_is_never_overwritten_by_earlier_work():
    """Stream order: the work queued before a free runs before the block
    is handed out again, so the new owner's data survives it."""
    device = SimulatedDevice(SCARCE)
    pool = Pool(device)
    block = pool.malloc(6 * MiB)
    old = block.address
    device.launch(lambda: device.write(old, np.full(16, 1, np.uint8)))   # the old owner's kernel
    pool.free(block)
    again = pool.malloc(6 * MiB)                # must not be the block the kernel writes
    device.write(again.address, np.full(16, 2, np.uint8))
    device.complete()
    assert device.read(again.address, 16).tolist() == [2] * 16
    check(pool)


def test_in_one_arena_small_requests_keep_their_batch_and_large_ones_reuse_first():
    pool = Pool(SimulatedDevice(64 * MiB), growth=False)
    small = pool.malloc(4096)
    pool.free(small)
    assert pool.malloc(4096).address != small.address     # every request is the arena's
    assert pool._core.mv[core.H_OPEN_COUNT] == 1
    large = pool.malloc(6 * MiB)                          # closes the batch: small retires
    assert pool._core.mv[core.H_OPEN_COUNT] == 0
    pool.free(large)
    assert pool.malloc(6 * MiB).address == large.address
    check(pool)
