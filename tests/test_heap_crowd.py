"""benchmarks/bench_heap_crowd.py: its lockstep rounds."""

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
