"""Device heap scenarios under the CUDA simulator (run by test_device_heap.py
in a subprocess with NUMBA_ENABLE_CUDASIM=1); prints one JSON object."""

import json

import numba
import numpy as np
from numba import cuda

from numba_alloc import DeviceHeap, Pool, SimulatedDevice, memory_summary
from numba_alloc.device import heap_kernels as hk
from numba_alloc.device import heap_layout as layout

import simulator_threads


@cuda.jit
def fill(heap, sizes, offsets, intact):
    i = cuda.grid(1)
    off = heap.malloc(sizes[i])
    offsets[i] = off
    if off >= 0:
        out = heap.view(off, sizes[i], numba.uint8)
        for j in range(sizes[i]):
            out[j] = (i * 7 + j) % 251
    cuda.syncthreads()
    ok = 1
    if off >= 0:
        out = heap.view(off, sizes[i], np.uint8)
        for j in range(sizes[i]):
            if out[j] != (i * 7 + j) % 251:
                ok = 0
    intact[i] = ok


def emit_value(heap, i):             # a device function using the heap
    off = heap.malloc(8)
    if off >= 0:
        heap.view(off, 2, numba.float32)[1] = i
    return off


emit = cuda.jit(device=True)(emit_value)


@cuda.jit
def floats(heap, offsets):
    i = cuda.grid(1)
    offsets[i] = emit(heap, i)


@cuda.jit
def release(heap, offsets):
    i = cuda.grid(1)
    if i < offsets.size:
        heap.free(offsets[i])


