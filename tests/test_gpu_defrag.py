"""Defragmentation with real Numba arrays on a GPU. Skipped without one, and
skipped, with the reason, on a numba-cuda whose internals the relocation
cannot fix up (defragmentation is refused there).

Each test runs a small program in its own process, so that it gets a fresh
context whose pool has the settings the test needs (NUMBA_ALLOC_CONF). The
kernels are in gpu_kernels (PTX_KERNELS: each with its signature, for CI's
compile_ptx)."""

import json
import textwrap
from pathlib import Path

import pytest

import gpu_programs
from gpu_kernels import PTX_KERNELS  # noqa: F401
from gpu_marks import GPU_MARKS, HAVE_GPU, gpu_toolchain  # noqa: F401 (GPU_MARKS uses it)


def _refused():
    from numba_alloc.plugin.relocation import unsupported_reason
    return unsupported_reason()


REFUSED = _refused() if HAVE_GPU else None
pytestmark = GPU_MARKS + [pytest.mark.skipif(
    REFUSED is not None, reason=f"defragmentation is refused on this Numba: {REFUSED}")]

PRELUDE = textwrap.dedent("""
    import numpy as np
    from numba import cuda
    import numba_alloc
    from numba_alloc.api import compat
    from gpu_kernels import add as add_kernel, jit, scale as scale_kernel
    numba_alloc.install()
    add, scale = jit(add_kernel), jit(scale_kernel)

    MiB = 1 << 20

    def fragment(n=32, size=4 * MiB):
        '''n arrays of ``size`` bytes with known contents; every other one dropped.'''
        arrays = [cuda.to_device(np.full(size // 4, i, np.float32)) for i in range(n)]
        kept = {i: a for i, a in enumerate(arrays) if i % 2}
        del arrays
        return kept

    def pool():
        with numba_alloc.device_pool() as p:
            return p
""")


def run(body, conf):
    return gpu_programs.run(PRELUDE, body, conf)


def test_arrays_views_and_kernels_follow_moved_blocks():
    out = run("""
        kept = fragment()
        a = kept[1]
        s = a[100:50000][::3][10:]             # a slice of slices
        r = a.reshape(1024, -1)                # a reshaped view
        b = a.bind(cuda.stream())
        scale[64, 128](a, np.float32(2))       # launched before: its shim is cached
        cuda.synchronize()
        before = {i: x.__cuda_array_interface__['data'][0] for i, x in kept.items() if i != 1}
        address = int(a.gpu_data.handle)
        result = numba_alloc.defragment()
        assert result.bytes_moved > 0, result
        assert int(a.gpu_data.handle) != address or any(
            kept[i].device_ctypes_pointer.value != before[i] for i in before)
        host = a.copy_to_host()
        assert (host == 2).all()
        assert (r.copy_to_host() == 2).all()
        assert (b.copy_to_host() == 2).all()
        for i, x in kept.items():
            if i != 1:
                assert (x.copy_to_host() == i).all(), i
        scale[64, 128](a, np.float32(3))      # kernels after the move use the new address
        scale[16, 64](s, np.float32(0.5))
        out = cuda.device_array_like(kept[3])
        add[64, 128](kept[3], kept[5], out)    # several arrays in one launch
        assert (out.copy_to_host() == 8).all()
        expected = np.full(a.size, 6, np.float32)
        expected[100:50000][::3][10:] = 3
        assert (a.copy_to_host() == expected).all()
        print("moved", result.bytes_moved, compat.get_bytes_defragged(pool()),
              compat.get_num_defragmentations(pool()))
    """, "defrag:true")
    moved, counted, times = out.split()[1:]
    assert int(moved) == int(counted) > 0 and int(times) == 1


