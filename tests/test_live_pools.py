"""policy.live_pools: every live Pool, and the hooks told of each new one."""

import gc
import weakref

import pytest

from numba_alloc import Pool, SimulatedDevice
from numba_alloc.policy.live_pools import live_pools, stop_when_pool_made, when_pool_made


def test_a_new_pool_is_live_until_it_is_garbage():
    pool = Pool(SimulatedDevice(1 << 26))
    assert any(p is pool for p in live_pools())
    gone = weakref.ref(pool)
    del pool
    gc.collect()
    assert gone() is None           # live_pools() does not keep it alive


def test_a_hook_sees_each_new_pool_ready_until_it_is_stopped():
    seen = []

    def hook(pool):
        seen.append((pool, pool.memory_stats()["allocation.all.current"]))

    when_pool_made(hook)
    try:
        first = Pool(SimulatedDevice(1 << 26))
    finally:
        stop_when_pool_made(hook)
    Pool(SimulatedDevice(1 << 26))
    assert seen == [(first, 0)]


def test_bad_hooks_are_refused_naming_what_is_allowed():
    with pytest.raises(TypeError, match="hook must be callable"):
        when_pool_made(None)
    with pytest.raises(ValueError, match="is not registered"):
        stop_when_pool_made(print)
