"""Logger "numba_alloc": every pool's out-of-memory errors, defragmentations,
reclaims and cache flushes at INFO, and nothing from its request and free
paths."""

import logging

import pytest

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.observe.event_log import EventLog

MiB = 1 << 20


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.DEBUG, logger="numba_alloc")
    return caplog


def messages(records):
    assert all(r.name == "numba_alloc" and r.levelno == logging.INFO for r in records.records)
    return [r.getMessage() for r in records.records]


def test_every_pool_logs_with_no_observer_on_its_request_and_free_paths(records):
    pool = Pool(SimulatedDevice(64 * MiB))
    assert [type(o) for o in pool._observers] == [EventLog] and pool._block_observers == ()
    blocks = [pool.malloc(n * 1000) for n in range(1, 200)]
    for block in blocks:
        pool.free(block)
    pool.synchronize()
    assert messages(records) == []


def test_out_of_memory_is_logged(records):
    pool = Pool(SimulatedDevice(64 * MiB))
    with pytest.raises(OutOfMemoryError):
        pool.malloc(65 * MiB)
    assert messages(records) == [
        "out of memory on simulated device 0: a request of 65.00 MiB failed"]


def test_a_defragmentation_is_logged_with_what_it_moved(records):
    pool = Pool(SimulatedDevice(64 * MiB))
    blocks = [pool.malloc(MiB) for _ in range(8)]
    for block in blocks[::2]:
        pool.free(block)
    pool.synchronize()
    result = pool.defragment()
    assert result.blocks_moved > 0
    assert result.blocks_moved > 1
    assert messages(records) == [f"defragmentation on simulated device 0: moved "
                                 f"{result.blocks_moved} blocks, "
                                 f"{result.bytes_moved / MiB:.2f} MiB"]


def test_a_cache_flush_is_logged_and_a_flush_with_nothing_to_return_is_not(records):
    pool = Pool(SimulatedDevice(256 * MiB))
    small, large = pool.malloc(5 * MiB), pool.malloc(30 * MiB)    # segments of 20 and 30 MiB
    pool.free(small)
    pool.free(large)
    pool.empty_cache()
    pool.empty_cache()                          # nothing left to return
    assert messages(records) == [
        "cache flush on simulated device 0: returned 2 segments, 50.00 MiB, to the device"]
    assert pool.memory_stats()["num_cache_flushes"] == 1


def test_each_reclaimed_block_is_logged(records):
    pool = Pool(SimulatedDevice(64 * MiB), reclaim=True)
    blocks = [pool.malloc(15 * MiB) for _ in range(5)]     # the fifth reclaims one
    assert pool.memory_stats()["reclaimed.current"] == 1
    assert messages(records) == [
        "reclaim on simulated device 0: a block of 16.00 MiB moved to host memory"]
    for block in blocks:
        pool.free(block)
