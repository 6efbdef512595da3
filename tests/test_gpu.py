"""Real Numba programs under the plugin. They need a CUDA GPU and are
skipped where there is none (CI). The plugin is installed when this module
is imported, before any test creates a CUDA context. The kernels are in
gpu_kernels (PTX_KERNELS: each with its signature, for CI's compile_ptx)."""

import gc
import multiprocessing as mp

import numpy as np
import pytest

import numba_alloc
from numba_alloc.api import compat
from numba_alloc.policy.block import PENDING
from numba_alloc.units import MiB

from invariants import check

from gpu_kernels import PTX_KERNELS, add_one, axpy, jit, wait_then_fill  # noqa: F401
from gpu_marks import GPU_MARKS, HAVE_GPU, gpu_only, gpu_toolchain  # noqa: F401
from numba import cuda

pytestmark = GPU_MARKS

if HAVE_GPU:
    numba_alloc.install()


def pool():
    with numba_alloc.device_pool() as p:
        return p


def test_arrays_come_from_the_pool_and_stats_follow():
    before = numba_alloc.memory_allocated()
    a = cuda.device_array(1000, dtype=np.float32)
    b = cuda.to_device(np.arange(300_000, dtype=np.float64))
    assert numba_alloc.memory_allocated() == before + 4096 + 2_400_256
    block = a.gpu_data.owner.block if hasattr(a.gpu_data, "owner") else None
    assert block is not None and block.address == a.__cuda_array_interface__["data"][0]
    del a, b
    assert numba_alloc.memory_allocated() == before
    check(pool())


def test_kernels_copies_and_slices_are_correct():
    host = np.arange(1 << 20, dtype=np.float32)
    d = cuda.to_device(host)
    jit(add_one)[64, 256](d)
    view = d[1000:5000][::2]
    jit(add_one)[16, 128](view)
    expected = host + 1
    expected[1000:5000:2] += 1
    np.testing.assert_array_equal(d.copy_to_host(), expected)
    out = cuda.device_array_like(d)
    jit(axpy)[64, 256](out, np.float32(2), d, d)
    np.testing.assert_array_equal(out.copy_to_host(), 3 * expected)


def test_reuse_across_several_streams_keeps_data_correct():
    streams = [cuda.stream() for _ in range(4)]
    n = 1 << 18
    for round_ in range(20):
        arrays = []
        for k, s in enumerate(streams):
            x = cuda.to_device(np.full(n, k + round_, np.float32), stream=s)
            jit(add_one)[128, 256, s](x)
            arrays.append((k, s, x))
        for k, s, x in arrays:
            np.testing.assert_array_equal(x.copy_to_host(stream=s), k + round_ + 1)
            s.synchronize()
        del arrays, x
    check(pool())


WAIT_NS = 5_000_000_000      # the kernel stops waiting after 5 s on the GPU's clock


@pytest.mark.parametrize("stream_kind", ["default", "numba"])
def test_a_freed_block_is_not_handed_out_while_a_kernel_still_uses_it(stream_kind):
    p = pool()
    p.empty_cache()                  # no cached segment can serve the next requests
    stream = cuda.default_stream() if stream_kind == "default" else cuda.stream()
    kernel = jit(wait_then_fill)
    flag = cuda.mapped_array(1, dtype=np.int32)
    # compiled, not waiting, on an array of its own: Numba's compiling launch
    # keeps its arguments alive until the garbage collector runs (with its
    # default manager too), and x must be freed by its del below
    kernel[1, 256, stream](flag, cuda.device_array(256, dtype=np.float32), np.float32(0), 0)
    n = 32 * MiB // 4                # a whole segment: y cannot come from x's
    x = cuda.device_array(n, dtype=np.float32)
    kernel[1, 256, stream](flag, x[:1024], np.float32(0), 0)
    stream.synchronize()
    block = x.gpu_data.owner.block
    address, syncs = block.address, p.memory_stats()["num_sync_all_streams"]
    flag[0] = 0
    try:
        # on x's first 4 KiB (a thread block filling 32 MiB takes the
        # stand-in's simulator seconds); the view goes with the launch
        kernel[1, 256, stream](flag, x[:1024], np.float32(1), WAIT_NS)
        running = cuda.event(timing=False)
        running.record(stream)
        del x                        # freed while the kernel waits to write it
        y = cuda.device_array(n, dtype=np.float32)
        y_block = y.gpu_data.owner.block
        assert not running.query(), "the kernel's wait timed out: the host was held up"
        assert block.state is PENDING
        assert y_block.address + y_block.allocated_size <= address or \
            y_block.address >= address + block.allocated_size
        assert p.memory_stats()["num_sync_all_streams"] == syncs
    finally:
        flag[0] = 1                  # let the kernel go (or its timeout will)
        cuda.synchronize()
    p.synchronize()
    assert block.state is not PENDING                      # its event has completed
    z = cuda.device_array(n, dtype=np.float32)
    assert z.gpu_data.owner.block.address == address       # now it is reused
    del y, z
    check(p)