@cuda.jit
def churn(heap, sizes, rounds, got, bad):
    """Each thread, ``rounds`` times: two blocks of sizes picked by thread
    and round, a tag at both ends of each, the tags checked, both freed.
    got[i]: the blocks thread i got; bad[i]: tags it found changed."""
    i = cuda.grid(1)
    for r in range(rounds):
        n1 = sizes[(i + r) % sizes.size]
        n2 = sizes[(i * 7 + 3 * r) % sizes.size]
        a = heap.malloc(n1)
        b = heap.malloc(n2)
        for off, n, tag in ((a, n1, i * 64 + 2 * r), (b, n2, i * 64 + 2 * r + 1)):
            if off >= 0:
                words = heap.view(off, n // 8, numba.int64)
                words[0] = tag
                words[n // 8 - 1] = tag
                got[i] += 1
        for off, n, tag in ((a, n1, i * 64 + 2 * r), (b, n2, i * 64 + 2 * r + 1)):
            if off >= 0:
                words = heap.view(off, n // 8, numba.int64)
                if words[0] != tag or words[n // 8 - 1] != tag:
                    bad[i] += 1
        heap.free(a)
        heap.free(b)


def run_fill(heap, sizes, grid):
    offsets = np.zeros(sizes.size, np.int64)
    intact = np.zeros(sizes.size, np.int64)
    fill[grid](heap, sizes, offsets, intact)
    data = heap._data
    stored = [bool(off < 0 or (data[off:off + n] == (i * 7 + np.arange(n)) % 251).all())
              for i, (off, n) in enumerate(zip(offsets.tolist(), sizes.tolist()))]
    return {"sizes": sizes.tolist(), "offsets": offsets.tolist(),
            "intact": intact.tolist(), "stored": stored, "stats": heap.stats()}


def main():
    out = {}
    pool = Pool(SimulatedDevice("64MiB"))
    rng = np.random.default_rng(11)
    heap = DeviceHeap("2MiB", pool=pool)
    sizes = rng.choice([1, 16, 17, 100, 500, 2048, 3000, 70000], 96).astype(np.int64)
    out["random"] = run_fill(heap, sizes, (3, 32))
    out["random_compact"] = heap.stats(compact=True)
    offsets = np.array(out["random"]["offsets"], np.int64)
    release[3, 32](heap, offsets)
    out["after_free"] = heap.stats()
    out["reuse"] = run_fill(heap, sizes, (3, 32))
    live = next(off for off in out["reuse"]["offsets"] if off >= 0)
    release[3, 32](heap, np.array([live, live, 12345, -1, heap.size + 16], np.int64))
    out["bad_frees"] = heap.stats()
    heap.reset()
    out["reset"] = heap.stats()
    offs = np.zeros(64, np.int64)
    floats[2, 32](heap, offs)
    out["floats"] = {"offsets": offs.tolist(),
                     "values": [float(heap._data[o + 4:o + 8].view(np.float32)[0]) for o in offs]}
    heap.close()
    out["pool_after_close"] = pool.memory_stats()["allocated_bytes.all.current"]

    small = DeviceHeap(DeviceHeap.page_size, pool=pool)    # one page: 32 blocks of 2048
    out["full"] = run_fill(small, np.full(64, 2000, np.int64), (2, 32))
    other = DeviceHeap("128KiB", pool=pool)                # several heaps at once
    out["other"] = run_fill(other, np.full(8, 40, np.int64), (1, 8))
    out["small_after_other"] = small.stats()
    # one class for every thread: whole warps share reservations and counters
    same = DeviceHeap("1MiB", pool=pool)
    out["same_class"] = run_fill(same, np.full(256, 16, np.int64), (4, 64))
    # what the pool reports of its heaps: small, other (above) and same, all live
    out["pool_view"] = {"stats": {k: v for k, v in pool.memory_stats().items()
                                  if k.startswith("device_heap.")},
                        "snapshot": pool.snapshot()["device_heaps"],
                        "summary": str(memory_summary(pool)),
                        "heaps": [small.stats(), other.stats(), same.stats()]}
    same.close()
    # a warp's group spills over pages: 8 blocks of 8 KiB a page, 4 pages
    spill = DeviceHeap(4 * DeviceHeap.page_size, pool=pool)
    out["spill"] = run_fill(spill, np.full(64, 8000, np.int64), (2, 32))
    spill.close()
    # page runs: the search starts where the last run ended, then wraps
    runs = DeviceHeap(8 * DeviceHeap.page_size, pool=pool)
    first = run_fill(runs, np.full(2, 70000, np.int64), (1, 2))     # pages 0-3
    release[1, 2](runs, np.array(first["offsets"], np.int64))
    out["runs"] = {"first": first, "again": run_fill(runs, np.full(5, 70000, np.int64), (1, 5))}
    runs.close()
    # size classes as a setting
    custom = DeviceHeap("1MiB", pool=pool, classes=(48, 96, 4000))
    out["custom"] = run_fill(custom, np.tile(np.array([1, 48, 49, 96, 97, 4000, 4001, 0],
                                                      np.int64), 8), (2, 32))
    custom.close()
    # every default class, at both ends of its range, and page runs: then all freed
    classes = layout.DEFAULT_CLASSES
    sizes = np.array([n for low, high in zip((0,) + classes, classes) for n in (low + 1, high)]
                     + [classes[-1] + 1] * 6 + [0, 3 * hk.PAGE], np.int64)
    many = DeviceHeap((len(classes) + 12) * hk.PAGE, pool=pool)
    out["many"] = run_fill(many, sizes, (4, 29))
    release[4, 29](many, np.array(out["many"]["offsets"], np.int64))
    pages = many.size // hk.PAGE
    out["many_freed"] = {"stats": many.stats(),
                         "page_words": many._meta[hk.HEADER:hk.HEADER + pages].tolist(),
                         "run_lengths": many._meta[hk.HEADER + pages:hk.HEADER + 2 * pages]
                         .tolist(),
                         "bitmaps_clear": not many._meta[hk.HEADER + 2 * pages:].any()}
    many.close()
    # the most classes a heap may have: the last one next to the page runs' states
    most = tuple(range(16, 16 * (layout.MAX_CLASSES + 1), 16))
    top = DeviceHeap((layout.MAX_CLASSES + 8) * hk.PAGE, pool=pool, classes=most)
    sizes = np.array(most + (most[-1] + 1,) * 4, np.int64)
    out["most"] = run_fill(top, sizes, (2, 34))
    release[2, 34](top, np.array(out["most"]["offsets"], np.int64))
    out["most_freed"] = top.stats()
    top.close()
    # more classes than pages, blocks freed and allocated again by four warps at
    # once: pages change class under reservations; the counters exact after
    churning = DeviceHeap(4 * hk.PAGE, pool=pool)
    sizes = np.array([16, 48, 112, 320, 768, 1024], np.int64)
    got, bad = np.zeros(128, np.int64), np.zeros(128, np.int64)
    churn[1, 128](churning, sizes, 3, got, bad)
    pages = churning.size // hk.PAGE
    out["churn"] = {"got": int(got.sum()), "bad": int(bad.sum()), "stats": churning.stats(),
                    "page_words": churning._meta[hk.HEADER:hk.HEADER + pages].tolist(),
                    "bitmaps_clear": not churning._meta[hk.HEADER + 2 * pages:].any()}
    churning.close()
    out["free_order"] = free_order(pool)
    out["group_sizes"] = dict(hk.cuda.warps.group_sizes)
    print(json.dumps(out))


@cuda.jit
def warp_blocks(heap, sizes, offsets, blocks):
    """Thread i's part of its warp's block (malloc_warp), tagged i % 251 in
    its first and last byte; blocks[i]: the block's offset on the thread
    holding it, else -1."""
    i = cuda.grid(1)
    if i < sizes.size:
        off, mine = heap.malloc_warp(sizes[i])
        offsets[i] = off
        blocks[i] = off if mine else -1
        if off >= 0 and sizes[i] > 0:
            part = heap.view(off, sizes[i], numba.uint8)
            part[0] = i % 251
            part[sizes[i] - 1] = i % 251


def live_blocks(meta, pages):
    """{offset: bytes} of the blocks a heap's bookkeeping (``meta`` on the
    host, ``pages`` pages) holds live: the set bits of size-class pages and
    the runs; each page's count is checked against its bits."""
    blocks = {}
    for p in range(pages):
        word = int(meta[layout.HEADER + p])
        state = word >> layout.STATE_SHIFT
        if 0 <= state < layout.LARGE:
            size = int(meta[layout.SIZE_BASE + state])
            first = layout.HEADER + 2 * pages + p * layout.WORDS_PER_PAGE
            words = meta[first:first + layout.WORDS_PER_PAGE].astype(np.uint32)
            taken = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
            assert word & layout.COUNT_MASK == taken.size, f"page {p}: count and bits differ"
            blocks.update({p * layout.PAGE + int(b) * size: size for b in taken})
        run = int(meta[layout.HEADER + pages + p])
        if run:
            blocks[p * layout.PAGE] = run * layout.PAGE
    return blocks


@cuda.jit
def one_block_freed(heap, size, offsets):
    offsets[0] = heap.malloc(size)
    heap.free(offsets[0])


def free_order(pool):
    """The order of a free's atomics, a small block's and a run's: [index
    of the first atomic on BYTES_IN_USE, index of the first that frees
    the block (its bit cleared, its pages' state given back)]."""
    heap = DeviceHeap(4 * hk.PAGE, pool=pool)
    atomics = type(hk.cuda).atomic
    order = {}
    for name, size in (("small", 64), ("run", 2 * hk.PAGE)):
        log = []

        def logged(kind, op):
            def call(array, index, *values):
                log.append((kind, index, values))
                return op(array, index, *values)
            return call
        saved = {k: getattr(atomics, k) for k in ("add", "and_")}
        offsets = np.zeros(1, np.int64)
        try:
            for kind, op in saved.items():
                setattr(atomics, kind, logged(kind, op))
            one_block_freed[1, 1](heap, size, offsets)
        finally:
            for kind in saved:
                delattr(atomics, kind)
        pages = heap.size // hk.PAGE
        in_use = [i for i, (kind, index, values) in enumerate(log)
                  if index == hk.BYTES_IN_USE and values[0] < 0]
        freeing = [i for i, (kind, index, values) in enumerate(log)
                   if (kind == "and_" and index >= hk.HEADER + 2 * pages)
                   or (kind == "add" and hk.HEADER <= index < hk.HEADER + pages
                       and values[0] == (hk.UNASSIGNED - hk.LARGE) * hk.STATE_UNIT)]
        order[name] = [in_use[0], freeing[0]]
    heap.close()
    return order


if __name__ == "__main__":
    simulator_threads.install()
    main()
