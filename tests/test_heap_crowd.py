"""benchmarks/bench_heap_crowd.py: its lockstep rounds, and the device
heap's malloc run by a crowd of warps in them (the heap's own device
functions as Python): no block given twice, and the accesses to memory a
warp's malloc takes on a fresh heap."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import bench_heap_crowd as crowd  # noqa: E402


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
    rounds, accesses, failed = crowd.heap_crowd(1024, 128, 32, 32, size, 1024)
    assert failed == 0
    assert accesses < 10
    assert rounds < 4 * crowd.bump_crowd(1024, 128, 32)
