"""The compiled core: built ahead of time, and no cyclic garbage."""

import os
import subprocess
import sys

import pytest

from invariants import check
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat


def test_a_pools_first_use_compiles_nothing():
    """The core is built ahead of time (_core.pyx, and the launch hooks'
    _launch.pyx): a fresh process's first mallocs, frees and retirements
    make no Numba compilation at all."""
    code = ("import numba_alloc\n"
            "from numba.core import event\n"
            "from numba_alloc.policy import _core, core\n"
            "assert core.take is _core.take and _core.__file__.endswith('.so')\n"
            "from numba_alloc.plugin import _launch\n"
            "assert _launch.__file__.endswith('.so')\n"
            "compiled = event.RecordingListener()\n"
            "event.register('numba:compile', compiled)\n"
            "pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(1 << 34))\n"
            "blocks = [pool.malloc(1 << s) for s in range(30) for _ in range(3)]\n"
            "for block in blocks: pool.free(block)\n"
            "pool.synchronize(); pool.empty_cache()\n"
            "print('compiled', len(compiled.buffer))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["compiled", "0"]


PAIRS = """
import gc, sys
sys.path.insert(0, sys.argv[1])
from invariants import check
from numba_alloc import Pool, SimulatedDevice
pool = Pool(SimulatedDevice(1 << 32))
blocks = [pool.malloc(1000 * (i % 7 + 1)) for i in range(100)]

def pairs(n):
    for i in range(n):
        pool.free(blocks[i % 100])
        blocks[i % 100] = pool.malloc(512 * (i % 13 + 1) + (i % 3) * (1 << 20))
pairs(2_000)
pool.synchronize()
pool.empty_cache()
gc.collect()
gc.disable()
pairs(20_000)
pool.synchronize()
print("garbage", gc.collect())
gc.enable()
check(pool)
"""


def test_pairs_leave_no_cyclic_garbage():
    """20,000 free and malloc pairs of mixed sizes (after 2,000 that warm
    the pool up) leave nothing for the cyclic garbage collector. In a
    process of its own: in a test worker, what other tests left running
    (threads, finalizers) could make garbage while the collector is off."""
    out = subprocess.run([sys.executable, "-c", PAIRS, os.path.dirname(__file__)],
                         capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["garbage", "0"]


def test_table_growth_keeps_handles_and_counters():
    pool = Pool(SimulatedDevice(1 << 34))
    blocks = [pool.malloc(512 * (i % 50 + 1)) for i in range(5000)]   # past the first table
    for block in blocks[::2]:
        pool.free(block)
    pool.synchronize()
    check(pool)
    for block in blocks[1::2]:
        pool.free(block)
    pool.synchronize()
    assert compat.memory_allocated(pool) == 0
    check(pool)


def test_free_blocks_of_32_mib_and_more_are_found_best_fit():
    pool = Pool(SimulatedDevice(1 << 34))
    big = [pool.malloc(n << 20) for n in (40, 34, 64)]
    keep = [pool.malloc(1 << 20) for _ in range(3)]
    for block in big:
        pool.free(block)
    pool.synchronize()
    again = pool.malloc(33 << 20)
    assert again.allocated_size == 34 << 20 or again.address == big[1].address
    check(pool)
    del keep


def test_generations_wrap_and_tickets_stay_positive():
    from numba_alloc.policy import core
    pool = Pool(SimulatedDevice(1 << 30))
    pool.free(pool.malloc(10))
    pool._mv[core.H_GEN] = core.GEN_MASK - 1          # as after 2**36 allocations
    blocks = [pool.malloc(1000) for _ in range(4)]
    assert all(b._ticket > 0 for b in blocks)
    assert [b._ticket >> core.ROW_BITS for b in blocks] == [core.GEN_MASK, 0, 1, 2]
    for b in blocks:
        pool.free(b)
    pool.synchronize()
    check(pool)


def test_the_block_table_refuses_to_grow_past_what_a_ticket_names():
    from numba_alloc.policy import core
    full = core.new_state(8)
    full[core.H_CAP] = core.ROW_MASK + 1 - 4            # stands in for a huge table
    with pytest.raises(MemoryError, match="block table is full"):
        core.grown(full, 8)
