"""The driver stand-in tier (tests/standin): numba-cuda's real driver layer,
without a GPU, over a stand-in that checks every address and runs GPU work
asynchronously. What the stand-in catches (standin_checks.py, one fresh
process each), and the GPU tests, the GPU paths of the benchmarks and the
command line, and the reclaim benchmark's program, run over it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from numba_alloc.units import MiB

TESTS = Path(__file__).parent
ROOT = TESTS.parent
# Each file of GPU tests runs over the stand-in in a process of its own (so
# that pytest-xdist spreads them): the GPU test files whole, the others'
# tests marked gpu; per file, the fewest tests that pass there and the most
# that skip (gpu_only; NVML's reading; LocalCUDACluster without dask-cuda).
GPU_TEST_FILES = {"tests/test_gpu.py": (12, 1), "tests/test_gpu_defrag.py": (5, 0),
                  "tests/test_gpu_device_heap.py": (7, 3), "tests/test_gpu_marks.py": (4, 0),
                  "tests/test_gpu_reclaim.py": (4, 0),
                  "tests/test_gpu_nrt_heap.py": (0, 3)}       # NRT's kernels need a GPU
OTHER_GPU_TEST_FILES = {"tests/test_bench.py": (5, 0), "tests/test_cli.py": (2, 0),
                        "tests/test_gpu_dask.py": (3, 1), "tests/test_heap_suite.py": (1, 0),
                        "tests/test_memory_viz.py": (1, 0), "tests/test_nvml.py": (0, 1),
                        "tests/test_replay.py": (1, 0)}


def _nvvm():
    from numba.cuda.cudadrv import nvvm
    try:
        return nvvm.is_available()
    except Exception:       # cuda-pathfinder's DynamicLibNotFoundError: no libnvvm here
        return False


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.environ.get("NUMBA_ALLOC_STANDIN") == "1" or not _nvvm(),
    reason="the stand-in compiles kernels with NVVM (pip install -e '.[test,cu13]', or cu12 "
           "with a CUDA 12 driver), and "
           "runs in processes of its own")]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER", "NUMBA_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS / "standin" / "startup"), str(TESTS),
                                         env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def scenario(name, **env):
    proc = subprocess.run([sys.executable, str(TESTS / "standin_checks.py"), name],
                          env=_env(**env), cwd=TESTS, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("name, call", [("copy_from_freed_memory", "cuMemcpyDtoH"),
                                        ("launch_on_freed_memory", "launch")])
def test_a_freed_address_is_refused_and_recorded(name, call):
    out = scenario(name)
    assert out["raised"] == "CUDA_ERROR_INVALID_VALUE"
    assert [c for c, _ in out["errors"]] == [call]
    assert "inside <freed device allocation" in out["errors"][0][1]


def test_staging_a_kernels_host_argument_never_moves_its_device_arguments():
    out = scenario("staging_a_host_argument_moves_no_argument",
                   NUMBA_ALLOC_CONF="defrag:true,growth:false,limit:40MiB")
    assert out["errors"] == []
    assert out["raised"] == "OutOfMemoryError" and out["defragmentations"] == 0
    # with reclaim on, the launch hooks keep the launch's arrays in place: it
    # may defragment around them (no host room to reclaim to instead)
    out = scenario("staging_a_host_argument_moves_no_argument",
                   NUMBA_ALLOC_CONF="defrag:true,reclaim:true,host_limit:512KiB,growth:false,"
                                    "limit:40MiB")
    assert out["errors"] == []
    assert out["raised"] is None and out["right"] and out["defragmentations"] == 1
    # reclaim turned on by another thread while a launch begun without it
    # stages: the hooks did not track that launch's arrays, so nothing moves
    out = scenario("staging_a_host_argument_moves_no_argument", SCENARIO_RECLAIM_MID_LAUNCH="1",
                   NUMBA_ALLOC_CONF="defrag:true,growth:false,limit:40MiB")
    assert out["errors"] == []
    assert out["raised"] == "OutOfMemoryError" and out["defragmentations"] == 0
    assert out["x_intact"]


def test_an_argument_extension_allocating_during_a_launch_moves_no_argument():
    """The launch has read its arguments' addresses when an argument
    extension allocates: a defragmentation would leave the kernel the old
    addresses (it wrote another block's bytes), so it is refused, and the
    out-of-memory error says why."""
    out = scenario("an_argument_extension_allocating_moves_no_argument",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="defrag:true,limit:40MiB")
    assert out["errors"] == [] and out["defragmentations"] == 0
    assert "a kernel launch on this thread is preparing its arguments" in out["raised"]
    assert not any(out["moved"]) and out["values"] == [float(v) for v in range(0, 16, 2)]


@pytest.mark.parametrize("call", ["cuMemsetD8", "cuMemGetInfo"])
def test_a_pool_set_up_the_driver_refuses_leaves_no_memory_behind(call):
    out = scenario("a_pool_set_up_that_fails_gives_its_memory_back", SCENARIO_CALL=call)
    assert out["raised"] == "CudaAPIError" and out["refused"]
    assert out["outside"] == 0 and out["ours"] and out["right"]


@pytest.mark.parametrize("call", ["cuMemFree", "cuCtxSynchronize"])
def test_a_cuda_close_the_driver_fails_once_succeeds_when_retried(call):
    """cuda.close() raises the driver's error when the pool cannot return a
    segment or wait for the device; Numba's device reset resets the primary
    context all the same (cuDevicePrimaryCtxReset in its finally), which
    frees what the pool held. Another cuda.close() then succeeds and the
    device's next use gets a new pool. The pool kept the segments it had
    not returned, and every later close tried again in the reset context
    (CUDA_ERROR_INVALID_CONTEXT): the device stayed unusable for good."""
    out = scenario("a_failed_cuda_close_can_be_retried", SCENARIO_CALL=call,
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["refused"] and out["closes"] == ["CUDA_ERROR_UNKNOWN", None]
    assert out["right"] is True and out["new_pool"] and out["errors"] == []


@pytest.mark.parametrize("call", ["cuMemFree", "cuCtxSynchronize"])
def test_a_cuda_close_that_fails_after_kernels_ran_succeeds_when_retried(call):
    """As above, after kernels ran: the failed reset stops Numba's
    Context.reset before it unloads the modules and flushes its pending
    deallocations (the events of the pool's frees, dropped by the pool's
    reset, among them); the primary context reset destroys their handles,
    so the retried close asked the reset context for them and raised
    CUDA_ERROR_INVALID_HANDLE (cuEventDestroy, then cuLibraryUnload), once
    per handle. The manager now does both while the context lives."""
    out = scenario("a_failed_cuda_close_can_be_retried", SCENARIO_CALL=call,
                   SCENARIO_LAUNCH="1", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["refused"] and out["closes"] == ["CUDA_ERROR_UNKNOWN", None]
    assert out["right"] is True and out["new_pool"] and out["errors"] == []


@pytest.mark.parametrize("call", ["cuMemFree", "cuCtxSynchronize"])
def test_a_pool_held_across_a_failed_then_retried_cuda_close_reads_its_figures(call):
    """A pool held across a cuda.close() whose reset failed (a freed
    array's free still open when waiting for the device failed) answers
    memory_stats() and snapshot() with its own figures, as after a close
    that succeeded: reading them recorded an event for the open frees in
    the closed context (RuntimeError: its CUDA context was closed)."""
    out = scenario("a_failed_cuda_close_can_be_retried", SCENARIO_CALL=call,
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["closes"] == ["CUDA_ERROR_UNKNOWN", None]
    assert out["kept"] is True


def test_expandable_segments_map_pages_through_the_drivers_virtual_memory_calls():
    """CudaDevice's page mapping over the stand-in's virtual memory
    management: growth maps 2 MiB pages under one reserved range (no
    cuMemAlloc), empty_cache gives whole free pages back to the driver, a
    defragmentation slides live blocks so that 14 MiB fits a 28 MiB limit,
    reset unmaps and frees everything; every byte right at each step."""
    out = scenario("expandable_segments_map_pages_under_one_range")
    assert out["errors"] == [] and out["copy_error"] is None and out["page_size"] == 2 * MiB
    assert out["grown"]["cuMemAddressReserve"] == 1 and out["grown"]["cuMemAlloc"] == 0
    assert out["grown"]["cuMemCreate"] == out["grown"]["cuMemMap"] == out["pages"] == 12
    assert out["intact_grown"] and out["intact_emptied"] and out["intact_slid"]
    assert out["emptied"] == {"cuMemUnmap": 4, "cuMemRelease": 4}
    assert out["freed_bytes"] == 8 * MiB and out["pages_after_empty"] == 8
    assert out["big_served"] and out["defragmentations"] == 1
    assert out["reserved"] <= 28 * MiB
    assert out["pages_after_reset"] == out["ranges_after_reset"] == out["live_mappings"] == 0


def test_a_failed_move_table_upload_leaves_no_reference_cycle():
    """CudaCopies.copy raised the driver's error from inside its handler of
    the PhaseCopyError that wraps it: each then referred to the other
    (__context__, __cause__), a cycle that kept every frame the error
    passed through, and what they held, until the garbage collector ran."""
    out = scenario("a_failed_move_table_upload_keeps_no_frame_alive")
    assert out["copy_error"] is None and out["refused"] == ["cuMemcpyHtoD"]
    assert "the copy kernel failed sliding block" in out["raised"]
    assert "cuMemcpyHtoD" in out["raised"]
    assert out["freed"] and out["intact"] and out["served"] and out["errors"] == []


def test_an_ipc_export_of_an_array_in_mapped_pages_moves_it_into_a_segment_of_its_own():
    out = scenario("ipc_export_under_expandable_segments",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="expandable_segments:true")
    assert out["errors"] == [] and out["mapped"] == [True, False]
    assert out["moved"] and not out["big_mapped_after"] and out["right"]
    assert out["big_pins"] == 1 and out["big_size"] == 4 << 20
    assert out["small_pins"] == 1 and out["small_size"] == 1024
    # an array in host memory (reclaimed) comes back into mapped pages, and moves
    out = scenario("ipc_export_under_expandable_segments", SCENARIO_RECLAIMED="1",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="expandable_segments:true,reclaim:true,limit:16MiB")
    assert out["errors"] == [] and out["mapped"] == [True, False]
    assert not out["big_mapped_after"] and out["right"] and out["big_pins"] == 1


@pytest.mark.parametrize("case, raised, reserved_change", [("unmap", "CudaAPIError", 0),
                                                            ("release", None, -2 * MiB),
                                                            ("rollback", "CudaAPIError", 0)])
def test_refused_unmaps_and_releases_leave_the_pool_and_the_driver_consistent(
        case, raised, reserved_change):
    """CudaDevice's page calls are all or nothing for the pool: a refused
    cuMemUnmap maps back the pages unmapped before it (the pool keeps
    them, free and counted); a refused cuMemRelease leaves its page
    unmapped and the handle released at a later call; a refused unmap
    undoing a refused map leaves the pages stray until a later call unmaps
    them. The pool's invariants hold after each, the next request works,
    and a reset leaves nothing on the device."""
    out = scenario("expandable_segments_refused_unmaps_and_releases_leave_nothing_behind",
                   SCENARIO_CASE=case)
    assert out["errors"] == [] and out["refused"] and out["right"]
    assert out["raised"] == raised and out["reserved_change"] == reserved_change
    assert out["left"] == {"pages": 0, "stray": 0, "unreleased": 0, "ranges": 0, "handles": 0,
                           "mappings": 0}


def test_runs_move_by_remapping_pages_through_the_drivers_calls():
    """CudaDevice's remap_pages over the stand-in: a cuMemMap the driver
    refuses part way through a remap: the remapped page goes back, the
    request raises, the pages, reserved bytes and every byte as before.
    Then the request works: a defragmentation moves a run of two pages
    down against another by unmapping each page and mapping its allocation
    again (no cuMemCreate, no cuMemRelease for them), and the block's
    bytes go with it."""
    out = scenario("expandable_segments_runs_move_by_remapping_their_pages",
                   SCENARIO_CODE="CUDA_ERROR_UNKNOWN")
    assert out["errors"] == [] and out["copy_error"] is None and out["runs"] == 2
    assert out["refused"] == "DefragmentationError"
    assert out["as_before"] and out["intact_refused"]
    assert out["served"] and out["moved"] and out["intact"] and out["runs_after"] == 1
    calls = out["calls"]
    assert calls["cuMemMap"] - calls["cuMemCreate"] == 2      # the second run's two pages
    assert calls["cuMemUnmap"] - calls["cuMemRelease"] == 2
    assert out["reserved"] == 10 * MiB and out["live_mappings"] == 0


def test_numba_arrays_follow_runs_moved_by_remapping():
    out = scenario("numba_arrays_follow_runs_moved_by_remapping",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="defrag:true,expandable_segments:true,limit:10MiB")
    assert out["errors"] == [] and out["right"] == [True, True] and out["big_right"]
    assert out["moved"] and out["remapped"] == 2


@pytest.mark.parametrize("code, raised", [("CUDA_ERROR_OUT_OF_MEMORY", "OutOfMemoryError"),
                                          ("CUDA_ERROR_UNKNOWN", "CudaAPIError")])
def test_a_mapping_the_driver_refuses_part_way_leaves_the_pool_and_device_as_before(code,
                                                                                   raised):
    out = scenario("expandable_segments_refused_mapping_leaves_nothing_behind",
                   SCENARIO_CODE=code)
    assert out["errors"] == [] and out["right"] and out["left"] == 0
    counted = ["num_ooms"] if raised == "OutOfMemoryError" else []
    assert out["outcomes"] == [
        {"call": call, "raised": raised, "refused": True, "stats_changed": counted,
         "device_bytes_kept": True, "pages": 2} for call in ("cuMemMap", "cuMemCreate")]


def test_the_growth_benchmark_counts_what_each_kind_of_segment_asks_of_the_driver():
    """bench_growth.py over the stand-in: whole segments grow by cuMemAlloc
    alone, expandable_segments by one reserved range and a cuMemCreate and
    cuMemMap per 2 MiB page; both give every byte back; moving 128 MiB of
    pages takes a cuMemUnmap and a cuMemMap per page and no copy when
    remapped (the times need a GPU)."""
    proc = subprocess.run([sys.executable, "benchmarks/bench_growth.py", "--child", "--rounds",
                           "1"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=_env(NUMBA_ALLOC_STANDIN="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(proc.stdout.splitlines()[-1])
    move = figures["calls"].pop("move")
    assert move["remap"] == {"cuMemUnmap": 64, "cuMemMap": 64, "cuMemSetAccess": 1}
    assert move["copy"]["cuMemcpyDtoD"] == 1 and "cuMemMap" not in move["copy"]
    grow = {mode: calls["grow"] for mode, calls in figures["calls"].items()}
    pages = (16 * 64 + 200 * 3) // 2
    assert "cuMemCreate" not in grow["segments"] and grow["segments"]["cuMemAlloc"] > 0
    assert "cuMemAlloc" not in grow["expandable"]
    assert grow["expandable"]["cuMemAddressReserve"] == 1
    assert grow["expandable"]["cuMemCreate"] == grow["expandable"]["cuMemMap"] == pages
    back = figures["calls"]["expandable"]["give_back"]
    assert back["cuMemUnmap"] == back["cuMemRelease"] == pages
    assert figures["calls"]["segments"]["give_back"]["cuMemFree"] == \
        grow["segments"]["cuMemAlloc"]
    assert all(run["left_mib"] == 0 for runs in figures["runs"].values() for run in runs)


def test_the_allocation_benchmark_splits_a_device_arrays_time_over_the_standin(tmp_path):
    """bench_malloc.py --split: cuda.device_array + release under
    numba_alloc over the stand-in (which it starts itself), each size's
    microseconds split into numba_alloc's (its memalloc and finalizer, of
    which the pool's calls) and the rest, Numba's, adding up to the whole;
    cProfile's shares sum to one. (Which part takes longer is timed, so
    not asserted: on a loaded machine the timers' cost, subtracted as
    measured before, leaves the pool's share above the glue's at times.)"""
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_malloc.py", "--split", "--quick", "--out",
         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["machine"] == "the driver stand-in (no GPU)"
    for row in result["split_us"].values():
        assert row["pool_us"] > 0 and row["ours_us"] > 0 and row["total_us"] > 0
        assert row["ours_us"] + row["numba_us"] == pytest.approx(row["total_us"])
        assert sum(row["profile"].values()) == pytest.approx(1.0)
        assert row["profile"]["numba_alloc"] > 0 and row["profile"]["Numba"] > 0
    assert "its pool" in proc.stdout


def test_the_defrag_benchmark_over_the_standin_counts_the_hosts_work(tmp_path):
    """bench_defrag.py --standin: section 4's compaction, small, over the
    stand-in (which it starts itself): its copies, the stand-in's kernel
    runs inside them, and its releases (one cuMemFree each, and no other
    call a move) within defragment()'s time; the context made current once."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_defrag.py", "--standin", "--scale", "0.03",
         "--repeat", "1", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
        text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = json.loads((tmp_path / "defrag.json").read_text())["standin_compaction"]
    assert run["moves"] > 10 and run["releases"] > 10 and run["bytes_moved"] > 0
    assert 0 < run["run_seconds"] < run["copy_seconds"]
    assert run["copy_seconds"] + run["release_seconds"] < run["seconds"]
    calls = run["driver_calls"]
    assert calls["cuMemFree"] == run["releases"]
    assert sum(calls.values()) - calls["cuMemFree"] < 50 and calls["cuCtxGetCurrent"] < 15
    assert "us a move" in proc.stdout


def test_the_null_address_of_a_parked_pointer_is_refused():
    out = scenario("null_pointer")
    assert out["raised"] == "CUDA_ERROR_INVALID_VALUE"
    assert "the null address" in out["errors"][0][1]


def test_a_launch_a_gpu_refuses_is_refused():
    out = scenario("a_block_of_too_many_threads")
    assert out["raised"] == "CUDA_ERROR_INVALID_VALUE"
    assert [c for c, _ in out["errors"]] == ["launch"]
    assert "is 2048 threads, more than 1024" in out["errors"][0][1]


def test_work_runs_when_the_host_waits_for_it_in_cudas_stream_order():
    out = scenario("work_waits_for_the_host")
    assert out["before"] == {"pending": 2, "query": False}     # the launch and the record
    assert out["after"] == {"pending": 0, "query": True, "values": [1.0]}
    assert out["errors"] == []


def test_legacy_work_waits_for_another_threads_per_thread_stream():
    """Every thread's per-thread default stream is a blocking stream: an
    event on the legacy default stream, and a synchronous copy, come after
    the launch another thread queued there, the thread alive or gone."""
    out = scenario("legacy_work_waits_for_another_threads_per_thread_stream")
    assert out["event"] == {"pending": 2, "query": False,      # A's launch, the record
                            "after_wait": {"pending": 0, "query": True}}
    assert out["copy"] == {"pending": 1, "values": [2.0]}
    assert out["errors"] == []


def test_stream_0_is_per_thread_in_per_thread_mode():
    """CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1: stream 0 and the
    synchronous copies are the calling thread's per-thread default stream,
    which does not wait for another thread's; the legacy stream does."""
    out = scenario("stream_0_is_per_thread_in_per_thread_mode",
                   CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    assert out == {"a_on_legacy": False, "copy": [0.0],
                   "pending_after_default_sync": 1, "pending_after_legacy_event": 0,
                   "main_launch_on": "main's", "own_kernel": [1.0], "errors": []}


PER_THREAD_MODES = pytest.mark.parametrize("mode", ["0", "1"], ids=["legacy", "per_thread"])


@PER_THREAD_MODES
def test_a_block_freed_after_another_threads_per_thread_launch_never_shows_its_writes(mode):
    """Thread A launches over an array on its per-thread default stream and
    drops it unsynchronized (alive meanwhile, then exited); another thread
    gets the same block from the pool once the pool's free event (legacy
    default stream: after A's kernel) is done, and sees only its own bytes.
    ``mode``: CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM (1: A launches on
    stream 0, the other thread's synchronous copies are on its own per-thread
    stream)."""
    out = scenario("a_freed_block_after_a_per_thread_launch",
                   CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=mode)
    assert out["rounds"] == 2 * [{"pending": 1, "same_block": True, "before_sync": [7.0],
                                  "after_sync": [7.0], "raised": []}]
    assert out["errors"] == []


@PER_THREAD_MODES
def test_reclaim_and_bring_back_under_launches_on_per_thread_streams(mode):
    """reclaim on, a 16 MiB limit, 4 threads launching over 48 MiB of arrays
    on their per-thread default streams (in turns, then all at once): arrays
    reclaimed and brought back, every byte right."""
    out = scenario("reclaim_with_per_thread_launches",
                   CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=mode,
                   NUMBA_ALLOC_CONF="reclaim:true,limit:16MiB")
    assert out == {"wrong": [], "raised": [], "reclaimed": True, "brought_back": True,
                   "errors": []}


def test_settings_changed_after_cuda_close_reach_no_context_that_is_gone():
    """cuda.close() ends the device's context and its pool: settings changed
    before its next use went to that pool's dead context (the driver's
    CUDA_ERROR_INVALID_CONTEXT), and GPU 0's settings were its own."""
    out = scenario("settings_after_cuda_close", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["raised"] == [] and out["errors"] == []
    assert out["limit_after_close"] == 0.5          # the device's, not the closed pool's
    assert (out["new_limit"], out["new_growth"], out["new_heap"]) == (0.5, False, 16 << 20)


def test_a_pool_held_across_cuda_close_reads_its_own_figures_and_never_the_driver():
    """After cuda.close() a pool still held answers with its own counters
    and says the device's figures are unavailable; what needs the device
    raises one RuntimeError naming why, before any driver call (which
    raised the driver's CUDA_ERROR_INVALID_CONTEXT, or answered for the
    dead pool), its counters as they were; GPU 0's next use has a new pool."""
    out = scenario("a_pool_after_cuda_close", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["errors"] == []
    why = ("its CUDA context was closed (cuda.close(), or a reset of the device), which "
           "released the pool's memory: this pool can no longer use the device; the GPU's "
           "next use makes a new context, with a new pool")
    assert out["answers"] == {"memory_allocated": 0, "max_memory_allocated": 8 << 20,
                              "snapshot_device": None, "html": True,
                              "summary": f"Device memory: unavailable: {why}"}
    closed = f"RuntimeError: cuda device 0: {why}"
    assert out["raised"] == dict.fromkeys(("malloc", "empty_cache", "defragment",
                                           "defragment_for", "mem_get_info", "memory_ledger",
                                           "limit_bytes"), closed)
    assert out["stats_kept"] and out["new_pool"]


def test_a_pool_held_across_cuda_close_still_reads_once_a_pinned_array_comes_back():
    """A pinned array held across cuda.close() and dropped after it goes
    back to the closed pool's host cache: the pool's readers still answer
    (the cache covered the block with an event of the closed context, so
    the snapshot, memory_summary, host_memory_stats and the Jupyter view
    raised the closed context's RuntimeError, and `numba-alloc run` ended
    in it); the block stays in use, its memory gone with the context."""
    out = scenario("a_pinned_array_dropped_after_cuda_close",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["errors"] == []
    assert out["answers"] == dict.fromkeys(("snapshot", "summary", "host_memory_stats",
                                            "html"), "answered")
    assert out["host_blocks"] == [[1 << 18, "in_use"]]


def test_a_getter_before_install_makes_no_context_so_install_still_works():
    out = scenario("a_getter_before_install")
    assert out["raised"].startswith("numba_alloc is not Numba's memory manager")
    assert out["contexts"] == [False] and out["ours"] and out["errors"] == []


def test_a_kernel_launched_after_a_context_reset_is_an_invalid_handle():
    """What made test_gpu_device_heap.py fail on an H100 after test_gpu.py's
    reset test, reproduced without a GPU."""
    out = scenario("launch_after_a_context_reset")
    assert out["raised"] == "CUDA_ERROR_INVALID_HANDLE"
    assert "a context reset unloaded it" in out["errors"][0][1]


def test_reclaim_on_at_start_up_keeps_every_array_right():
    out = scenario("reclaim_on_at_start_up_follows_moves", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="reclaim:true,limit:16MiB")
    assert out == {"wrong": [], "reclaimed": True, "errors": []}


def test_reclaim_and_bring_back_copy_through_pinned_chunks_asynchronously():
    """Through numba-cuda's driver layer (a Pool over CudaDevice), the
    driver calls recorded: every copy reclaim and bring-back make is an
    async copy on the legacy default stream whose host range lies in a live
    cuMemHostAlloc allocation (the control, Numba's copy_to_host into NumPy,
    shows the check flags pageable memory); blocks go in 8 MiB chunks (the
    last rounded to what is left), with no wait between the copies of one
    direction; the second round trip pins and frees nothing (the host cache's
    chunks are reused); every byte intact after each."""
    out = scenario("reclaim_round_trips_through_pinned_chunks")
    assert out["errors"] == []
    eight = 8 << 20
    chunks = [[[i * eight, eight] for i in range(8)],                      # 64 MiB
              [[0, eight], [eight, eight], [2 * eight, (4 << 20) + 4096]],  # 20 MiB + 4 KiB
              [[0, 5120]]]                                                 # 5,000 B: 5,120
    for i, trip in enumerate(out["rounds"]):
        assert trip["reclaimed"] == trip["intact"] == [True] * 3
        assert trip["copy_calls"] == ["cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync"]
        assert trip["streams"] == [out["legacy"]] and trip["pageable"] == []
        assert trip["out"] == trip["back"] == chunks and trip["waits"] == 0
        assert trip["host_frees"] == 0
        assert trip["host_allocs"] == (12 if i == 0 else 0)
    assert out["control"]["copy_calls"] == ["cuMemcpyDtoH"]
    assert len(out["control"]["pageable"]) == 1


def test_the_reclaim_benchmarks_program_keeps_every_array_right():
    """bench_reclaim_gpu.py's layers at 1.5x the limit: on an H100 every array
    was wrong before f8d8b53 (reclaim on at start-up), and so it is here."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_reclaim_gpu.py", "--child", "layers", "1.5",
         str(256 << 20)], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=_env(NUMBA_ALLOC_STANDIN="1", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                 NUMBA_ALLOC_CONF="reclaim:true,limit:268435456"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(proc.stdout.splitlines()[-1])
    assert figures["wrong_arrays"] == [] and figures["to_host_bytes"] > 0


def test_the_reclaim_copy_benchmark_runs_and_keeps_every_byte_right():
    """bench_reclaim_gpu.py's copies (reclaim and bring-back of every block,
    five rounds, beside plain pinned copies) over the stand-in, with small
    blocks and 2 MiB chunks: every round reclaimed every block, every byte
    came back, and its table says so (the figures themselves need a GPU)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_reclaim_gpu as bench
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_reclaim_gpu.py", "--child", "blocks", str(2 << 20),
         str(16 << 20), "--blocks-mib", "1,4.5,8"], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env=_env(NUMBA_ALLOC_STANDIN="1", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(proc.stdout.splitlines()[-1])
    assert [(f["size"], f["blocks"], f["chunk"]) for f in figures] == [
        (1 << 20, 16, 2 << 20), (9 << 19, 3, 2 << 20), (8 << 20, 2, 2 << 20)]
    assert all(f["wrong_blocks"] == [] and f["reclaimed_bytes"] == 5 * f["bytes"]
               for f in figures)
    rows = bench.block_rows(figures)
    assert [r["correct"] for r in rows] == [True] * 3
    assert "| 4.5 MiB | 3 | 2 MiB |" in bench.blocks_report(rows)


def test_the_launch_hooks_benchmark_runs_over_the_standin(tmp_path):
    """bench_launch_hooks.py's rounds, off and on, over the stand-in (which
    it starts itself): the hooks are in only while reclaim is on (checked
    before each round), every launch's kernel ran right, nothing refused."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_launch_hooks.py", "--standin", "--rounds", "2",
         "--launches", "5", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
        text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "results.json").read_text())["results"]["this checkout"]
    assert not result["figures"]["wrong"] and result["figures"]["standin"]
    for clock in ("wall", "cpu"):
        rounds = result["figures"]["clocks"][clock]
        assert all(len(rounds[key]) == 2 for key in ("off", "on", "standin_off", "standin_on"))
        assert "bare_ratio" in result["summary"][clock]
    assert "without the stand-in's launch" in proc.stdout


def _pytest_under_the_standin(*args):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rfEs", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200, env=_env(NUMBA_ALLOC_STANDIN="1"))
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|deselected)",
                                                   summary)}


def test_host_arrays_passed_to_kernels_are_staged_in_the_pool():
    """numba-cuda's copies of host arrays a kernel is given come from the
    pool (cuda-core's memory resource over it), counted, within its limit."""
    out = scenario("host_arrays_are_staged_in_the_pool",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc", NUMBA_ALLOC_CONF="limit:16MiB")
    assert out["errors"] == []
    assert out["outside"] == [0] * 24           # the device holds nothing the pool does not
    # the ledger adds up to the driver's used memory, the modules' globals outside the pool
    assert out["ledger_used"] == out["driver_used"]
    assert out["ledger_outside"] == out["module_globals"]
    assert out["right"]
    assert out["staged_allocated"] == out["staged"] and out["staged_blocks"] == 24
    assert out["staged_current"] == 0 and out["allocated_now"] == 0
    assert 0 < out["staged_peak"] < out["staged"]
    assert out["raised"] == "OutOfMemoryError" and out["ooms"] == 1 and out["unchanged"]


def test_pinned_and_mapped_arrays_come_from_the_host_cache():
    """100 pinned arrays of 64 MiB, each dropped before the next: one
    cuMemHostAlloc (Numba's own manager makes one per array); a mapped
    array apart (its own flags); host_cache_limit refused below the bytes
    in use, nothing changed, then taken, returning the cached block."""
    out = scenario("pinned_arrays_come_from_the_host_cache",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["errors"] == []
    assert out["calls"] == [64 << 20, 4096, 24000]     # the stand-in's managed memory too
    assert out["right"] and out["num_host_alloc"] == 2 and out["requests"] == 101
    assert out["mapped_bytes"] == 4096                  # the mapped array's block, in use
    assert out["managed_bytes"] == [24000, 0]
    assert "host_cache_limit 33554432 is below the 67112960 bytes" in out["refused"]
    assert out["unchanged"]
    assert out["freed_by_limit"] == 1 and out["held_after"] == 4096
    assert "host_cache_limit of 33554432" in out["over"]


def test_a_compaction_phase_is_a_launch_not_one_per_pair_of_segments():
    """A full compaction of Numba arrays spread over 20 MiB segments moves
    blocks between several pairs of segments; each of its phases is one
    launch of the copy kernel over the span of the segments (there was one
    per pair, 8 here), and every array is right after. A launch has no more
    blocks than the GPU holds at once (the occupancy calculator's 8 blocks
    of 256 an SM on the stand-in's 132 SMs), fewer than its chunks of 16
    KiB: each block copies several."""
    out = scenario("a_compaction_phase_is_a_launch_not_one_per_segment_pair",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc", NUMBA_ALLOC_CONF="defrag:true")
    assert out["errors"] == [] and out["wrong"] == []
    assert out["segments"] >= 6 and out["moves"] > 20 and out["bytes_moved"] > 0
    assert out["pairs"] >= 6
    assert 1 <= out["launches"] <= 2        # the compaction's two phases
    resident = out["resident"]
    assert resident == 132 * 2048 // 256 and len(out["grids"]) == out["launches"]
    assert all(threads == 256 and x <= resident and x * y >= 128
               for (x, y), threads in out["grids"])
    # the first phase has at least as many chunks as the GPU holds blocks
    # (a block a chunk, it had more blocks than that)
    assert out["grids"][0][0] == [resident, 1]


@PER_THREAD_MODES
def test_a_compaction_waits_for_its_copies_once_and_a_failed_copy_keeps_what_completed(mode):
    """Every phase's copies start at once, one upload of their tables, and
    the records follow while they run: one cuMemcpyHtoD, one wait and one
    read of the counters for the whole compaction (besides its first wait,
    for the device to be idle). A failed wait, after the
    copy kernel ran every phase, keeps every new address (the counters say
    so); a launch failing in the second phase keeps the first phase's.
    Every array right after each."""
    out = scenario("a_compaction_waits_once_and_a_failed_copy_keeps_what_completed",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc", NUMBA_ALLOC_CONF="defrag:true",
                   CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=mode)
    assert out["errors"] == [] and out["moved"] > 10
    assert out["calls"] == {"cuMemcpyHtoD": 1, "cuCtxSynchronize": 2, "cuMemcpyDtoH": 1}
    assert "once the copy kernel's 2 phases had completed (the device failed)" in out["wait"]
    assert "failed in phase 2 of 2 (the launch failed)" in out["launch"]
    assert out["wrong"] == out["wait_wrong"] == out["launch_wrong"] == out["final_wrong"] == []


def test_a_refused_read_of_the_copy_counters_leaves_the_move_counters_exact():
    """The driver refusing the read of the copy kernel's counters, once
    a compaction's copies completed or after a launch of its second phase
    failed, still counts in bytes_defragged exactly the bytes of the blocks
    that moved, and one defragmentation; the next compaction counts its own
    moves only."""
    out = scenario("a_counter_read_refused_after_copies_counts_what_they_moved",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc", NUMBA_ALLOC_CONF="defrag:true")
    assert out["errors"] == []
    assert out["read"]["raised"] is None
    assert "failed in phase 2 of 2 (the launch failed)" in out["launch_and_read"]["raised"]
    for how in ("read", "launch_and_read", "neither"):
        assert out[how]["refused"] and out[how]["wrong"] == [], how
        assert out[how]["moved"] > 0 and out[how]["counted"] == out[how]["moved"], how
        assert out[how]["defragmentations"] == 1, how


def test_a_launch_failing_inside_a_phase_with_its_counter_read_refused_counts_no_more():
    """A compaction whose copies go a launch a move, the second launch of
    its second (then its first) phase failing and the read of the copy
    kernel's counters after it refused, counts the phases before it only;
    the compaction after it counts its own moves only, not also the
    launches of the failed phase that ran (they stayed in the kernel's
    counters, missing from move_counters(): 2087936 bytes too many, then
    1049088 and a second defragmentation, before the copies set those)."""
    modes = ("launch_in_phase_2_and_read", "after_phase_2", "launch_in_phase_1_and_read",
             "after_phase_1")
    out = scenario("a_counter_read_refused_after_copies_counts_what_they_moved",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc", NUMBA_ALLOC_CONF="defrag:true",
                   SCENARIO_MODES=",".join(modes))
    assert out["errors"] == []
    assert "failed in phase 1 of " in out["launch_in_phase_1_and_read"]["raised"]
    assert "failed in phase 2 of " in out["launch_in_phase_2_and_read"]["raised"]
    assert out[modes[0]]["phase_launches"][0] >= 3 and out[modes[2]]["phase_launches"][0] >= 3
    for how, defragmentations in zip(modes, (1, 1, 0, 1)):
        assert out[how]["refused"] and out[how]["wrong"] == [], how
        assert out[how]["counted"] == out[how]["moved"], (how, out[how])
        assert out[how]["defragmentations"] == defragmentations, (how, out[how])
    assert out["launch_in_phase_1_and_read"]["moved"] == 0
    assert min(out[how]["moved"] for how in modes if how != modes[2]) > 0


def test_freed_memory_goes_back_to_the_host():
    """Freed device and pinned memory hold no host memory (they did: a
    program over the stand-in grew to 6 GB); a freed pinned allocation's
    mapping stays, reading as zeros, so that its address is not reused."""
    out = scenario("freed_memory_goes_back_to_the_host")
    assert out["errors"] == [] and out["zeros"]
    assert out["grown"] < 200 << 20, out["grown"]          # of the 1280 MiB written


def test_a_context_object_a_third_party_builds_does_not_replace_numbas_pool():
    """numba-cuda's Test3rdPartyContext failed under numba_alloc on an H100
    (the raw CUdevice has no .id). Now such a Context has no pool until it
    allocates, and Numba's pool stays the one reported."""
    out = scenario("a_third_partys_context_object", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc")
    assert out["errors"] == []
    assert out["same"] == [True, True]
    assert out["foreign_pools"] == [True, True]     # nothing reserved for the foreign Context
    assert out["reported"] and out["right"] and out["outside"] == 0
    assert out["allocated"] == 512 + 20480          # both arrays, rounded to 512 B


def test_malloc_heap_size_applies_before_the_first_kernel_and_is_refused_after():
    out = scenario("malloc_heap_size_before_the_first_kernel",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="malloc_heap_size:32MiB")
    assert out["errors"] == []
    assert out["at_start"] == 32 << 20 and out["before_kernel"] == 48 << 20
    assert "can be sized only before the first kernel" in out["refused"]
    assert out["after"] == 48 << 20 and out["setting"] == 48 << 20
    without, with_nrt = out["messages"]
    assert "NRT" not in without
    assert "Kernels use NRT" in with_nrt and "48.00 MiB, the malloc_heap_size setting" in with_nrt
    assert not out["summary_names_heap"]          # NRT off again when it was taken


def test_an_arena_leaves_the_device_malloc_heap_room_and_a_heap_beyond_it_is_refused():
    out = scenario("an_arena_leaves_room_for_the_malloc_heap",
                   NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="growth:false,limit:40MiB")
    GiB = 1 << 30
    assert out["errors"] == []
    assert out["before"] == 4 * GiB + (8 << 20)      # 5% of 80 GiB, and CUDA's default heap
    assert out["after"] == 4 * GiB + (64 << 20)
    assert "malloc_heap_size" in out["refused"] and "free beside" in out["refused"]
    assert out["setting"] == out["heap"] == 64 << 20   # as before the refusal


@pytest.mark.parametrize("path", GPU_TEST_FILES)
def test_the_gpu_tests_pass_over_the_standin(path):
    counts = _pytest_under_the_standin(path)
    least_passed, most_skipped = GPU_TEST_FILES[path]
    assert counts.get("passed", 0) >= least_passed and counts.get("skipped", 0) <= most_skipped


@pytest.mark.parametrize("path", OTHER_GPU_TEST_FILES)
def test_the_other_gpu_tests_pass_over_the_standin(path):
    """The GPU paths of the benchmarks, the command line and the demo."""
    counts = _pytest_under_the_standin(path, "-m", "gpu")
    least_passed, most_skipped = OTHER_GPU_TEST_FILES[path]
    assert counts.get("passed", 0) >= least_passed and counts.get("skipped", 0) <= most_skipped


def test_every_file_with_gpu_tests_runs_over_the_standin():
    """A test file that marks tests gpu (GPU_MARKS, needs_gpu, pytest.mark.gpu)
    is one of the two lists above."""
    marks = re.compile(r"\b(GPU_MARKS|needs_gpu|pytest\.mark\.gpu)\b")
    found = {f"tests/{p.name}" for p in TESTS.glob("test_*.py")
             if p.name != "test_standin.py" and marks.search(p.read_text(encoding="utf-8"))}
    assert found == set(GPU_TEST_FILES) | set(OTHER_GPU_TEST_FILES)


@PER_THREAD_MODES
def test_a_user_program_keeps_every_byte_right(mode):
    """Many arrays allocated and freed, a defragmentation under slices and
    views of views (read back, and written by a kernel after the move),
    reclaim on at start-up, off and on again, arrays three times the limit
    in kernel rotation: every byte checked, nothing refused. ``mode``:
    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM (1: stream 0, the copy
    kernel's launches and the synchronous copies are on the per-thread
    default stream)."""
    out = scenario("a_user_program", NUMBA_CUDA_MEMORY_MANAGER="numba_alloc",
                   NUMBA_ALLOC_CONF="reclaim:true,defrag:true,limit:64MiB",
                   CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=mode)
    assert out == {"moved": True, "base_moved": True, "part": True, "base": True,
                   "churn": True, "rotation": True, "reclaimed": True, "errors": []}


def test_the_dask_plugin_sets_a_gpu_worker_up_before_its_first_cuda_use():
    pytest.importorskip("distributed")
    out = scenario("dask_set_up_on_a_gpu_worker")
    assert out["manager"] == "NumbaAllocManager"
    assert (out["limit"], out["defrag"]) == (64 << 20, True)
    assert out["metric"]["0"]["allocated_bytes"] == out["kept"] == 1 << 20
    assert out["metric"]["0"]["reserved_bytes"] >= out["kept"]
    assert out["metric_after_teardown"] is False and out["errors"] == []


def test_the_dask_plugin_refuses_a_worker_whose_numba_already_used_cuda():
    pytest.importorskip("distributed")
    out = scenario("dask_set_up_after_numba_used_cuda")
    assert out["raised"].startswith("worker worker-0: Numba already uses another memory manager")
    assert "register NumbaAllocSetup before any task on the worker uses CUDA" in out["raised"]
    assert "NUMBA_CUDA_MEMORY_MANAGER=numba_alloc" in out["raised"]
    assert out["metrics"] == [] and out["errors"] == []
    assert out["limit"] is None         # the plugin's limit:64MiB put back
    assert out["growth"] is True and out["gpu_growth"] is False     # and GPU 0's own setting


def test_the_dask_plugin_whose_pool_cannot_be_made_puts_the_settings_back():
    pytest.importorskip("distributed")
    out = scenario("dask_set_up_whose_pool_is_refused")
    assert out["raised"].startswith("worker worker-0: expandable_segments:")
    assert out["metrics"] == [] and out["errors"] == []
    assert out["expandable"] is False and out["right"]


def test_the_dask_plugin_refused_settings_leave_numbas_manager_as_it_was():
    pytest.importorskip("distributed")
    out = scenario("dask_set_up_with_reclaim_refused")
    assert out["raised"] == "worker worker-0: numba-cuda 9.9 is not supported"
    assert out["manager"] != "NumbaAllocManager"
    assert out["metrics"] == [] and out["errors"] == []


def test_the_dask_plugin_whose_history_cannot_start_puts_the_settings_back():
    """The pool is made with the plugin's settings before its history
    starts: when the driver refuses the history's first reading, the
    worker's settings go back too (they stayed the plugin's)."""
    pytest.importorskip("distributed")
    out = scenario("dask_set_up_whose_history_cannot_start")
    assert out["raised"] == "CUDA_ERROR_UNKNOWN" and out["refused"] == ["cuMemGetInfo"]
    assert out["failure"].startswith("worker worker-0: CudaAPIError:")
    assert out["message"] == out["failure"]
    assert out["failure"].endswith("(starting its pool's history: history=True, "
                                   "max_entries=100000)")
    assert out["failed"] == {"limit": None, "defrag": False, "defaults": [None, False],
                             "metrics": [], "recording": False}
    assert out["again"] == {"limit": 64 << 20, "defrag": True, "defaults": [64 << 20, True],
                            "metrics": ["numba_alloc"], "recording": True}
    assert out["errors"] == []


def test_a_numba_array_dask_unspills_comes_from_the_pool_even_with_rmm():
    pytest.importorskip("distributed")
    out = scenario("dask_unspill_lands_in_the_pool")
    # distributed's own deserializer, then ours
    assert out["asked_rmm"] == [1, 0] and out["in_pool"] == [False, True]
    assert out["right"] == [True, True] and out["shape"] == [50, 100]
    assert out["nbytes"] <= out["grew"] < out["nbytes"] + 512
    assert out["errors"] == []
