"""benchmarks/bench_reclaim_gpu.py's arithmetic, on made-up figures (the
measurements themselves need a GPU)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_reclaim_gpu as bench  # noqa: E402

MiB = 1 << 20


def test_the_fitting_run_leaves_room_and_the_others_oversubscribe():
    limit = 1024 * MiB
    assert bench.layer_count(1.0, limit) * bench.ARRAY < limit
    assert bench.layer_count(1.5, limit) * bench.ARRAY == 1.5 * limit
    assert bench.layer_count(3.0, limit) * bench.ARRAY == 3 * limit


def test_bandwidth_is_the_bytes_moved_over_the_time_beyond_the_fitting_run():
    def layers(ratio, ms, to_host, back, wrong=()):
        return {"ratio": ratio, "arrays": 10, "steps": 100, "ms_per_step": ms,
                "to_host_bytes": to_host, "back_bytes": back, "wrong_arrays": list(wrong)}
    peak = {"to_device": 20e9, "to_host": 30e9}
    summary = bench.summarize(
        [layers(1.0, 2.0, 0, 0), layers(3.0, 12.0, 10e9, 10e9, wrong=[4]),
         {"ratio": 1.5, "error": "Traceback\nOutOfMemoryError: no room"}],
        peak, launch_on=9.5, launch_off=8.0)
    fit, over, failed = summary["rows"]
    assert fit["step_over_fit"] == 1 and "reclaim_bandwidth" not in fit and fit["correct"]
    # 10 ms more per step over 100 steps: 1 s for 20 GB moved
    assert over["step_over_fit"] == 6
    assert over["reclaim_bandwidth"] == pytest.approx(20e9)
    assert over["bandwidth_over_peak"] == pytest.approx(20e9 / 25e9)
    assert over["mib_to_host_per_step"] == pytest.approx(10e9 / MiB / 100)
    assert not over["correct"]
    assert failed == {"ratio": 1.5, "error": "Traceback\nOutOfMemoryError: no room"}
    assert summary["hooks"]["hook_cost_us"] == pytest.approx(1.5)
    text = bench.report(summary)
    assert "| 3.0x | 10 | 12.000 | 6.00 |" in text and "20.0 | 0.80 | False |" in text
    assert "OutOfMemoryError: no room" in text and "+1.50 us per launch" in text


def test_block_bandwidths_are_bytes_over_seconds_the_first_round_apart():
    figures = [{"size": 64 * MiB, "blocks": 8, "bytes": 512 * MiB, "chunk": 8 * MiB,
                "seconds": {"out": [1.0, 0.02, 0.01, 0.03], "pinned_out": [0.02, 0.01, 0.01, 0.01],
                            "in": [0.5, 0.04, 0.04, 0.05], "pinned_in": [0.01, 0.01, 0.01, 0.03]},
                "reclaimed_bytes": 4 * 512 * MiB, "wrong_blocks": []},
               {"size": 4 * MiB, "blocks": 128, "bytes": 512 * MiB, "chunk": 8 * MiB,
                "seconds": {"out": [0.9, 0.014], "pinned_out": [0.01, 0.01],
                            "in": [0.8, 0.013], "pinned_in": [0.01, 0.01]},
                "reclaimed_bytes": 2 * 512 * MiB, "wrong_blocks": [3]},
               {"error": "Traceback\nCudaAPIError: no context"}]
    big, small, failed = bench.block_rows(figures)
    assert big["out_cold"] == 512 * MiB / 1.0 and big["in_cold"] == 512 * MiB / 0.5
    assert big["out"] == pytest.approx(512 * MiB / 0.02)       # the median after the first
    assert big["pinned_out"] == pytest.approx(512 * MiB / 0.01)  # the median of all rounds
    assert big["out_ratio"] == pytest.approx(0.5) and big["in_ratio"] == pytest.approx(0.25)
    assert not big["goal_met"] and big["correct"]
    assert small["out_ratio"] == pytest.approx(1 / 1.4) and small["in_ratio"] == pytest.approx(1 / 1.3)
    assert small["goal_met"] and not small["correct"]
    assert failed == {"error": "Traceback\nCudaAPIError: no context"}
    text = bench.blocks_report([big, small, failed])
    # 512 MiB in 0.02 s: 26.8 GB/s; in 1 s: 0.5; in 0.01 s: 53.7
    assert "| 64 MiB | 8 | 8 MiB | 26.8 (0.5) | 53.7 | 0.50 | 13.4 (1.1) | 53.7 | 0.25 | not met " \
           "| True |" in text
    assert "| 4 MiB | 128 |" in text and "| met | False |" in text
    assert "error: CudaAPIError: no context" in text
