"""NRT served by the pool (nrt_heap_size) through numba-cuda's real compile,
link (NVVM, NVRTC, nvJitLink) and module-load path, over the driver
stand-in: tests/nrt_standin.py's scenarios, each in a fresh process. The
linked code calls the heap's malloc and free and never CUDA's; a module
gets its device's heap descriptor; a kernel linked with one heap is never
run where the other serves."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_standin import pytestmark  # noqa: F401 (NVVM, and a process of its own)

TESTS = Path(__file__).parent


HEAP_SYMBOLS = {"numba_alloc_heap_malloc", "numba_alloc_heap_free"}


def scenario(name, conf="", cache_dir=None):
    """nrt_standin.py's scenario ``name``'s JSON, run in a fresh process with
    NUMBA_ALLOC_CONF ``conf`` and, given ``cache_dir``, Numba's disk cache there."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER", "NUMBA_ALLOC_CONF",
                        "NUMBA_ALLOC_STANDIN", "NUMBA_CACHE_DIR")}
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    env.update(NUMBA_CUDA_ENABLE_NRT="1", NUMBA_ALLOC_CONF=conf,
               PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(TESTS / "nrt_standin.py"), name], env=env,
                          cwd=TESTS, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture
def heap_serves_nrt(once):
    return once("nrt_heap_serves_nrt", lambda: scenario("heap_serves_nrt", "nrt_heap_size:4MiB"))


def test_a_kernel_using_np_empty_links_the_heap_and_never_cudas_malloc(heap_serves_nrt):
    out = heap_serves_nrt
    assert out["right"] and out["errors"] == []
    assert out["linked"] == ["numba_alloc_heap_free.ptx", "numba_alloc_heap_malloc.ptx",
                             "numba_alloc_nrt.cu"]
    # NRT's functions as linked (LTO): the heap's malloc and free, no malloc or free
    assert HEAP_SYMBOLS <= set(out["calls"])
    assert not {"malloc", "free"} & set(out["calls"])
    # the heap's own functions: no malloc or free, no reference counting (NRT off there)
    assert all(not {"malloc", "free"} & set(calls) and not any(c.startswith("NRT_") for c in calls)
               for calls in out["heap_calls"].values())
    # NRT calls each with the prototype it is defined with (an int64 back, five 64-bit words)
    assert out["declared"] == out["defined"] == {
        symbol: ["b64", ["b64"] * 5] for symbol in HEAP_SYMBOLS}


def test_the_module_holds_the_pools_heap_descriptor_and_the_heap_counts_in_the_pool(
        heap_serves_nrt):
    out = heap_serves_nrt
    assert out["global"] == out["descriptor"]
    heap = out["heap"]
    assert out["words"][:2] == [heap["address"], heap["size"]] and heap["size"] == 4 << 20
    assert out["words"][2] == heap["address"] + heap["size"]
    assert out["pinned"] == [True, True]
    stats = out["stats"]
    assert stats["nrt.size"] == 4 << 20
    assert out["allocated"] >= stats["nrt.reserved_bytes"] > 4 << 20
    assert out["summary"]


def test_without_the_setting_numba_cudas_nrt_stays_and_switching_on_is_refused():
    out = scenario("cuda_heap_without_the_setting")
    assert out["right"] and out["errors"] == []
    assert {"malloc", "free"} <= set(out["calls"]) and not HEAP_SYMBOLS & set(out["calls"])
    assert out["global"] == "CUDA_ERROR_NOT_FOUND"
    for refused in out["refused"].values():     # numba_alloc.configure, Pool.configure
        assert "nrt_heap_size can be set only before the first kernel that uses NRT" in refused
        assert "sums" in refused
    assert out["setting"] is None and out["pool_setting"] is None
    assert out["stats"]["nrt.size"] == 0


def test_a_kernel_from_numbas_disk_cache_blocks_switching_on_as_one_compiled_here(tmp_path):
    runs = [scenario("cached_kernel_blocks_switching_on", cache_dir=tmp_path) for _ in range(2)]
    assert [run["from_cache"] for run in runs] == [False, True]
    for run in runs:
        assert run["right"] and run["errors"] == []
        assert run["global"] == "CUDA_ERROR_NOT_FOUND"          # CUDA's NRT, from either
        refused = run["refused"] or "accepted"
        assert ("nrt_heap_size can be set only before the first kernel that uses NRT is "
                "compiled: 1 were linked with CUDA's device malloc heap (sums)") in refused
        assert run["setting"] is None


