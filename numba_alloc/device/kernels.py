"""The device kernels numba_alloc runs: copies that move live blocks.

One launch copies a whole table of moves between two segments. Each row is
(source offset, destination offset, length) in bytes; a grid-stride loop
copies the aligned middle of each move in 16-byte words (the segments viewed
as complex128, a plain 16-byte load and store) and the unaligned edges in
single bytes. The kernel counts what it moved in a small device-resident
array with ``cuda.atomic.add``, one per thread block: its first thread
adds what the block's threads copied, from the grid-stride loops'
arithmetic (one atomic per thread, all on one address, cost an H100 1.3 ms
for 256 MiB, seven times the copy; a sum in shared memory would make the
threads wait for each other):

    counters[DEFRAGMENTATIONS]  += first      (1 on the first launch of a defragmentation)
    counters[BYTES_MOVED]       += bytes copied
    counters[BLOCKS_MOVED]      += rows of the table

The same Python function is compiled by ``cuda.jit`` for a GPU and run by
Numba's CUDA simulator for the simulated device, so CI checks its arithmetic.
"""

import functools

import numpy as np
from numba import cuda

from ..policy.backend import BLOCKS_MOVED, BYTES_MOVED, COUNTERS, DEFRAGMENTATIONS  # noqa: F401

WORD = 16


def copy_moves(dst_bytes, src_bytes, dst_words, src_words, table, counters, first):
    """Copy every row of ``table`` from ``src`` to ``dst`` (views of the two
    segments as uint8 and as 16-byte words). Rows must not overlap each
    other's destinations or any source."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    threads = cuda.blockDim.x
    block_first = cuda.blockIdx.x * threads     # the block's first thread in the grid
    counting = cuda.threadIdx.x == 0
    moved = 0
    for row in range(table.shape[0]):
        src = table[row, 0]
        dst = table[row, 1]
        length = table[row, 2]
        head = length
        if (src - dst) % WORD == 0:
            head = min((WORD - src % WORD) % WORD, length)
        words = (length - head) // WORD
        for i in range(start, head, stride):
            dst_bytes[dst + i] = src_bytes[src + i]
        src_word = (src + head) // WORD
        dst_word = (dst + head) // WORD
        for i in range(start, words, stride):
            dst_words[dst_word + i] = src_words[src_word + i]
        tail = head + words * WORD
        for i in range(tail + start, length, stride):
            dst_bytes[dst + i] = src_bytes[src + i]
        if counting:
            # what the block's threads copied: a loop over n items gives
            # thread t (< stride) n // stride items, one more when t < n % stride
            tail_bytes = length - tail
            moved += threads * (head // stride) + min(max(head % stride - block_first, 0), threads)
            moved += WORD * (threads * (words // stride)
                             + min(max(words % stride - block_first, 0), threads))
            moved += (threads * (tail_bytes // stride)
                      + min(max(tail_bytes % stride - block_first, 0), threads))
    if counting:
        cuda.atomic.add(counters, BYTES_MOVED, moved)
    if start == 0:
        cuda.atomic.add(counters, DEFRAGMENTATIONS, first)
        cuda.atomic.add(counters, BLOCKS_MOVED, table.shape[0])


# the one signature CudaDevice.copy launches copy_moves with: both segments as
# uint8 and as 16-byte words, a leading slice of the C-contiguous (rows, 3)
# move table, the counters, and ``first``
COPY_MOVES_SIGNATURE = ("void(uint8[::1], uint8[::1], complex128[::1], complex128[::1], "
                        "int64[:, ::1], int64[::1], int64)")


def _disk_cache_usable():
    """Whether Numba can cache kernels of this file on disk (a writable
    __pycache__, NUMBA_CACHE_DIR or the user's cache directory)."""
    from numba.cuda.dispatcher import CUDACache
    try:
        CUDACache(copy_moves)
    except RuntimeError:            # "cannot cache function ...: no locator available"
        return False
    return True


def gpu_copy_moves():
    """A new dispatcher of ``copy_moves`` compiled for the GPU, for
    COPY_MOVES_SIGNATURE only, in the current context (from Numba's on-disk
    cache when it has it: the cubin, no NVVM or linking). Compiling is then
    disabled: a launch with other argument types raises instead of compiling
    under whatever lock its caller holds.

    New for each context, and after each reset of one: its first launch
    loads the module into the current context, and Numba keeps the loaded
    function by device number for good (CUDACodeLibrary._cufunc_cache),
    although Context.reset() unloads its module and cuda.close() makes a new
    context; an old dispatcher would launch the unloaded function."""
    return cuda.jit(COPY_MOVES_SIGNATURE, cache=_disk_cache_usable())(copy_moves)


@functools.cache
def _simulated_kernel():
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    return FakeCUDAKernel(copy_moves, device=False)


def simulated_copy(dst, src, table, counters, first, grid=(2, 32)):
    """Run ``copy_moves`` under Numba's CUDA simulator on NumPy arrays: the
    uint8 segments ``dst`` and ``src`` (sizes multiples of 16), the int64
    ``table`` and ``counters``. The arrays are handed over as the
    simulator's device arrays, sharing memory as views of one device
    allocation do on a GPU."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    args = (dst, src, dst.view(np.complex128), src.view(np.complex128), table, counters)
    _simulated_kernel()[grid](*(FakeCUDAArray(a) for a in args), first)
