"""The compaction planner's compiled best-fit set of free ranges and its
radix sort, against plain Python models."""

import bisect

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import given, settings
from hypothesis import strategies as st

from numba_alloc.policy import free_ranges
from numba_alloc.policy.compaction import Layout, LiveBlock, SegmentMap


def _contents(ranges):
    """Every (size, start, owner) in the set, in order, and the per-bucket
    invariants checked on the way."""
    out = []
    for bucket, top in ranges.buckets():
        assert 0 < len(bucket) < free_ranges.CAPACITY
        assert top == bucket[-1][:2]
        out += bucket
    assert out == sorted(out)
    return out


operations = st.lists(st.tuples(st.sampled_from(["add", "remove", "take"]),
                                st.integers(1, 40), st.integers(0, 10 ** 6)),
                      max_size=3000)


@settings(max_examples=60, deadline=None)
@given(initial=st.integers(0, 1500), ops=operations, seed=st.integers(0, 2 ** 32 - 1))
def test_the_set_matches_a_sorted_list_through_adds_removes_and_takes(initial, ops, seed):
    """Buckets split and empty (thousands of ranges against a capacity of
    2 * LOAD); take_at_least is best fit, the lowest start among equals."""
    rng = np.random.default_rng(seed)
    starts = rng.permutation(initial) * 1000            # disjoint, any order
    sizes = rng.integers(1, 40, initial)
    ranges = free_ranges.make(sizes.astype(np.int64), starts.astype(np.int64),
                              (starts // 7).astype(np.int64), len(ops))
    model = sorted(zip(sizes.tolist(), starts.tolist(), (starts // 7).tolist()))
    used = set(starts.tolist())
    for op, size, where in ops:
        if op == "add":
            start = where * 1000 + 500                  # never an initial start
            if start in used:
                continue
            used.add(start)
            ranges.add(size, start, start % 3)
            bisect.insort(model, (size, start, start % 3))
        elif op == "remove" and model:
            victim = model.pop(where % len(model))
            ranges.remove(victim[0], victim[1])
        elif op == "take":
            i = bisect.bisect_left(model, (size,))
            expected = model.pop(i) if i < len(model) else (-1, -1, -1)
            assert ranges.take_at_least(size) == expected
        assert ranges.largest() == (model[-1][0] if model else 0)
    assert _contents(ranges) == model


@pytest.mark.parametrize("seed", range(6))
def test_long_runs_split_and_empty_buckets_and_match_the_model(seed):
    """Thousands of adds into a narrow band of sizes (one bucket fills and
    splits again and again), then takes and removes until buckets empty;
    the invariants are checked along the way."""
    rng = np.random.default_rng(seed)
    ranges = free_ranges.make(np.zeros(0, np.int64), np.zeros(0, np.int64),
                              np.zeros(0, np.int64), 40_000)
    model, next_start = [], 0
    for step in range(24_000):
        phase = step // 8_000                   # adds, then mixed, then mostly takes
        op = rng.choice(["add", "take", "remove"], p=[[0.9, 0.05, 0.05], [0.4, 0.3, 0.3],
                                                       [0.1, 0.6, 0.3]][phase])
        size = int(rng.integers(1, 4)) * (1 + seed)
        if op == "add":
            next_start += int(rng.integers(1, 5))
            ranges.add(size, next_start, step)
            bisect.insort(model, (size, next_start, step))
        elif op == "take":
            i = bisect.bisect_left(model, (size,))
            expected = model.pop(i) if i < len(model) else (-1, -1, -1)
            assert ranges.take_at_least(size) == expected
        elif model:
            victim = model.pop(int(rng.integers(len(model))))
            ranges.remove(victim[0], victim[1])
        if step % 1000 == 999:
            assert _contents(ranges) == model
    assert _contents(ranges) == model


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.integers(0, 2 ** 62), max_size=400), scale=st.integers(0, 40))
def test_stable_order_is_numpys_stable_argsort(keys, scale):
    keys = np.array(keys, np.int64) >> scale << scale      # shared low zero bits too
    assert free_ranges.stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()


def test_a_layout_keeps_its_segments_blocks_in_address_order():
    segments = [SegmentMap(4096, 4096, (LiveBlock(6144, 512, False), LiveBlock(4096, 1024, True))),
                SegmentMap(0, 2048, ()),
                SegmentMap(1 << 20, 1024, (LiveBlock(1 << 20, 512, False),))]
    layout = Layout.of(segments)
    assert layout.first.tolist() == [0, 2, 2, 3]
    assert layout.address.tolist() == [4096, 6144, 1 << 20]
    assert layout.fixed.tolist() == [1, 0, 0]
    assert layout.segment_maps() == [SegmentMap(s.address, s.size, tuple(sorted(s.live)))
                                     for s in segments]
