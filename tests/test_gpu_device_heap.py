"""The device heap on a real GPU (skipped without one; CI runs the same
kernels under the simulator in test_device_heap.py and compiles them to PTX).
Kernels: heap_sim.py's, compiled for the GPU here."""

import numpy as np
import pytest

import numba_alloc
from numba import cuda

import heap_sim
from gpu_kernels import jit, wait_then_fill
from gpu_marks import GPU_MARKS, HAVE_GPU, gpu_only, gpu_toolchain  # noqa: F401
from test_device_heap import block_size

pytestmark = GPU_MARKS

if HAVE_GPU:
    numba_alloc.install()

WAIT_NS = 5_000_000_000


def _fill(heap, sizes, threads=256, kernel=heap_sim.fill):
    """heap_sim.fill on the GPU (``sizes.size`` a multiple of ``threads``):
    offsets, per-thread intact flags, the heap's bytes."""
    d_sizes = cuda.to_device(sizes)
    offsets = cuda.device_array(sizes.size, np.int64)
    intact = cuda.device_array(sizes.size, np.int64)
    kernel[-(-sizes.size // threads), threads](heap, d_sizes, offsets, intact)
    return offsets.copy_to_host(), intact.copy_to_host(), heap._data.copy_to_host()


@gpu_only("10^5 threads that meet in warps take the CUDA simulator 9 minutes")
def test_a_hundred_thousand_threads_get_disjoint_intact_blocks_and_exact_counters():
    rng = np.random.default_rng(3)
    sizes = rng.choice([1, 16, 17, 100, 500, 2048, 3000, 8192, 70000],
                       392 * 256).astype(np.int64)          # fill has no bounds check
    heap = numba_alloc.DeviceHeap("2GiB")
    try:
        offsets, intact, data = _fill(heap, sizes)
        live = [(off, block_size(n)) for off, n in zip(offsets.tolist(), sizes.tolist())
                if off >= 0]
        assert len(live) == sizes.size            # 2 GiB holds them all
        spans = sorted(live)
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert intact.all()
        i = rng.integers(0, sizes.size, 200)      # a sample of the bytes, checked on the host
        for k in i.tolist():
            off, n = int(offsets[k]), int(sizes[k])
            assert (data[off:off + n] == (k * 7 + np.arange(n)) % 251).all()
        stats = heap.stats(wait=True)
        assert stats["up_to_date"] and stats["num_allocs"] == sizes.size
        assert stats["bytes_in_use"] == sum(n for _, n in live)
        heap_sim.release[-(-sizes.size // 256), 256](heap, cuda.to_device(offsets))
        stats = heap.stats(wait=True)
        assert stats["bytes_in_use"] == 0 and stats["num_frees"] == sizes.size
        assert numba_alloc.memory_stats()["device_heap.num_frees"] == sizes.size
    finally:
        heap.close()


def test_a_full_heap_fails_fast_and_keeps_what_it_gave():
    heap = numba_alloc.DeviceHeap(4 * numba_alloc.DeviceHeap.page_size)
    try:
        sizes = np.full(8 * 256, 1000, np.int64)          # 8 times what it holds
        offsets, intact, _ = _fill(heap, sizes)
        granted = offsets[offsets >= 0]
        assert granted.size == 4 * (heap.page_size // 1024) and intact.all()
        assert len(set(granted.tolist())) == granted.size
        assert heap.stats(wait=True)["num_failed"] == sizes.size - granted.size
    finally:
        heap.close()


def test_stats_never_wait_for_a_running_kernel():
    heap = numba_alloc.DeviceHeap("1MiB")
    kernel = jit(wait_then_fill)
    flag = cuda.mapped_array(1, dtype=np.int32)
    x = cuda.device_array(256, np.float32)
    kernel[1, 256](flag, x, np.float32(0), 0)     # compiled
    cuda.synchronize()
    flag[0] = 0
    try:
        kernel[1, 256](flag, x, np.float32(1), WAIT_NS)   # runs until the flag is set
        stats = heap.stats()                      # the copy waits behind the kernel
        assert not stats["up_to_date"]
        flag[0] = 1
        assert heap.stats(wait=True)["up_to_date"]
    finally:
        flag[0] = 1
        cuda.synchronize()
        heap.close()


@pytest.mark.parametrize("threads", [256, pytest.param(1 << 17, marks=gpu_only(
    "10^5 threads that meet in warps take the CUDA simulator minutes"))])
def test_malloc_warp_lays_each_warps_parts_out_in_one_block(threads):
    """Particle emission's sizes (16 B x 0 to 16, a negative one now and
    then): each thread's part inside its warp's one block, disjoint and
    tagged, one block per group of threads that met, freed by its holder."""
    particles = (np.arange(threads) * 2654435761 % 2**32 >> 13) % 17
    sizes = np.where(np.arange(threads) % 97 == 5, -1, 16 * particles).astype(np.int64)
    heap = numba_alloc.DeviceHeap(max(2 * int(sizes[sizes > 0].sum()), 1 << 22))
    try:
        offsets, blocks = (cuda.device_array(threads, np.int64) for _ in range(2))
        grid = -(-threads // 128), 128
        heap_sim.warp_blocks[grid](heap, cuda.to_device(sizes), offsets, blocks)
        offsets, blocks = offsets.copy_to_host(), blocks.copy_to_host()
        data, meta = heap._data.copy_to_host(), heap._meta.copy_to_host()
        assert ((offsets >= 0) == (sizes >= 0)).all() and (offsets[sizes >= 0] % 16 == 0).all()
        live = heap_sim.live_blocks(meta, heap.size // heap.page_size)
        assert set(live) == set(blocks[blocks >= 0].tolist())      # one holder per block
        starts = np.array(sorted(live), np.int64)
        parts = sorted((int(o), int(n)) for o, n in zip(offsets, sizes) if n > 0)
        assert all(a + n <= b for (a, n), (b, _) in zip(parts, parts[1:]))
        for off, n in parts:                                       # inside its block
            start = int(starts[np.searchsorted(starts, off, side="right") - 1])
            assert off + n <= start + live[start]
        tagged = [i for i in range(threads) if sizes[i] > 0]
        assert all(data[offsets[i]] == data[offsets[i] + sizes[i] - 1] == i % 251
                   for i in tagged)
        stats = heap.stats(wait=True)
        assert stats["num_allocs"] == len(live) >= threads // 32
        assert stats["num_failed"] == int((sizes < 0).sum())
        assert stats["bytes_in_use"] == sum(live.values())
        heap_sim.release[grid](heap, cuda.to_device(blocks))
        stats = heap.stats(wait=True)
        assert stats["bytes_in_use"] == 0 and stats["num_frees"] == len(live)
    finally:
        heap.close()


@pytest.mark.parametrize("threads", [1, 31, 32, 33, pytest.param(1024, marks=gpu_only(
    "1024 threads that meet in warps take the CUDA simulator a minute"))])
def test_partial_warps_allocate(threads):
    """Blocks of 1024 threads need ``launch_bounds``: this kernel calling
    malloc takes 90 registers a thread on sm_90 (64 with the bound, a few
    spilled; benchmarks/heap_ptx_registers.py), and 1024 x 90 is more than
    an SM's 65,536."""
    heap = numba_alloc.DeviceHeap("1MiB")
    kernel = heap_sim.fill if threads <= 512 else cuda.jit(launch_bounds=1024)(
        heap_sim.fill.py_func)
    try:
        offsets, intact, _ = _fill(heap, np.full(threads, 16, np.int64), threads, kernel)
        assert (offsets >= 0).all() and len(set(offsets.tolist())) == threads and intact.all()
        assert heap.stats(wait=True)["num_allocs"] == threads
    finally:
        heap.close()
