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
