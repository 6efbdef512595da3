"""Reclaim on a real GPU, on a Pool used directly and under the Numba
plugin (skipped without a GPU; the simulated device runs the same policy in
test_reclaim.py, and the plugin's hooks over stand-ins in test_activity.py)."""

import textwrap

import numpy as np

import pytest

import gpu_programs
from gpu_kernels import fill_value, jit
from gpu_marks import GPU_MARKS, HAVE_GPU, STANDIN, gpu_toolchain  # noqa: F401 (GPU_MARKS uses it)
from invariants import check

pytestmark = GPU_MARKS


def _refused():
    from numba_alloc.plugin.activity import unsupported_reason
    return unsupported_reason()


REFUSED = _refused() if HAVE_GPU else None
under_the_plugin = pytest.mark.skipif(
    REFUSED is not None, reason=f"reclaim is refused under this Numba's plugin: {REFUSED}")

MiB = 1 << 20


def test_blocks_three_times_the_pool_limit_keep_their_bytes():
    from numba import cuda

    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice
    backend = CudaDevice(cuda.current_context())
    pool = Pool(backend, reclaim=True, limit=256 * MiB)
    kernel = jit(fill_value)
    blocks, values = [], {}
    for i in range(12):                         # 12 x 60 MiB against a 256 MiB limit
        block = pool.malloc(60 * MiB)
        blocks.append(block)
        with pool.use(block):
            x = backend._array(block.address, (block.size,), np.uint8)
            kernel[-(-block.size // 256), 256](x, np.uint8(i + 1))
        values[i] = i + 1
    assert sum(not pool.is_resident(b) for b in blocks) >= 8
    for i, block in reversed(list(enumerate(blocks))):
        with pool.use(block):
            x = backend._array(block.address, (block.size,), np.uint8)
            assert (x.copy_to_host() == values[i]).all()
    check(pool)
    for block in blocks:
        pool.free(block)
    pool.synchronize()
    stats = check(pool)["stats"]
    assert stats["reclaimed.current"] == 0 and stats["reclaimed_bytes.allocated"] >= 8 * 64 * MiB


# -- under the Numba plugin (numba_alloc.plugin.activity): each program in its own
# process, for a fresh context whose pool has the settings it needs -----------

PRELUDE = textwrap.dedent("""
    import numpy as np
    from numba import cuda
    import numba_alloc
    from numba_alloc.api import compat
    from gpu_kernels import add as add_kernel, jit, scale as scale_kernel
    numba_alloc.install()
    add, scale = jit(add_kernel), jit(scale_kernel)
    MiB = 1 << 20

    def pool():
        with numba_alloc.device_pool() as p:
            return p

    def rotation(n=16, size=32 * MiB, steps=48):
        '''n float32 arrays of ``size`` bytes (twice the test's limit), kernels
        launched over them in rotation, checked against NumPy.'''
        host = [np.full(size // 4, i, np.float32) for i in range(n)]
        arrays = [cuda.to_device(h) for h in host]
        for step in range(steps):
            x, y, out = step % n, (step * 7 + 3) % n, (step * 5 + 1) % n
            if len({x, y, out}) < 3:
                continue
            add[256, 256](arrays[x], arrays[y], arrays[out])
            host[out] = host[x] + host[y]
            scale[256, 256](arrays[out], np.float32(0.5))
            host[out] *= np.float32(0.5)
            arrays[x][5] = 7.0                        # __setitem__
            host[x][5] = 7.0
            assert arrays[y][9] == host[y][9]         # indexing
            assert (arrays[out][1000:3000].copy_to_host() == host[out][1000:3000]).all()
        for a, h in zip(arrays, host):
            assert (a.copy_to_host() == h).all()
        return arrays
""")


def run(body, conf):
    return gpu_programs.run(PRELUDE, body, conf)


@under_the_plugin
def test_numba_arrays_twice_the_limit_run_with_reclaim_and_not_without():
    # over the driver stand-in, which checks paths and not figures, a quarter
    # of the bytes: arrays of 8 MiB and a 64 MiB limit
    size, limit = (8 * MiB, 64 * MiB) if STANDIN else (32 * MiB, 256 * MiB)
    run(f"""
        rotation(size={size})
        stats = pool().memory_stats()
        assert stats["reclaimed_bytes.allocated"] > 0, stats
        print("reclaimed", stats["reclaimed_bytes.allocated"], compat.get_num_single_reclaims(pool()),
              compat.get_num_full_reclaims(pool()))
    """, f"reclaim:true,limit:{limit}")
    refused = run(f"""
        try:
            rotation(size={size})
        except numba_alloc.OutOfMemoryError:
            print("out of memory")
    """, f"limit:{limit}")
    assert "out of memory" in refused


@under_the_plugin
def test_a_launch_whose_arguments_fit_only_once_everything_else_is_reclaimed():
    run("""
        small = [cuda.to_device(np.full(30 * MiB // 4, i, np.float32)) for i in range(8)]
        big = [cuda.to_device(np.full(80 * MiB // 4, i + 1, np.float32)) for i in range(3)]
        add[1024, 256](big[0], big[1], big[2])       # 240 MiB of arguments, 256 MiB limit
        assert (big[2].copy_to_host() == 3).all()
        for i, a in enumerate(small):
            assert (a.copy_to_host() == i).all()
        print("full reclaims", compat.get_num_full_reclaims(pool()))
    """, "reclaim:true,limit:268435456")


@under_the_plugin
def test_namedtuple_and_vectorize_arguments_come_back_and_stay_unpinned():
    run("""
        from numba import vectorize
        from gpu_kernels import Pair, add_pair as add_pair_kernel, twice
        add_pair = jit(add_pair_kernel)
        double = vectorize(["float32(float32)"], target="cuda")(twice)
        arrays = [cuda.to_device(np.full(32 * MiB // 4, i, np.float32)) for i in range(16)]
        add_pair[256, 256](Pair(arrays[0], arrays[1]), arrays[2])   # 0 and 1 were reclaimed
        assert (arrays[2].copy_to_host() == 1).all()
        doubled = double(arrays[3])
        assert (doubled.copy_to_host() == 6).all()
        assert not any(numba_alloc.plugin.relocation.block_of(a.gpu_data).pinned for a in arrays)
        for i in (4, 5, 6):
            assert (arrays[i].copy_to_host() == i).all()
    """, "reclaim:true,limit:268435456")
