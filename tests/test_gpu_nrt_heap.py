"""NRT's np.empty served by the pool's heap (nrt_heap_size) on a real GPU
(skipped without one): benchmarks/bench_nrt_heap.py's kernels, each side in
a process of its own (the setting is fixed before the first kernel is
compiled), checked for what they computed and for the heap's counters. The
speed against CUDA's heap is the benchmark's. numba-cuda's own NRT tests
with the setting: the GPU session's nrt step (benchmarks/gpu_session.sh)."""

import sys
from pathlib import Path
from types import SimpleNamespace

from gpu_marks import GPU_MARKS, gpu_only, gpu_toolchain  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_nrt_heap as bench  # noqa: E402

pytestmark = GPU_MARKS + [gpu_only("a million threads, and the heap's counters, which the "
                                   "stand-in's kernels (Python, NumPy's np.empty) never touch")]

GiB = 1 << 30


def _run(side, parts, threads=bench.THREADS, launches=2):
    args = SimpleNamespace(threads=threads, launches=launches, lto=False, tiny=False)
    result = bench.spawn(side, parts, args)
    assert "error" not in result, result.get("error")
    return result


def test_a_million_threads_np_empty_is_right_and_the_counters_exact_after_the_kernels():
    result = _run("pool", ("sums", "live"))
    assert result["sums"]["right"]
    live, nrt = result["live"], result["nrt"]
    arrays = bench.ARRAYS * live["done"] + bench.THREADS * 3    # 2 launches and the warm-up
    assert nrt["nrt.num_allocs"] == nrt["nrt.num_frees"] == arrays
    assert nrt["nrt.bytes_in_use"] == 0 and nrt["nrt.num_failed"] == 0
    assert nrt["nrt.num_invalid_frees"] == 0


def test_a_gibibyte_of_small_arrays_lives_at_once_in_one_kernel_within_the_limit():
    result = _run("pool", ("live",))
    live, nrt = result["live"], result["nrt"]
    assert live["done"] == live["arrived"] == live["threads"] and live["wrong"] == 0
    assert live["data_bytes"] >= GiB and nrt["nrt.peak_bytes_in_use"] >= GiB
    assert nrt["nrt.reserved_bytes"] <= 8 * GiB                 # the side's limit


def test_cudas_heap_at_its_default_size_cannot_hold_it():
    live = _run("cuda-default", ("live",))["live"]
    assert live["done"] < live["threads"]
