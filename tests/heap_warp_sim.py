"""The device heap's warp-aggregated malloc, malloc_warp and free under the
CUDA simulator, property-based (run by test_heap_warp.py in a subprocess
with NUMBA_ENABLE_CUDASIM=1): random sizes, random sets of lanes calling,
frees of blocks twice, of offsets inside blocks and of nothing. Every
example checks the offsets against the heap's own bookkeeping (its
bitmaps, page words and runs) and the statistics exactly; a failing
example raises (Hypothesis prints it, unshrunk: each example runs kernels
in the simulator). Prints one JSON object: the
examples run and the group sizes the simulator's warps formed."""

import json
import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from numba import cuda

from numba_alloc import DeviceHeap, Pool, SimulatedDevice
from numba_alloc.device import heap_kernels as hk
from numba_alloc.device import heap_layout as layout
from heap_sim import live_blocks as blocks_in
import simulator_threads
from test_device_heap import block_size

PAGE, LANES, PAGES = layout.PAGE, 64, 40     # two warps, a heap of 40 pages
EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 20
FREE_PLANS = ("own", "other", "inside", "none")


def gathered():
    """The lanes of this simulated thread's last ``activemask()``: the
    group it called malloc_warp with."""
    return hk.cuda.warps._local.group.lanes


@cuda.jit
def some_malloc(heap, sizes, calls, offsets):
    i = cuda.grid(1)
    if calls[i]:
        offsets[i] = heap.malloc(sizes[i])


@cuda.jit
def some_malloc_warp(heap, sizes, calls, offsets, mine, groups):
    i = cuda.grid(1)
    if calls[i]:
        off, first = heap.malloc_warp(sizes[i])
        offsets[i] = off
        mine[i] = first
        groups[i] = gathered()


@cuda.jit
def some_free(heap, offsets, calls):
    i = cuda.grid(1)
    if calls[i]:
        heap.free(offsets[i])


def class_name(n):
    """The key of heap.stats()["classes"] counting a request of ``n`` bytes."""
    return block_size(n) if 0 <= n <= layout.DEFAULT_CLASSES[-1] else "large"


