"""Split rests: once memory is scarce (35% of the limit reserved) and defrag
is on, a large block carved from a free block leaves any rest of 512 B or
more free, where PyTorch's rule (kept otherwise) lets the block absorb a
rest of up to 1 MiB; on the simulated device."""

import pytest

from numba_alloc import Pool, SimulatedDevice

from invariants import check

MiB = 1 << 20
KiB = 1 << 10
REQUEST = 13 * MiB + 512 * KiB      # its own segment is 14 MiB: a rest of 512 KiB


def carve(capacity, **settings):
    """(the block's allocated size, the segment's free bytes) after one
    request in a fresh pool."""
    pool = Pool(SimulatedDevice(capacity), **settings)
    block = pool.malloc(REQUEST)
    (segment,) = check(pool)["segments"]
    assert segment["total_size"] == 14 * MiB
    return block.allocated_size, segment["total_size"] - segment["allocated_size"]


def test_a_scarce_pool_with_defrag_leaves_the_rest_free():
    assert carve(32 * MiB, defrag=True) == (REQUEST, 512 * KiB)


@pytest.mark.parametrize("capacity, settings", [
    (32 * MiB, {}),                          # scarce, defrag off: PyTorch's rule
    (1024 * MiB, {"defrag": True}),          # defrag on, memory plentiful
])
def test_otherwise_the_block_absorbs_a_rest_of_up_to_1_mib(capacity, settings):
    assert carve(capacity, **settings) == (14 * MiB, 0)


def test_the_rule_follows_the_defrag_setting():
    pool = Pool(SimulatedDevice(32 * MiB), defrag=True)
    first = pool.malloc(REQUEST)
    pool.configure(defrag=False)
    second = pool.malloc(REQUEST)
    assert (first.allocated_size, second.allocated_size) == (REQUEST, 14 * MiB)
    stats = pool.memory_stats()
    assert stats["inactive_split.all.current"] == 1
    assert stats["inactive_split_bytes.all.current"] == 512 * KiB
    check(pool)
