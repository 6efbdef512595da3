"""Reclaim on a real GPU, on a Pool used directly (skipped without a GPU;
the simulated device runs the same policy in test_reclaim.py)."""

import numpy as np

from gpu_kernels import fill_value, jit
from gpu_marks import GPU_MARKS, gpu_toolchain  # noqa: F401 (GPU_MARKS uses it)
from invariants import check

pytestmark = GPU_MARKS

MiB = 1 << 20


def test_blocks_three_times_the_pool_limit_keep_their_bytes():
    from numba import cuda

    from numba_alloc import Pool
    from numba_alloc.cuda_backend import CudaDevice
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