def test_get_memory_info_adds_the_pools_free_blocks():
    a = cuda.device_array(8 * MiB, dtype=np.uint8)
    del a
    p = pool()
    p.synchronize()
    free, total = cuda.current_context().get_memory_info()
    device_free, device_total = p.backend.memory_info()
    assert total == device_total
    cached = p.current("reserved_bytes") - p.current("active_bytes", retire_completed=True)
    assert free == device_free + cached
    assert cached >= 8 * MiB


def test_host_arrays_given_to_kernels_are_staged_in_the_pool():
    """numba-cuda's device copies of the NumPy arrays a kernel is given come
    from the pool: the memory the driver shows in use grows by what the pool
    reserves (within 2 MiB), and the arrays come back right."""
    kernel = jit(add_one)
    kernel[1, 32](np.zeros(32, np.float32))         # compiled and loaded first
    cuda.synchronize()

    def used():
        free, total = p.backend.memory_info()       # the driver's cuMemGetInfo
        return total - free
    p = pool()
    used_before, reserved_before = used(), p.current("reserved_bytes")
    staged_before = p.memory_stats()["staged_bytes.allocated"]
    for step in range(40):
        host = np.full(250_000 + 50_000 * step, step, np.float32)      # 1 to 9 MiB
        kernel[64, 256](cuda.InOut(host) if step % 2 else host)
        grown = used() - used_before
        assert abs(grown - (p.current("reserved_bytes") - reserved_before)) <= 2 * MiB
        assert (host == step + 1).all()
    stats = p.memory_stats()
    assert stats["staged_bytes.allocated"] - staged_before >= 40 * 1_000_000
    assert stats["staged_bytes.current"] == 0


def _read_ipc(handle, queue):
    with handle as array:
        queue.put(array.copy_to_host())


def test_ipc_handle_of_a_block_inside_a_segment_names_its_offset_and_pins_it():
    keep = cuda.device_array(1000, dtype=np.uint8)      # so the next block is not at the base
    x = cuda.to_device(np.arange(4096, dtype=np.int32))
    handle = x.get_ipc_handle()
    block = x.gpu_data.owner.block
    assert handle._ipc_handle.offset == block.address - block.segment.address > 0
    assert block.pinned
    del keep


@gpu_only("the handle is opened in another process")
def test_ipc_handle_of_a_block_inside_a_segment_opens_in_another_process():
    keep = cuda.device_array(1000, dtype=np.uint8)      # so the next block is not at the base
    x = cuda.to_device(np.arange(4096, dtype=np.int32))
    handle = x.get_ipc_handle()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_ipc, args=(handle, queue))
    proc.start()
    data = queue.get(timeout=120)
    proc.join()
    np.testing.assert_array_equal(data, np.arange(4096, dtype=np.int32))
    del keep


def test_out_of_memory_is_numbas_error_and_leaves_the_pool_intact():
    from numba.cuda.cudadrv.driver import CudaAPIError
    a = cuda.to_device(np.arange(1000, dtype=np.int64))
    # garbage of earlier tests (a failed test's arrays live on in its
    # traceback's cycle) freed now, not by a collection inside the window
    gc.collect()
    gc.disable()
    try:
        before = compat.memory_allocated(pool())
        total = compat.total_memory(pool())
        with pytest.raises(CudaAPIError) as info:
            cuda.device_array(total * 2, dtype=np.uint8)
        assert isinstance(info.value, numba_alloc.OutOfMemoryError)
        assert compat.memory_allocated(pool()) == before
    finally:
        gc.enable()
    np.testing.assert_array_equal(a.copy_to_host(), np.arange(1000))


def test_getters_by_gpu_id_and_tensorflow_names():
    a = cuda.device_array(3 * MiB, dtype=np.uint8)
    assert numba_alloc.get_bytes_in_use(0) == numba_alloc.memory_allocated(0)
    assert numba_alloc.get_memory_info("GPU:0")["current"] == numba_alloc.get_bytes_in_use(0)
    assert numba_alloc.get_bytes_limit(0) == numba_alloc.total_memory(0)
    with pytest.raises(RuntimeError, match="initialized"):
        numba_alloc.set_memory_growth("GPU:0", False)
    with pytest.raises(ValueError, match="not tracked"):
        numba_alloc.get_memory_info("CPU:0")
    del a


