"""Property-based tests: random sequences of pool operations, single- and
multi-threaded, checking the block table, the counters and the data after
every step."""

import threading

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat

from invariants import check
from owner import Owner

KiB, MiB = 1 << 10, 1 << 20

sizes = st.one_of(st.integers(0, 4 * KiB), st.integers(4 * KiB, 2 * MiB),
                  st.integers(MiB, 40 * MiB))
pool_settings = st.one_of(
    st.just({}),
    st.just({"expandable_segments": True}),
    st.just({"expandable_segments": True, "defrag": True, "limit": 64 * MiB}),
    st.just({"defrag": True, "limit": 64 * MiB}),
    st.just({"max_split_size_mb": 24}),
    st.just({"limit": 64 * MiB}),
    st.just({"growth": False, "limit": 80 * MiB}),
    st.just({"garbage_collection_threshold": 0.5, "limit": 0.5}),
)


class PoolMachine(RuleBasedStateMachine):
    @initialize(config=pool_settings)
    def start(self, config):
        self.device = SimulatedDevice(160 * MiB)
        self.pool = Pool(self.device, **config)
        self.owner = Owner(self.device, self.pool)

    @rule(size=sizes)
    def malloc(self, size):
        before = self.pool.memory_stats()
        if self.owner.malloc(size) is None:
            after = self.pool.memory_stats()
            assert after["num_ooms"] == before["num_ooms"] + 1
            assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]

    @precondition(lambda self: self.owner.live)
    @rule(index=st.integers(0, 1000))
    def free(self, index):
        self.owner.free(index)

    @rule()
    def empty_cache(self):
        self.pool.empty_cache()

    @rule()
    def launch_work(self):
        self.device.launch()

    @rule(count=st.integers(1, 3))
    def complete_work(self, count):
        self.device.complete(count)

    @invariant()
    def consistent(self):
        if hasattr(self, "pool"):
            check(self.pool)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


ops = st.lists(st.one_of(st.tuples(st.just("malloc"), sizes),
                         st.tuples(st.just("free"), st.integers(0, 1000)),
                         st.tuples(st.just("empty_cache"), st.none()),
                         st.tuples(st.just("launch"), st.none()),
                         st.tuples(st.just("complete"), st.none())),
               max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=pool_settings, programs=st.lists(ops, min_size=2, max_size=4))
def test_threads_keep_the_pool_consistent(config, programs):
    device = SimulatedDevice(160 * MiB)
    pool = Pool(device, **config)
    errors = []
    start = threading.Barrier(len(programs))

    def run(program):
        owner = Owner(device, pool)
        try:
            start.wait()
            for op, arg in program:
                if op == "malloc":
                    owner.malloc(arg)
                elif op == "free" and owner.live:
                    owner.free(arg)
                elif op == "empty_cache":
                    pool.empty_cache()
                elif op == "launch":
                    device.launch()
                elif op == "complete":
                    device.complete(1)
                check(pool)
            while owner.live:
                owner.free(0)
        except Exception as e:  # reported below, with the thread's traceback
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in programs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    pool.empty_cache()
    snap = check(pool)
    assert snap["stats"]["allocated_bytes.all.current"] == 0
    assert snap["stats"]["active_bytes.all.current"] == 0


def test_many_threads_hammering_one_pool():
    device = SimulatedDevice(1 << 30)
    pool = Pool(device)
    rounds, nthreads = 400, 8
    errors = []

    def run(seed):
        rng = np.random.default_rng(seed)
        owner = Owner(device, pool)
        try:
            for _ in range(rounds):
                if owner.live and rng.random() < 0.5:
                    owner.free(int(rng.integers(0, 1000)))
                else:
                    owner.malloc(int(rng.choice([rng.integers(0, 8 * KiB),
                                                 rng.integers(8 * KiB, 3 * MiB)])))
            while owner.live:
                owner.free(0)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    snap = check(pool)
    stats = snap["stats"]
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"]


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.one_of(st.tuples(st.just("malloc"), st.integers(0, 3 * MiB)),
                                st.tuples(st.just("free"), st.integers(0, 100)),
                                st.tuples(st.just("complete"), st.none())), max_size=60))
def test_peaks_are_exact_without_reading_between_steps(steps):
    """Peaks are settled lazily; a model tracking every step must agree."""
    device = SimulatedDevice(1 << 30)
    pool = Pool(device)
    live = []
    in_use = peak_in_use = count = peak_count = 0
    for op, arg in steps:
        if op == "malloc":
            block = pool.malloc(arg)
            live.append(block)
            in_use += block.allocated_size
            count += 1
            device.launch()
        elif op == "free" and live:
            block = live.pop(arg % len(live))
            in_use -= block.allocated_size
            count -= 1
            pool.free(block)
        elif op == "complete":
            device.complete()
        peak_in_use, peak_count = max(peak_in_use, in_use), max(peak_count, count)
    stats = pool.memory_stats()
    assert stats["allocated_bytes.all.peak"] == compat.max_memory_allocated(pool) == peak_in_use
    assert stats["allocation.all.peak"] == peak_count
    assert stats["allocated_bytes.all.current"] == in_use
    check(pool)
