"""Global atomics per malloc and per free of the device heap, counted under
the CUDA simulator (tests/heap_atomics.py in a subprocess): one warp of one
size, and four warps of log-uniform sizes from 16 B to 8 KiB freed in a
shuffled order, each twice on one heap; the statistics exact after each
kernel."""

import os
import sys

import pytest

from simulator_scripts import run_under_simulator
from test_device_heap import block_size

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def counted(once):
    out = once("heap_atomics", lambda: run_under_simulator("heap_atomics.py"))
    # whole warps gathered, as on a GPU (and the lane freeing a warp's block, alone)
    assert set(out["group_sizes"]) == {"32", "1"} and out["group_sizes"]["1"] == 2
    for name in ("one_size", "mixed"):
        print(name, {k: v for k, v in out[name].items() if k.startswith(("malloc", "free"))})
    return out


def test_one_warp_of_one_size(counted):
    one = counted["one_size"]
    # per warp: one atomic for the page (its class, count and allocations),
    # one for the 32 bits (one bitmap word), bytes in use, and the peak (whose
    # result no thread waits for); none per thread
    assert one["malloc_first"] == one["malloc_second"] == (1 + 1 + 1 + 1) / 32
    # per warp: the 32 bits (one word), the page's count, bytes in use
    assert one["free_first"] == one["free_second"] == (1 + 1 + 1) / 32


def test_one_block_per_warp_takes_four_atomics(counted):
    """malloc_warp: the warp's one block (4,320 B, class 4,672) costs per
    warp one atomic for the page, one for its bit, bytes in use, and the
    peak; freeing it its bit, the page's count, bytes in use."""
    warp = counted["warp_block"]
    assert (warp["malloc_first"], warp["malloc_second"]) == (4, 4)
    assert warp["free_first"] == warp["free_second"] == 3
    offsets, sizes = warp["offsets"], warp["sizes"]
    assert [b - a for a, b in zip(offsets, offsets[1:])] == sizes[:-1]    # in lane order
    total = sum(sizes)
    for k, round_ in enumerate(("first", "second")):
        after_malloc, after_free = (warp[f"stats_after_{event}_{round_}"]
                                    for event in ("malloc", "free"))
        assert (after_malloc["num_allocs"], after_malloc["num_frees"]) == (k + 1, k)
        assert after_malloc["bytes_in_use"] == after_malloc["device_bytes_in_use"] == \
            after_malloc["peak_bytes_in_use"] == block_size(total)
        assert (after_free["num_frees"], after_free["bytes_in_use"]) == (k + 1, 0)
        assert after_free["num_failed"] == after_free["num_invalid_frees"] == 0


def test_mixed_sizes_take_at_most_two_atomics_per_malloc_and_per_free(counted):
    mixed = counted["mixed"]
    for round_ in ("first", "second"):
        assert mixed[f"malloc_{round_}"] <= 2 and mixed[f"free_{round_}"] <= 2


def test_the_statistics_are_exact_after_each_kernel(counted):
    from test_device_heap import class_name
    for name in ("one_size", "mixed"):
        run = counted[name]
        sizes = run["sizes"]
        n, live = len(sizes), sum(block_size(s) for s in sizes)
        per_class = {}
        for s in sizes:
            per_class[class_name(s)] = per_class.get(class_name(s), 0) + 1
        for k, round_ in enumerate(("first", "second")):
            for event, in_use in (("malloc", live), ("free", 0)):
                stats = run[f"stats_after_{event}_{round_}"]
                frees = n * k + (n if event == "free" else 0)
                assert (stats["num_allocs"], stats["num_frees"], stats["num_failed"],
                        stats["num_invalid_frees"]) == (n * (k + 1), frees, 0, 0), name
                assert stats["bytes_in_use"] == stats["device_bytes_in_use"] == in_use
                assert stats["peak_bytes_in_use"] == live
                for c, figures in stats["classes"].items():
                    count = per_class.get(c, 0)
                    expected = {"num_allocs": count * (k + 1), "num_failed": 0,
                                "num_frees": count * k + (count if event == "free" else 0)}
                    expected["live_blocks"] = expected["num_allocs"] - expected["num_frees"]
                    expected["bytes_in_use"] = expected["live_blocks"] * (
                        int(c) if c != "large" else 0)
                    assert figures == expected, (name, c)


def test_the_benchmark_prints_each_figure_beside_the_goal(counted):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    import bench_heap_atomics
    rows = list(bench_heap_atomics.rows(counted))
    assert [(label[:8], round_) for label, round_, *_ in rows] == [
        ("one warp", "first"), ("one warp", "second"), ("4 warps,", "first"),
        ("4 warps,", "second")]
    assert all(met for *_, met in rows)
    over = {name: dict(counted[name], free_second=2.5) for name in ("one_size", "mixed")}
    assert [met for *_, met in bench_heap_atomics.rows(over)] == [True, False, True, False]