def test_defer_cleanup_holds_frees():
    p = pool()
    with cuda.defer_cleanup():
        a = cuda.device_array(MiB, dtype=np.uint8)
        del a
        assert p.current("active_bytes", retire_completed=True) >= MiB
    p.synchronize()
    assert p.current("active_bytes", retire_completed=True) == compat.memory_allocated(p)


def test_context_reset_releases_the_pool():
    a = cuda.device_array(32 * MiB, dtype=np.uint8)
    p = pool()
    assert compat.memory_reserved(p) >= 32 * MiB
    cuda.current_context().reset()
    assert compat.memory_reserved(p) == 0
    del a                                   # its finalizer runs after the reset: harmless
    b = cuda.to_device(np.arange(10))
    np.testing.assert_array_equal(b.copy_to_host(), np.arange(10))
    # the reset unloaded the context's modules, but Numba's kernels keep their
    # functions: the later tests' kernels must be compiled again (a kernel of
    # test_gpu.py launched after this test failed with CUDA_ERROR_INVALID_HANDLE)
    jit.cache_clear()


def test_expandable_segments_map_pages_a_kernel_runs_across_and_give_them_back():
    """A pool of its own over this GPU (CudaDevice) with
    expandable_segments on: blocks grow one run of pages (the driver's
    virtual memory calls), a kernel writes a block that spans several pages
    mapped at different times, and freed pages go back to the driver
    (cuMemGetInfo's free grows by them) while the live blocks keep their
    bytes; reset unmaps every page."""
    from numba_alloc.backends.cuda_device import CudaDevice
    backend = CudaDevice(cuda.current_context())
    if not backend.page_size:
        pytest.skip("this GPU has no virtual memory management")
    p = numba_alloc.Pool(backend, expandable_segments=True, limit=256 * MiB)
    try:
        blocks = [p.malloc(n) for n in (3 * MiB, 5 * MiB + 4096, 7 * MiB + 1, 3 * MiB)]
        assert len(backend._page_handles) * backend.page_size == compat.memory_reserved(p)
        arrays = [backend._array(b.address, (b.size // 4,), np.float32) for b in blocks]
        for i, a in enumerate(arrays):
            a.copy_to_device(np.full(a.shape, i, np.float32))
        jit(add_one)[64, 256](arrays[2])            # spans the pages of three mappings
        cuda.synchronize()
        check(p)
        p.free(blocks[1])
        p.free(blocks[3])
        p.synchronize()
        free_before = backend.memory_info()[0]
        p.empty_cache()
        check(p)
        assert backend.memory_info()[0] > free_before
        for i in (0, 2):
            np.testing.assert_array_equal(arrays[i].copy_to_host(), i + (i == 2))
    finally:
        p.reset()
        backend.close()
    assert not backend._page_handles and not backend._reserved


def test_defrag_moves_a_run_of_pages_by_remapping_it_and_a_kernel_sees_its_bytes():
    """A pool of its own over this GPU with expandable_segments and defrag
    on, a 5-page limit: two blocks of 1.5 pages apart in runs of their own (the
    block between them freed, its whole pages unmapped); a 2-page request
    fits only once the second run moves down by remapping its pages
    (cuMemUnmap, cuMemMap, cuMemSetAccess) and its block slides: its bytes
    read back, and a kernel runs on it at its new address."""
    from numba_alloc.backends.cuda_device import CudaDevice
    backend = CudaDevice(cuda.current_context())
    page = backend.page_size
    if not page:
        pytest.skip("this GPU has no virtual memory management")
    copy_error = backend.load_copy_kernel()
    assert copy_error is None, copy_error
    p = numba_alloc.Pool(backend, expandable_segments=True, defrag=True, limit=5 * page)
    try:
        low, middle, high = (p.malloc(3 * page // 2) for _ in range(3))
        data = np.arange(high.size // 4, dtype=np.float32)
        backend._array(high.address, data.shape, np.float32).copy_to_device(data)
        p.free(middle)
        p.synchronize()
        p.empty_cache()
        assert len(p._runs()) == 2
        old = high.address
        p.malloc(2 * page)
        check(p)
        assert high.address != old and len(p._runs()) == 1
        moved = backend._array(high.address, data.shape, np.float32)
        np.testing.assert_array_equal(moved.copy_to_host(), data)
        jit(add_one)[64, 256](moved)
        cuda.synchronize()
        np.testing.assert_array_equal(moved.copy_to_host(), data + 1)
    finally:
        p.reset()
        backend.close()
    assert not backend._page_handles and not backend._reserved
