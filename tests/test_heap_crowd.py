"""benchmarks/bench_heap_crowd.py: its lockstep rounds, and the device
heap run by a crowd of warps in them (the heap's own device functions as
Python): the accesses to memory a warp's malloc takes on a fresh heap, and
mallocs and frees interleaved, no block given twice and the counters
exact."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import bench_heap_crowd as crowd  # noqa: E402
from test_device_heap import block_size  # noqa: E402


@pytest.mark.parametrize("warps, resident, serve, rounds", [
    (256, 64, 16, 16),          # one word, 16 accesses a round: 256 / 16
    (256, 64, 64, 4),           # every resident warp served each round: 4 waves
    (100, 64, 8, 13),           # the last round serves 4
])
def test_a_word_serves_a_limited_number_of_accesses_a_round(warps, resident, serve, rounds):
    assert crowd.bump_crowd(warps, resident, serve) == rounds


@pytest.mark.parametrize("size", [16, 256])
def test_a_crowd_of_warps_takes_its_blocks_without_retrying_the_bitmap(size):
    """1024 warps of 32 lanes, 128 at once, on a fresh heap: every malloc
    gets a block no other warp got (checked by heap_crowd), in about 8
    accesses to memory (the hint, a page word or two and its atomic, one
    bitmap word, bytes in use, the peak): a warp's reservation names the
    bits it takes, so no leader reads a bitmap word another took first and
    tries again (12.8 accesses a malloc at 16 B before, 28 at 256 B, where
    a crowd also walked page by page past a front of 32 pages)."""
    rounds, accesses, failed, by_word = crowd.heap_crowd(1024, 128, 32, 32, size, 1024)
    assert failed == 0
    assert accesses < 10 and by_word["bitmaps"] == 1.0
    assert rounds < 4 * crowd.bump_crowd(1024, 128, 32)


@pytest.mark.parametrize("seed", range(3))
def test_a_crowd_that_mallocs_and_frees_never_holds_a_block_twice(seed):
    """512 warps of one lane, 64 at once in lockstep rounds, on a heap of
    12 pages (mallocs fail at times): each mallocs 16 B to 70,000 B and
    every other one frees a block another warp got, so that tickets land
    on pages whose blocks were freed in any order, and runs take pages
    back: no block is given twice, none overlaps another, and bytes in
    use, the peak and the live blocks per class are exact."""
    import random
    import threading

    from numba_alloc.device import heap_kernels as hk
    from numba_alloc.device import heap_layout as layout
    from numba_alloc.plugin.heap_counters import heap_figures
    pages = 12
    meta = crowd.fresh_meta(pages)
    data = crowd.HeapBytes(pages * layout.PAGE)
    rng = random.Random(seed)
    plan = [(rng.choice((16, 48, 256, 1000, 4096, 8000, 70000)), rng.random() < 0.5)
            for _ in range(512)]
    held, twice, lock = {}, [], threading.Lock()

    def malloc_then_free(lane, warp):
        size, give_back = plan[warp]
        off = hk.heap_malloc(data, meta, size)
        with lock:
            if off >= 0:
                if off in held:
                    twice.append(off)
                held[off] = size
            victim = next(iter(held), None) if give_back else None
            if victim is not None:
                del held[victim]
        if victim is not None:
            hk.heap_free(data, meta, victim)
        return off

    _, offsets = crowd.crowd(512, 64, 16, 1, malloc_then_free)
    assert not twice and (offsets == -1).any() and (offsets >= 0).sum() > 256
    spans = sorted((off, off + block_size(size)) for off, size in held.items())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    live = sum(block_size(size) for size in held.values())
    counters, classes = heap_figures(meta[:layout.HEADER + pages], layout.DEFAULT_CLASSES)
    assert meta[layout.BYTES_IN_USE] == counters["bytes_in_use"] == live
    assert meta[layout.PEAK_BYTES_IN_USE] >= live
    assert sum(c["live_blocks"] for c in classes.values()) == len(held)


def test_a_crowd_of_one_block_mallocs_of_a_large_class_leaves_room_for_a_large_run(
        monkeypatch):
    """512 warps of one lane each malloc one 8 KiB block (8 a page) on a
    heap of 8192 pages: past a full hint page they spread over at most
    FRONT_PAGES pages (the front moving on as the hint does), so most of
    the heap stays free for page runs. Before that cap, the front of
    2^17 blocks was 512 pages: 491 pages held a block or two, and a run of
    7700 pages failed with 7701 pages free."""
    from numba_alloc.device import heap_kernels as hk
    from numba_alloc.device import heap_layout as layout
    from numba_alloc.device import warp
    from numba_alloc.device.heap_search import FRONT_PAGES
    from test_device_heap import _OneLane
    pages = 8192
    meta, data = crowd.fresh_meta(pages), crowd.HeapBytes(pages * layout.PAGE)
    _, offsets = crowd.crowd(512, 256, 64, 1, lambda lane, w: hk.heap_malloc(data, meta, 8000))
    assert (offsets >= 0).all() and len(set(offsets.tolist())) == 512
    held = set((offsets // layout.PAGE).tolist())
    assert 512 // 8 <= len(held) <= 2 * FRONT_PAGES
    lane = _OneLane(lambda *args: None)
    monkeypatch.setattr(hk, "cuda", lane)
    monkeypatch.setattr(warp, "cuda", lane)
    monkeypatch.setattr(hk, "_load", lambda array, index: array[index])
    run = hk._malloc_large(meta, pages, (pages - 2 * FRONT_PAGES) * layout.PAGE)
    assert run >= 0 and not held & set(
        range(run // layout.PAGE, run // layout.PAGE + pages - 2 * FRONT_PAGES))
