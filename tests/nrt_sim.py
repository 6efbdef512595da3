"""NRT's allocations served by the pool's heap (the nrt_heap_size setting)
under the CUDA simulator (run by test_nrt_heap.py in a subprocess with
NUMBA_ENABLE_CUDASIM=1); prints one JSON object.

The kernels do what a kernel's NRT does through numba_alloc's NRT
(device/nrt_heap.py) for ``np.empty(n, np.int64)``: find the heap through
its descriptor (as the module global does on a GPU), ask heap_malloc for
the bytes NRT_MemInfo_alloc_aligned asks NRT_Allocate_External for (a
40-byte MemInfo, the data, twice the 32-byte alignment), and give each
block back with heap_free (NRT_Free), several arrays alive at once."""

import json

import numpy as np
from numba import cuda

from numba_alloc import Pool, SimulatedDevice, memory_summary
from numba_alloc.device import nrt_heap as nrt_device
from numba_alloc.device.heap_kernels import heap_free, heap_malloc
from numba_alloc.plugin.nrt_heap import heap_of

import simulator_threads

MEMINFO, ALIGN = 40, 32             # numba-cuda's NRT_MemInfo; its arrays' alignment


def nrt_bytes(nbytes):
    """What NRT asks its allocator for an array of ``nbytes`` bytes."""
    return MEMINFO + nbytes + 2 * ALIGN


@cuda.jit
def arrays(data, meta, counts, sums, failed):
    """Thread i: three int64 arrays of counts[i], counts[i] + 1 and 2 items,
    alive together, filled with i + j and summed (sums[i], -1 when one was
    not granted: failed[i] of them), then freed, the last first."""
    i = cuda.grid(1)
    n = counts[i]
    a = heap_malloc(data, meta, nrt_bytes(8 * n))
    b = heap_malloc(data, meta, nrt_bytes(8 * (n + 1)))
    c = heap_malloc(data, meta, nrt_bytes(16))
    total = 0
    for off, items in ((a, n), (b, n + 1), (c, 2)):
        if off >= 0:
            values = data[off + MEMINFO + ALIGN:off + MEMINFO + ALIGN + 8 * items].view(np.int64)
            for j in range(items):
                values[j] = i + j
    for off, items in ((a, n), (b, n + 1), (c, 2)):
        if off >= 0:
            values = data[off + MEMINFO + ALIGN:off + MEMINFO + ALIGN + 8 * items].view(np.int64)
            for j in range(items):
                total += values[j]
        else:
            failed[i] += 1
    sums[i] = total if failed[i] == 0 else -1
    heap_free(data, meta, c)
    heap_free(data, meta, b)
    heap_free(data, meta, a)


@cuda.jit
def frees(data, meta, offsets):
    """NRT_Free of offsets[i] (-1: the null pointer; off the heap: not its)."""
    i = cuda.grid(1)
    if i < offsets.size:
        heap_free(data, meta, offsets[i])


def heap_views(pool):
    """(data, meta, descriptor words): the heap as the descriptor the
    kernels' module global points at describes it."""
    words = pool.backend.read(pool.nrt_heap.descriptor_address,
                              8 * nrt_device.DESCRIPTOR_WORDS).view(np.int64).tolist()
    data = pool.backend.view(words[nrt_device.DATA_ADDRESS], words[nrt_device.DATA_BYTES])
    meta = pool.backend.view(words[nrt_device.META_ADDRESS],
                             8 * words[nrt_device.META_WORDS]).view(np.int64)
    return data, meta, words


def run(pool, counts, grid):
    data, meta, _ = heap_views(pool)
    sums, failed = np.zeros(counts.size, np.int64), np.zeros(counts.size, np.int64)
    arrays[grid](data, meta, counts, sums, failed)
    stats = pool.memory_stats()
    return {"sums": sums.tolist(), "failed": failed.tolist(),
            "nrt": {k: v for k, v in stats.items() if k.startswith("nrt.")},
            "allocated": stats["allocated_bytes.all.current"]}


def main():
    out = {}
    pool = Pool(SimulatedDevice("64MiB"), nrt_heap_size="1MiB")
    nrt_heap = heap_of(pool)
    _, _, words = heap_views(pool)
    out["descriptor"] = {"words": words, "heap": nrt_heap.heap.address,
                         "size": nrt_heap.heap.size, "meta_len": nrt_heap.heap._meta_len}
    counts = (np.arange(128) % 13 + 1).astype(np.int64)
    out["roomy"] = run(pool, counts, (2, 64))
    out["pinned"] = [b["pinned"] for s in pool.snapshot()["segments"] for b in s["blocks"]
                     if b["state"] == "active_allocated"]
    # a heap of one page: NRT gets the null pointer, counted; the pool is untouched
    pool.configure(nrt_heap_size=1)
    before = pool.memory_stats()["allocated_bytes.all.current"]
    big = np.full(96, 60, np.int64)     # 3 arrays of about 600 B a thread: 96 fit a page
    out["full"] = run(pool, big, (3, 32))
    out["full"]["pool_before"] = before
    data, meta, _ = heap_views(pool)
    frees[1, 4](data, meta, np.array([-1, data.size + 4096, 8, -data.size], np.int64))
    out["bad_frees"] = {k: v for k, v in pool.memory_stats().items() if k.startswith("nrt.")}
    # more room between launches: the same kernel then gets every array
    pool.configure(nrt_heap_size="2MiB")
    out["regrown"] = run(pool, big, (3, 32))
    out["summary"] = str(memory_summary(pool))
    print(json.dumps(out))


if __name__ == "__main__":
    simulator_threads.install()
    main()