def test_pinned_and_ipc_exported_arrays_do_not_move():
    run("""
        kept = fragment()
        pinned, exported, read = kept[1], kept[3], kept[5]
        numba_alloc.pin(pinned)
        handle = exported.get_ipc_handle()
        raw = read.__cuda_array_interface__['data'][0]     # the address leaves Numba
        addresses = [int(x.gpu_data.handle) for x in (pinned, exported, read)]
        numba_alloc.defragment()
        assert [int(x.gpu_data.handle) for x in (pinned, exported, read)] == addresses
        assert raw == addresses[2]
    """, "defrag:true")


def test_an_ipc_export_moves_an_array_out_of_mapped_pages_first():
    """expandable_segments: a 4 MiB array lies in mapped pages, which
    cuIpcGetMemHandle refuses; its export first moves it into a segment of
    its own: the handle covers it there, a kernel and a view see its bytes
    at the new address, and it no longer moves."""
    run("""
        a = cuda.to_device(np.full(MiB, 3, np.float32))
        view = a[1000:]
        assert a.gpu_data.block.segment.mapped
        old = int(a.gpu_data.handle)
        handle = a.get_ipc_handle()
        assert int(a.gpu_data.handle) != old and not a.gpu_data.block.segment.mapped
        assert handle._ipc_handle.size == 4 * MiB
        scale[64, 128](a, np.float32(2))
        assert (a.copy_to_host() == 6).all() and (view.copy_to_host() == 6).all()
        where = int(a.gpu_data.handle)
        numba_alloc.defragment()
        assert int(a.gpu_data.handle) == where
    """, "expandable_segments:true")


def test_a_fragmenting_workload_needs_defrag():
    body = """
        kept = fragment(n=48, size=4 * MiB)     # 96 MiB live in 4 MiB holes, arena of 192 MiB
        try:
            big = cuda.device_array(64 * MiB, dtype=np.uint8)
        except numba_alloc.OutOfMemoryError as e:
            print("oom")
        else:
            big[:] = 1
            assert all((x.copy_to_host() == i).all() for i, x in kept.items())
            print("ok", compat.get_num_defragmentations(pool()))
    """
    assert run(body, "growth:false,limit:192MiB").split() == ["oom"]
    assert run(body, "growth:false,limit:192MiB,defrag:true").split() == ["ok", "1"]


def test_the_defrag_benchmarks_gpu_sections_run_and_the_kernel_copies_right():
    """benchmarks/bench_defrag.py's sections 3 and 4, small: the copy
    kernel's and cuMemcpyDtoD's bandwidth (the kernel's last copy checked
    byte by byte) and a compaction against cuMemcpyDtoD of its moves."""
    benchmarks = str(Path(__file__).parent.parent / "benchmarks")
    out = run(f"""
        import json, sys
        sys.path.insert(0, {benchmarks!r})
        import bench_defrag
        bandwidth = bench_defrag.gpu_bandwidth([1 << 16, MiB], 2, spacer=MiB)
        compaction = bench_defrag.gpu_compaction(2, arrays=24, smallest=1 << 16, largest=2 * MiB)
        bench_defrag.print_compaction(compaction)
        print(json.dumps({{"bandwidth": list(bandwidth.values()), "compaction": compaction}}))
    """, "defrag:true")
    figures = json.loads(out.splitlines()[-1])
    for row in figures["bandwidth"]:
        assert row["right"] and 0 <= row["device"]["hidden"] <= 1
        assert min(row[mode][which] for mode in ("device", "idle")
                   for which in ("kernel", "memcpy")) > 0
    for row in figures["compaction"]:
        assert row["bytes_moved"] > 0 and row["moves"] >= 1 and row["launches"] >= 1
        assert 0 < row["copy_seconds"] <= row["seconds"] and row["memcpy_seconds"] > 0
        assert row["copy_seconds"] + row["release_seconds"] <= row["seconds"]
        assert row["releases"] >= 1       # every other array dropped: segments empty
        # release=False: the same moves, no segment given back inside it
        assert row["kept_bytes_moved"] == row["bytes_moved"] and row["kept_releases"] == 0
        assert 0 < row["kept_copy_seconds"] <= row["kept_seconds"]
    assert "defragment(release=False)" in out       # section 4's print of both
