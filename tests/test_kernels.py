"""The copy kernel's arithmetic, run by Numba's CUDA simulator."""

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import given, settings
from hypothesis import strategies as st

from numba_alloc.device import kernels


@st.composite
def move_tables(draw):
    """Non-overlapping moves (any alignment) from a source into a destination buffer."""
    size = 16 * draw(st.integers(8, 40))
    rows, src_cursor, dst_cursor = [], draw(st.integers(0, 40)), draw(st.integers(0, 40))
    while True:
        length = draw(st.integers(0, 70))
        if src_cursor + length > size or dst_cursor + length > size:
            break
        rows.append((src_cursor, dst_cursor, length))
        src_cursor += length + draw(st.integers(0, 20))
        dst_cursor += length + draw(st.integers(0, 20))
        if draw(st.integers(0, 4)) == 0:
            break
    return size, np.array(rows, dtype=np.int64).reshape(-1, 3)


@settings(max_examples=60, deadline=None)
@given(case=move_tables(), grid=st.sampled_from([(1, 1), (1, 8), (3, 5)]), first=st.integers(0, 1))
def test_copy_moves_copies_every_byte_and_counts_them(case, grid, first):
    size, table = case
    rng = np.random.default_rng(len(table))
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.full(size, 0xEE, dtype=np.uint8)
    expected = dst.copy()
    for s, d, n in table:
        expected[d:d + n] = src[s:s + n]
    counters = np.zeros(kernels.COUNTERS, dtype=np.int64)
    kernels.simulated_copy(dst, src, table, counters, first, grid=grid)
    np.testing.assert_array_equal(dst, expected)
    assert counters[kernels.BYTES_MOVED] == table[:, 2].sum()
    assert counters[kernels.BLOCKS_MOVED] == len(table)
    assert counters[kernels.DEFRAGMENTATIONS] == first


def test_aligned_moves_use_16_byte_words():
    """The kernel reads aligned middles through the word view and edges
    through the byte view: give the two views different sources to see it."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    src = np.arange(64, dtype=np.uint8)
    other = np.full(64, 7, dtype=np.uint8)           # behind the word view only
    dst = np.zeros(64, dtype=np.uint8)
    counters = np.zeros(kernels.COUNTERS, dtype=np.int64)
    table = np.array([[1, 1, 40]], dtype=np.int64)   # 15 head bytes, 1 word, 9 tail bytes
    args = (dst, src, dst.view(np.complex128), other.view(np.complex128), table, counters)
    kernels._simulated_kernel()[1, 4](*(FakeCUDAArray(a) for a in args), 0)
    assert list(dst[1:16]) == list(range(1, 16))
    assert (dst[16:32] == 7).all()
    assert list(dst[32:41]) == list(range(32, 41))
    assert dst[0] == 0 and (dst[41:] == 0).all()


@pytest.mark.parametrize("grid", [(1, 8), (3, 5), (4, 32)])
def test_each_thread_block_adds_its_bytes_to_the_global_counter_once(grid, monkeypatch):
    """One global atomic per thread per launch, all on one address, made
    the kernel seven times slower than its copies on an H100 (256 MiB:
    290 GB/s against cuMemcpyDtoD's 2,863): the threads of a block sum in
    shared memory and one of them adds the block's total."""
    from numba.cuda.simulator import kernelapi
    counters = np.zeros(kernels.COUNTERS, dtype=np.int64)
    global_adds = []
    add = kernelapi.FakeCUDAAtomic.add

    def counted(self, array, index, val):
        if array is counters or getattr(array, "_ary", None) is counters:
            global_adds.append(index)
        return add(self, array, index, val)
    monkeypatch.setattr(kernelapi.FakeCUDAAtomic, "add", counted)
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    table = np.array([[0, 512, 1000], [2048, 1603, 700]], dtype=np.int64)
    kernels.simulated_copy(dst, src, table, counters, 1, grid=grid)
    assert global_adds.count(kernels.BYTES_MOVED) == grid[0]
    assert counters[kernels.BYTES_MOVED] == 1700
    assert (dst[512:1512] == src[:1000]).all() and (dst[1603:2303] == src[2048:2748]).all()