def live_blocks(heap):
    return blocks_in(heap._meta, heap.size // PAGE)


def check_disjoint(spans):
    spans = sorted(spans)
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b, f"[{a}, {a + n}) and {b} overlap"
    assert all(a % 16 == 0 and 0 <= a and a + n <= PAGES * PAGE for a, n in spans)


def check_stats(heap, before, allocs, frees, failed, invalid, failed_classes=None):
    """The heap's statistics moved from ``before`` by exactly these counts,
    and its bytes in use are those of its live blocks."""
    stats = heap.stats()
    live = live_blocks(heap)
    assert stats["num_allocs"] - before["num_allocs"] == allocs
    assert stats["num_frees"] - before["num_frees"] == frees
    assert stats["num_failed"] - before["num_failed"] == failed
    assert stats["num_invalid_frees"] - before["num_invalid_frees"] == invalid
    assert stats["bytes_in_use"] == int(heap._meta[layout.BYTES_IN_USE]) == sum(live.values())
    assert stats["peak_bytes_in_use"] >= stats["bytes_in_use"]
    for name, count in (failed_classes or {}).items():
        assert stats["classes"][name]["num_failed"] - before["classes"][name]["num_failed"] \
            == count, name
    return stats


def free_plan(offsets, plans, others):
    """The offsets each lane frees: its own, another lane's (a second free,
    or a block of the other kernel's), 16 bytes into its own, or none (-1)."""
    out = np.full(LANES, -1, np.int64)
    for i, (plan, other) in enumerate(zip(plans, others)):
        if plan == "own":
            out[i] = offsets[i]
        elif plan == "other":
            out[i] = offsets[other]
        elif plan == "inside" and offsets[i] >= 0:
            out[i] = offsets[i] + 16
    return out


def free_and_check(heap, freeing):
    """Free ``freeing`` (per lane; -1: none); the frees and invalid frees
    counted exactly: each live block once, everything else invalid."""
    before, live = heap.stats(), live_blocks(heap)
    warps = -(-freeing.size // 32)
    padded = np.concatenate([freeing, np.full(warps * 32 - freeing.size, -1, np.int64)])
    some_free[warps, 32](heap, padded, np.ones(padded.size, np.bool_))
    targets = [int(o) for o in freeing if o != -1]
    valid = {o for o in targets if o in live}
    check_stats(heap, before, 0, len(valid), 0, len(targets) - len(valid))
    RUNS["invalid_frees"] += len(targets) - len(valid)
    RUNS["second_frees"] += len(targets) - len(set(targets))
    assert live_blocks(heap) == {o: n for o, n in live.items() if o not in valid}


small = st.integers(0, 256)           # (one_of picks a branch evenly: small ones thrice)
sizes_per_lane = st.lists(st.one_of(small, small, small, st.integers(257, 8192),
                                    st.integers(8193, 2 * PAGE), st.integers(-3, -1)),
                          min_size=LANES, max_size=LANES)
warp_sizes = st.lists(st.one_of(st.integers(0, 600), st.integers(601, 6000),
                                st.integers(6001, PAGE), st.integers(-2, -1)),
                      min_size=LANES, max_size=LANES)
lanes_calling = st.one_of(st.just([True] * LANES),
                          st.lists(st.booleans(), min_size=LANES, max_size=LANES))
plans = st.lists(st.sampled_from(FREE_PLANS), min_size=LANES, max_size=LANES)
others = st.lists(st.integers(0, LANES - 1), min_size=LANES, max_size=LANES)
RUNS = {"examples": 0, "failed_mallocs": 0, "refused_groups": 0, "page_runs": 0,
        "invalid_frees": 0, "second_frees": 0}      # how often each case came up


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.generate))          # (shrinking takes minutes)
@given(sizes_per_lane, lanes_calling, warp_sizes, lanes_calling, plans, others)
def test_mixed_kernels(sizes, calls, wsizes, wcalls, how, which):
    """malloc, then malloc_warp on the same heap, then frees of both kinds'
    blocks (some twice, some not blocks at all), then the rest freed."""
    RUNS["examples"] += 1
    sizes, calls = np.array(sizes, np.int64), np.array(calls, np.bool_)
    wsizes, wcalls = np.array(wsizes, np.int64), np.array(wcalls, np.bool_)
    with DeviceHeap(PAGES * PAGE, pool=POOL) as heap:
        # malloc, one per lane: distinct aligned blocks, the bookkeeping's own
        before = heap.stats()
        offsets = np.full(LANES, -1, np.int64)
        some_malloc[2, 32](heap, sizes, calls, offsets)
        got = calls & (offsets >= 0)
        assert not (calls & (sizes < 0) & got).any() and (offsets[~calls] == -1).all()
        check_disjoint([(int(o), block_size(int(n))) for o, n in zip(offsets[got], sizes[got])])
        assert live_blocks(heap) == {int(o): block_size(int(n))
                                     for o, n in zip(offsets[got], sizes[got])}
        failed = {}
        for n in sizes[calls & ~got]:
            failed[class_name(int(n))] = failed.get(class_name(int(n)), 0) + 1
        check_stats(heap, before, int(got.sum()), 0, int((calls & ~got).sum()), 0, failed)
        RUNS["failed_mallocs"] += int((calls & ~got & (sizes >= 0)).sum())
        # malloc_warp: per group, one block, the lanes' parts in lane order
        before, first_blocks = heap.stats(), live_blocks(heap)
        woff = np.full(LANES, -1, np.int64)
        mine, groups = np.zeros(LANES, np.bool_), np.zeros(LANES, np.int64)
        some_malloc_warp[2, 32](heap, wsizes, wcalls, woff, mine, groups)
        served, refused, parts, owners = 0, 0, [], {}
        for warp in range(LANES // 32):
            for lanes in {int(groups[i]) for i in range(warp * 32, warp * 32 + 32) if wcalls[i]}:
                members = [warp * 32 + lane for lane in range(32) if lanes >> lane & 1]
                assert all(wcalls[i] and groups[i] == lanes for i in members)
                asking = [i for i in members if wsizes[i] >= 0]
                assert all(woff[i] == -1 and not mine[i] for i in members if wsizes[i] < 0)
                if not asking:
                    continue
                base = woff[asking[0]]
                if base < 0:
                    refused += 1
                    assert all(woff[i] == -1 and not mine[i] for i in asking)
                    continue
                served += 1
                units = [-(-int(wsizes[i]) // 16) for i in asking]
                assert [woff[i] for i in asking] == [base + 16 * sum(units[:k])
                                                     for k in range(len(asking))]
                assert [bool(mine[i]) for i in asking] == [True] + [False] * (len(asking) - 1)
                owners[int(base)] = 16 * sum(units)
                parts += [(int(woff[i]), 16 * u) for i, u in zip(asking, units) if u]
        blocks = live_blocks(heap)
        assert set(blocks) - set(first_blocks) == set(owners)
        assert all(owners[o] <= blocks[o] == block_size(owners[o]) for o in owners)
        RUNS["refused_groups"] += refused
        RUNS["page_runs"] += sum(n > layout.DEFAULT_CLASSES[-1] for n in owners.values())
        check_disjoint(parts + [(o, n) for o, n in first_blocks.items()])
        check_stats(heap, before, served, 0, refused + int((wcalls & (wsizes < 0)).sum()), 0)
        # frees of both: the plan's mix of good and bad frees, then the rest
        everything = np.where(got, offsets, np.where(mine, woff, -1))
        free_and_check(heap, free_plan(everything, how, which))
        free_and_check(heap, np.array(sorted(live_blocks(heap)) or [-1], np.int64))
        assert live_blocks(heap) == {} and heap.stats()["bytes_in_use"] == 0
        assert not heap._meta[layout.HEADER + 2 * PAGES:].any()          # every bitmap clear


if __name__ == "__main__":
    simulator_threads.install()
    POOL = Pool(SimulatedDevice("64MiB"))
    test_mixed_kernels()
    print(json.dumps(dict(RUNS, group_sizes=dict(hk.cuda.warps.group_sizes))))
