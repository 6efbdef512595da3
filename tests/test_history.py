"""record_history: the ring of events, its totals, stacks and settings."""

import os

import numpy as np
import pytest

import numba_alloc
from numba_alloc.api import compat
from numba_alloc.observe.history import (ALLOC, FREE, FREE_COMPLETED, OOM, SEGMENT_ALLOC,
                                        SEGMENT_FREE, history_of)

from workload import MiB, make_pool, mixed


def test_records_every_kind_of_event_with_the_pools_totals_after_it():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    a = pool.malloc(1000)
    b = pool.malloc(5 * MiB)                  # a 20 MiB segment
    pool.free(a)
    with pytest.raises(numba_alloc.OutOfMemoryError):
        pool.malloc(device.capacity * 2)
    pool.free(b)
    pool.empty_cache()
    events = numba_alloc.recorded_events(pool)
    # a free completes once the pool sees its GPU work done: at the next
    # request (the failing one), at empty_cache
    assert [e.action for e in events] == [SEGMENT_ALLOC, ALLOC, SEGMENT_ALLOC, ALLOC, FREE,
                                          FREE_COMPLETED, OOM, FREE, FREE_COMPLETED,
                                          SEGMENT_FREE, SEGMENT_FREE]
    assert (events[5].address, events[5].size, events[5].allocated_size) == (a.address, 1000, 1024)
    assert events[5].allocated == events[4].allocated
    alloc_a = events[1]
    assert (alloc_a.address, alloc_a.size, alloc_a.allocated_size) == (a.address, 1000, 1024)
    assert (alloc_a.allocated, alloc_a.requested, alloc_a.reserved) == (1024, 1000, 2 * MiB)
    assert events[3].allocated == 1024 + 5 * MiB and events[3].reserved == 22 * MiB
    oom = events[6]
    assert oom.size == device.capacity * 2 and oom.address == 0
    assert oom.device_free == device.capacity - 22 * MiB
    assert [e.reserved for e in events[-2:]] == [20 * MiB, 0]
    assert events[-1].allocated == events[-1].requested == 0
    times = [e.time_ns for e in events]
    assert times == sorted(times)


def test_totals_follow_the_pool_through_a_mixed_workload():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    live = mixed(pool, device, steps=400, seed=3)
    last = numba_alloc.recorded_events(pool)[-1]
    assert last.allocated == compat.memory_allocated(pool)
    assert last.reserved == compat.memory_reserved(pool)
    assert last.requested == sum(b.size for b in live)


def test_recording_started_late_begins_from_the_pools_state():
    device, pool = make_pool()
    keep = [pool.malloc(5000), pool.malloc(2 * MiB)]
    numba_alloc.record_history(device=pool)
    pool.free(keep[0])
    (free,) = numba_alloc.recorded_events(pool)
    assert free.allocated == 2 * MiB
    assert free.requested == 2 * MiB
    assert free.reserved == compat.memory_reserved(pool)


def test_the_ring_keeps_the_newest_entries_and_counts_the_dropped():
    _, pool = make_pool()
    numba_alloc.record_history(device=pool, max_entries=5)
    blocks = [pool.malloc(512 * (i + 1)) for i in range(8)]
    events = numba_alloc.recorded_events(pool)
    assert [e.address for e in events] == [b.address for b in blocks[-5:]]
    assert history_of(pool).recorded == 9          # a segment and 8 blocks
    numba_alloc.record_history(device=pool, max_entries=np.int64(2))  # shrink: keeps the newest
    kept = numba_alloc.recorded_events(pool)
    assert [e.address for e in kept] == [b.address for b in blocks[-2:]]


def test_stopping_discards_the_history_and_detaches():
    _, pool = make_pool()
    numba_alloc.record_history(device=pool)
    pool.malloc(100)
    numba_alloc.record_history(False, device=pool)
    pool.malloc(100)
    assert history_of(pool) is None
    with pytest.raises(RuntimeError, match="record_history"):
        numba_alloc.recorded_events(pool)
    numba_alloc.record_history(device=pool)
    assert numba_alloc.recorded_events(pool) == []


def _allocate_here(pool):
    return pool.malloc(4096)


def test_stacks_name_the_caller_outside_numba_alloc_innermost_first():
    _, pool = make_pool()
    numba_alloc.record_history(device=pool, stacks=True)
    block = _allocate_here(pool)
    alloc = numba_alloc.recorded_events(pool)[-1]
    filename, line, name = alloc.frames[0]
    assert filename == __file__ and name == "_allocate_here"
    assert alloc.frames[1][2] == "test_stacks_name_the_caller_outside_numba_alloc_innermost_first"
    package = os.path.dirname(numba_alloc.__file__)
    assert not any(f[0].startswith(package) for f in alloc.frames)
    assert history_of(pool).block_frames[block.address] == alloc.frames
    pool.free(block)
    assert block.address not in history_of(pool).block_frames
    numba_alloc.record_history(device=pool, stacks=False)   # switch stacks off, keep entries
    pool.malloc(10)
    events = numba_alloc.recorded_events(pool)
    assert events[-1].frames == () and len(events) == 4


@pytest.mark.parametrize("kwargs, error, match", [
    ({"enabled": 1}, TypeError, "enabled"),
    ({"stacks": "yes"}, ValueError, "stacks"),
    ({"max_entries": 0}, ValueError, "max_entries"),
    ({"max_entries": 2 ** 63}, ValueError, "max_entries must be an int from 1 to"),
    ({"max_entries": 2.5}, TypeError, "max_entries must be an int >= 1"),
    ({"max_entries": "5"}, TypeError, "max_entries must be an int >= 1"),
    ({"max_entries": True}, TypeError, "max_entries must be an int >= 1"),
    ({"device": 1.5}, TypeError, "device"),
])
def test_bad_arguments_are_refused(kwargs, error, match):
    """A value of the wrong type is a TypeError, as for enabled and device."""
    _, pool = make_pool()
    kwargs.setdefault("device", pool)
    with pytest.raises(error, match=match):
        numba_alloc.record_history(**kwargs)
    assert history_of(pool) is None
