"""Pool.malloc_owned: a block freed when its owner is garbage, as Numba's
arrays are, on the simulated device."""

import gc

import pytest

from numba_alloc import Block, OutOfMemoryError, OwnedBlock, Pool, SimulatedDevice

MiB = 1 << 20


@pytest.fixture
def pool():
    return Pool(SimulatedDevice(64 * MiB))


def test_an_owned_block_is_freed_at_the_next_operation_once_garbage(pool):
    owned = pool.malloc_owned(3 * MiB)
    assert isinstance(owned, OwnedBlock) and type(owned.block) is Block
    assert (owned.address, owned.size, owned.allocated_size) == (
        owned.block.address, 3 * MiB, 3 * MiB)
    assert pool.current("allocated_bytes") == 3 * MiB
    handle = owned.block
    del owned
    assert pool.current("allocated_bytes") == 0     # the read is the next operation
    assert handle.state != "allocated"     # pending until the device's work is done
    assert pool.accumulated("allocation") == (1, 1)


def test_an_owned_block_in_a_cycle_is_freed_by_the_collector(pool):
    owned = pool.malloc_owned(MiB)
    cycle = [owned]
    cycle.append(cycle)
    del owned, cycle
    assert pool.current("allocated_bytes") == MiB
    gc.collect()
    assert pool.current("allocated_bytes") == 0


def test_free_frees_now_once_and_the_owner_then_frees_nothing(pool):
    owned = pool.malloc_owned(MiB)
    owned.free()
    owned.free()
    assert pool.current("allocated_bytes") == 0
    again = pool.malloc(MiB)        # may be the same bytes: the dropped owner must not free them
    del owned
    assert pool.current("allocated_bytes") == MiB and again.state == "allocated"


def test_a_handle_freed_by_pool_free_leaves_the_owner_nothing_to_free(pool):
    owned = pool.malloc_owned(MiB)
    pool.free(owned.block)
    with pytest.raises(ValueError):
        owned.free()
    again = pool.malloc(MiB)
    del owned
    assert pool.current("allocated_bytes") == MiB and again.state == "allocated"


def test_an_owned_request_that_cannot_be_met_changes_nothing(pool):
    kept = pool.malloc_owned(MiB)
    keys = ("allocated_bytes.all.current", "reserved_bytes.all.current",
            "allocation.all.allocated", "allocation.all.freed")
    before = pool.memory_stats()
    with pytest.raises(OutOfMemoryError):
        pool.malloc_owned(1 << 30)
    after = pool.memory_stats()
    assert [after[k] for k in keys] == [before[k] for k in keys]
    assert after["num_ooms"] == before["num_ooms"] + 1 and kept.block.state == "allocated"