def test_a_kernel_using_nrt_with_cache_true_under_the_setting_is_refused_naming_it(tmp_path):
    """numba-cuda cannot pickle a kernel linked with the heap's NRT: its
    error ("Cannot pickle CUDACodeLibrary with linking files") named
    neither the setting nor what to do."""
    out = scenario("cached_kernel_under_the_setting", "nrt_heap_size:4MiB", cache_dir=tmp_path)
    refused = out["refused"] or "accepted"
    assert refused.startswith("kernel sums uses NRT (np.empty and the like) served by the "
                              "pool's heap (nrt_heap_size is set) and cannot be cached on disk "
                              "(cache=True)")
    assert "without cache=True while nrt_heap_size is set" in refused
    assert "leave nrt_heap_size unset to cache them" in refused
    assert out["right"] and out["cached_right"] and out["cached"] == 1
    assert out["global"] == "CUDA_ERROR_NOT_FOUND" and out["errors"] == []


def test_a_kernel_is_never_loaded_where_the_other_heap_serves():
    out = scenario("one_library_per_kernel_across_devices")
    assert out["right"] and out["errors"] == []
    refused = out["refused"]
    assert "nrt_heap_size is unset for GPU 1" in refused["heap_on_one"]
    assert "linked with NRT drawing on CUDA's device malloc heap" in refused["cuda_on_zero"]
    assert "nrt_heap_size is set for GPU 0" in refused["cuda_on_zero"]
    assert out["modules_after"] == out["modules"]            # the refused modules unloaded
    assert out["pool_one"][0] == out["pool_one"][1] and not out["carved_on_one"]


def test_a_heap_the_pool_cannot_hold_fails_the_launch_and_changes_nothing():
    out = scenario("a_full_pool_refuses_the_heap_and_the_launch",
                   "nrt_heap_size:32MiB,limit:16MiB")
    assert "CUDA_ERROR_OUT_OF_MEMORY" in out["raised"]
    assert "out of memory: tried to allocate 32.51 MiB" in out["raised"]
    assert out["allocated"][0] == out["allocated"][1] and out["modules"] == 0
    assert out["right"] and out["stats"]["nrt.size"] == 32 << 20 and out["errors"] == []


def test_a_descriptor_global_the_driver_cannot_write_gives_the_heap_back():
    """The first module's load carves the heap, then the driver refuses the
    write of its descriptor's address into the module's global: the launch
    raises, and the pool is as before the launch (the heap was kept,
    carved, holding 4 MiB of the pool and reporting nrt.size)."""
    out = scenario("a_failed_descriptor_write_gives_the_heap_back", "nrt_heap_size:4MiB")
    assert out["raised"] == "CUDA_ERROR_UNKNOWN" and out["refused"] == ["cuMemcpyHtoD"]
    assert out["modules"] == 0 and not out["carved"] and out["changed"] == {}
    assert out["right"] and out["size"] == 4 << 20 and out["errors"] == []


def test_the_benchmarks_program_runs_over_the_standin(tmp_path):
    """benchmarks/bench_nrt_heap.py at the stand-in's size, one round: each
    side's process compiled, linked and ran its kernels, every sum right,
    every thread of the live kernel done (its figures need a GPU)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM",)}
    env.update(NUMBA_ALLOC_STANDIN="1", PYTHONPATH=os.pathsep.join(
        [str(TESTS / "standin" / "startup"), str(TESTS), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "benchmarks/bench_nrt_heap.py", "--tiny", "--lto",
                           "--rounds", "1", "--threads", "64", "--launches", "2",
                           "--out", str(tmp_path)], cwd=TESTS.parent, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["errors"] == [] and summary["sums"]["right"]
    assert sorted(summary["live"]) == ["cuda", "cuda-default", "pool"]
    assert all(live["done"] == live["threads"] == 256 for live in summary["live"].values())
    assert "| 64 threads, np.empty(8) each, filled and summed |" in proc.stdout
