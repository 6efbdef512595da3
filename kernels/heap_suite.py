"""The device heap's kernel-level suite, after GPUMemManSurvey's test cases:
``numba_alloc.DeviceHeap`` against two atomic bump allocators (no free) and
CUDA's device ``malloc``/``free`` (a CuPy RawKernel; skipped, with the
reason, where CuPy is missing or under the simulator), all in one process
and one run. The bump allocators: ``bump``, one ``atomic.add`` per
allocation on one counter (the naive one: a million same-address atomics
serialize), and ``warp_bump``, the floor: one ``atomic.add`` per warp
(``numba_alloc.device.warp.aggregated_add``: the lanes' offsets from a warp
scan).

Cases (:func:`plan` lists them; each gives one record, a dict):

* ``per_thread`` / ``per_warp``: one allocation of S bytes per thread, or
  one of 32 x S bytes by lane 0 of each warp, at each thread count of the
  configuration, S from 16 B to 8 KiB; ``mixed``: one allocation per thread
  of a log-uniform size from 16 B to 8 KiB. Malloc and free kernels timed
  separately.
* ``scaling``: 16 B per thread at 1, 2, 4, ... threads.
* ``fragmentation``: mixed sizes allocated, every other one freed, half as
  many allocated again: (max end - min offset) / bytes live (requested).
* ``mixed_fill``: rounds of mixed-size allocations, never freed, until one
  fails: the live bytes (requested) then, as a fraction of the heap.
* ``oom``: rounds of N threads x S bytes, never freed, until malloc returns
  -1: the rounds and the bytes reached, against the heap's size.
* ``emission``: each thread emits a data-dependent number of particles
  (0 to ``most``, 16 bytes each) into heap memory, one ``heap.malloc`` per
  thread and one ``heap.malloc_warp`` per warp, against the count, scan,
  allocate and write version; totals and checksums compared.

Times are milliseconds of GPU work between two CUDA events on the default
stream (the median over the repetitions, after one warm-up run that also
compiles), queued behind a busy kernel so that the host's launch overhead
(Numba's, CuPy's) is not timed, only what the GPU does (the count, scan,
allocate version's host read of its total is part of its work); under the
CUDA simulator nothing is timed (``None``). Every case
checks itself cheaply: no failure where the heap had room, live offsets
16-byte aligned, inside the heap and disjoint, a tag written into the first
and last 4 bytes of each allocation read back intact, and the heap's
counters consistent (``check``: 'passed' or 'failed: ...').
"""

import functools
import math
import statistics

import numba
import numpy as np
from numba import cuda

from numba_alloc import DeviceHeap
from numba_alloc.device.warp import aggregated_add

SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)
WARP = 32
ALIGN = 16
SIZES = tuple(16 << k for k in range(10))           # 16 B ... 8 KiB
SMALLEST_MIXED, LARGEST_MIXED = 16, 8192
PARTICLE_WORDS = 4                                  # uint32 per particle: 16 bytes
SCAN_BLOCK = 64 if SIMULATOR else 256               # threads of a scan block
# the per-thread sizes the goals are stated at (numba_alloc.cli.bench.heap.TARGETS):
# their cases of up to QUICK_GOAL_BYTES run first (fewest bytes first), so
# that a run cut at its time limit has them (on an H100, CUDA's device malloc
# took 1.4 ms for 10^4 x 16 B, and the 10^6 x 1 KiB case did not end within
# the 100 s its run had left)
GOAL_SIZES = (16, 1024)
QUICK_GOAL_BYTES = 64 << 20
# above this many page-run allocations (requests over the largest size class)
# in one launch, the heap is not run: its large path scans pages linearly
LARGE_LIMIT = 1 << 15

# full: a GPU run; tiny: the CUDA simulator (correctness only)
CONFIGS = {
    "full": {"threads": (10**4, 10**6), "sizes": SIZES,
             "scaling": tuple(1 << k for k in range(21)), "mixed_threads": 10**5,
             "fill_round": 10**3, "fill_heap": 256 << 20, "oom_threads": 10**5,
             "oom_size": 1024, "oom_heap": 1 << 30, "emit_threads": 10**6, "emit_most": 16,
             "block": 256},
    "tiny": {"threads": (64,), "sizes": (16, 1024, 4096), "scaling": (1, 4, 16, 64),
             "mixed_threads": 64, "fill_round": 16, "fill_heap": 32 << 16, "oom_threads": 64,
             "oom_size": 1024, "oom_heap": 4 << 16, "emit_threads": 64, "emit_most": 6,
             "block": 32},
}


# -- kernels: numba_alloc's heap -------------------------------------------------------

@cuda.jit
def heap_alloc(heap, sizes, group, offsets):
    """Thread i, where i % group == 0, allocates sizes[i // group] bytes
    into offsets[i // group] (-1: failed)."""
    i = cuda.grid(1)
    k = i // group
    if i % group == 0 and k < sizes.size:
        offsets[k] = heap.malloc(sizes[k])


@cuda.jit
def heap_release(heap, group, offsets):
    """Thread i, where i % group == 0, frees offsets[i // group]."""
    i = cuda.grid(1)
    k = i // group
    if i % group == 0 and k < offsets.size:
        heap.free(offsets[k])


@cuda.jit
def heap_tags(heap, sizes, offsets, write, bad):
    """Allocation k (thread k): with ``write``, put its tag in its first and
    last 4 bytes; else count in bad[0] the allocations whose tags changed."""
    k = cuda.grid(1)
    if k < offsets.size and offsets[k] >= 0:
        words = heap.view(offsets[k], sizes[k] // 4, numba.uint32)
        tag = (k * 2654435761 + sizes[k]) & 0xFFFFFFFF
        last = words.size - 1
        if write:
            words[0] = tag
            words[last] = tag ^ 0xFFFFFFFF
        elif words[0] != tag or words[last] != tag ^ 0xFFFFFFFF:
            cuda.atomic.add(bad, 0, 1)


# -- kernels: the atomic bump allocators ------------------------------------------------

@cuda.jit
def bump_alloc(counter, capacity, sizes, group, offsets):
    """As :func:`heap_alloc`, by one ``atomic.add`` on counter[0] of the
    size rounded up to 16 bytes; -1 past ``capacity`` bytes. No free."""
    i = cuda.grid(1)
    k = i // group
    if i % group == 0 and k < sizes.size:
        n = (sizes[k] + 15) // 16 * 16
        off = cuda.atomic.add(counter, 0, n)
        offsets[k] = off if off + n <= capacity else -1


@cuda.jit
def bump_warp_alloc(counter, capacity, sizes, group, offsets):
    """As :func:`bump_alloc`, with one ``atomic.add`` per warp: the lanes
    that allocate together add their sizes' sum once (``aggregated_add``)."""
    i = cuda.grid(1)
    k = i // group
    if i % group == 0 and k < sizes.size:
        n = (sizes[k] + 15) // 16 * 16
        off = aggregated_add(counter, 0, n)
        offsets[k] = off if off + n <= capacity else -1


# -- kernels: particle emission ----------------------------------------------------------

@cuda.jit(device=True)
def emitted(i, most):
    """How many particles thread i emits: 0 to ``most``, from a hash of i."""
    return ((i * 2654435761) % 4294967296 >> 13) % (most + 1)


@cuda.jit(device=True)
def particle_word(i, j):
    """Word j of thread i's particles."""
    return (i * 40503 + j * 977 + 12345) & 0xFFFFFF


@cuda.jit
def emit_heap(heap, most, offsets, counts):
    """Thread i allocates its particles on the heap and writes them; its
    offset (-1: none or failed) and count go to offsets[i], counts[i]."""
    i = cuda.grid(1)
    if i < offsets.size:
        c = emitted(i, most)
        off = -1
        if c > 0:
            off = heap.malloc(c * PARTICLE_WORDS * 4)
            if off >= 0:
                words = heap.view(off, c * PARTICLE_WORDS, numba.uint32)
                for j in range(c * PARTICLE_WORDS):
                    words[j] = particle_word(i, j)
        offsets[i] = off
        counts[i] = c


@cuda.jit
def emit_heap_warp(heap, most, offsets, counts, blocks):
    """As :func:`emit_heap`, with one ``heap.malloc_warp`` for the warp (its
    lanes' particles laid out one after another); blocks[i]: the offset to
    free if thread i holds its warp's block, else -1."""
    i = cuda.grid(1)
    if i < offsets.size:
        c = emitted(i, most)
        off, mine = heap.malloc_warp(c * PARTICLE_WORDS * 4)
        if off >= 0 and c > 0:
            words = heap.view(off, c * PARTICLE_WORDS, numba.uint32)
            for j in range(c * PARTICLE_WORDS):
                words[j] = particle_word(i, j)
        offsets[i] = off if c > 0 else -1
        counts[i] = c
        blocks[i] = off if mine else -1


@cuda.jit
def sum_heap(heap, offsets, counts, out):
    """out[0] += every particle word, out[1] += particles (only those stored)."""
    i = cuda.grid(1)
    if i < offsets.size and offsets[i] >= 0:
        words = heap.view(offsets[i], counts[i] * PARTICLE_WORDS, numba.uint32)
        s = numba.uint64(0)
        for j in range(words.size):
            s += words[j]
        cuda.atomic.add(out, 0, s)
        cuda.atomic.add(out, 1, numba.uint64(counts[i]))


@cuda.jit
def count_particles(most, counts):
    """Pass one: counts[i] = thread i's particles."""
    i = cuda.grid(1)
    if i < counts.size:
        counts[i] = emitted(i, most)


@cuda.jit
def emit_flat(most, starts, words):
    """Pass two: thread i writes its particles from particle starts[i] of ``words``."""
    i = cuda.grid(1)
    if i < starts.size:
        base = starts[i] * PARTICLE_WORDS
        for j in range(emitted(i, most) * PARTICLE_WORDS):
            words[base + j] = particle_word(i, j)


@cuda.jit
def sum_flat(starts, counts, words, out):
    """As :func:`sum_heap`, over the two-pass version's one array."""
    i = cuda.grid(1)
    if i < starts.size:
        s = numba.uint64(0)
        base = starts[i] * PARTICLE_WORDS
        for j in range(counts[i] * PARTICLE_WORDS):
            s += words[base + j]
        cuda.atomic.add(out, 0, s)
        cuda.atomic.add(out, 1, numba.uint64(counts[i]))


@cuda.jit
def scan_blocks(values, out, sums):
    """Exclusive prefix sums of each SCAN_BLOCK-long block of ``values``
    into ``out``; each block's total into sums[block]."""
    shared = cuda.shared.array(SCAN_BLOCK, numba.int64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    x = values[i] if i < values.size else 0
    shared[t] = x
    cuda.syncthreads()
    d = 1
    while d < SCAN_BLOCK:
        y = shared[t - d] if t >= d else 0
        cuda.syncthreads()
        shared[t] += y
        cuda.syncthreads()
        d *= 2
    if i < values.size:
        out[i] = shared[t] - x
    if t == SCAN_BLOCK - 1:
        sums[cuda.blockIdx.x] = shared[t]


@cuda.jit
def add_block_sums(out, offsets):
    """out[i] += offsets[its block]."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] += offsets[cuda.blockIdx.x]


def exclusive_scan(values):
    """A new device array of the exclusive prefix sums of ``values`` (a
    device int64 array), by :func:`scan_blocks`, recursively."""
    blocks = -(-values.size // SCAN_BLOCK)
    out = cuda.device_array(values.size, np.int64)
    sums = cuda.device_array(blocks, np.int64)
    scan_blocks[blocks, SCAN_BLOCK](values, out, sums)
    if blocks > 1:
        add_block_sums[blocks, SCAN_BLOCK](out, exclusive_scan(sums))
    return out


# -- CUDA's device malloc: a CuPy RawKernel ----------------------------------------------

CUDA_MALLOC_SOURCE = r"""
extern "C" __global__ void device_malloc(const long long* sizes, long long n, int group,
                                         unsigned long long* ptrs) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i % group == 0 && i / group < n)
        ptrs[i / group] = (unsigned long long)malloc((size_t)sizes[i / group]);
}
extern "C" __global__ void device_free(long long n, int group, unsigned long long* ptrs) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i % group == 0 && i / group < n)
        free((void*)ptrs[i / group]);
}
"""


class CudaMalloc:
    """CUDA's device malloc and free through CuPy, with its heap (the
    ``cudaLimitMallocHeapSize``) set to ``limit`` bytes before its first
    launch, as CUDA requires; ``skipped`` says why it cannot run, if so."""

    def __init__(self, limit):
        self.skipped, self.limit = None, limit
        if SIMULATOR:
            self.skipped = "n/a (needs a GPU)"
            return
        try:
            import cupy
        except ImportError:
            self.skipped = "skipped: CuPy is not installed"
            return
        self.cupy = cupy
        cupy.cuda.runtime.deviceSetLimit(cupy.cuda.runtime.cudaLimitMallocHeapSize, limit)
        module = cupy.RawModule(code=CUDA_MALLOC_SOURCE)
        self.malloc_kernel = module.get_function("device_malloc")
        self.free_kernel = module.get_function("device_free")

    def arrays(self, sizes):
        """``sizes`` on the device and a zeroed uint64 array for the pointers (CuPy)."""
        return self.cupy.asarray(sizes), self.cupy.zeros(sizes.size, self.cupy.uint64)

    def malloc(self, sizes, ptrs, group, threads, block):
        """Launch the malloc kernel: thread i, where i % group == 0, puts a
        pointer to sizes[i // group] bytes (NULL: failed) in ptrs[i // group]."""
        self.malloc_kernel((-(-threads // block),), (block,),
                           (sizes, np.int64(sizes.size), np.int32(group), ptrs))

    def free(self, ptrs, group, threads, block):
        """Launch the free kernel over ``ptrs`` (NULL is ignored)."""
        self.free_kernel((-(-threads // block),), (block,),
                         (np.int64(ptrs.size), np.int32(group), ptrs))


# -- measuring -----------------------------------------------------------------------------

# dependent 64-bit multiply-adds of the busy kernel ahead of each timed launch:
# milliseconds on a GPU (not measured yet), where queuing the events and a
# Numba launch takes the host about 0.1 ms
HEAD_START_ROUNDS = 1 << 19


@cuda.jit
def busy(rounds, out):
    """Keeps the GPU busy for ``rounds`` dependent multiply-adds (one thread)."""
    x = numba.uint64(cuda.grid(1) + 1)
    for _ in range(rounds):
        x = x * numba.uint64(6364136223846793005) + numba.uint64(1442695040888963407)
    out[0] = x


@functools.lru_cache(maxsize=None)
def busy_output():
    """Where :func:`busy` writes its result (one array for the run)."""
    return cuda.device_array(1, np.uint64)


def timed(launch):
    """(milliseconds of the GPU work ``launch()`` queues on the default
    stream, by CUDA events, or None under the simulator; what it returned).
    The events and the work are queued behind :func:`busy`, so the host's
    time to launch is not counted unless the work itself waits for the host."""
    if SIMULATOR:
        return None, launch()
    start, end = cuda.event(), cuda.event()
    busy[1, 1](HEAD_START_ROUNDS, busy_output())
    start.record()
    result = launch()
    end.record()
    end.synchronize()
    return cuda.event_elapsed_time(start, end), result


def median(times):
    """The median of ``times`` (ms), or None when nothing was timed."""
    times = [t for t in times if t is not None]
    return statistics.median(times) if times else None


def heap_block(nbytes):
    """Bytes the heap hands out for ``nbytes``: the smallest size class
    that holds it, else whole pages."""
    for size in DeviceHeap.default_classes:
        if nbytes <= size:
            return size
    return -(-nbytes // DeviceHeap.page_size) * DeviceHeap.page_size


def heap_size_for(sizes):
    """A heap size with room for allocations of ``sizes`` at once: their
    blocks, with a quarter more and a page per size class for pages
    shared between classes."""
    values, counts = np.unique(sizes, return_counts=True)
    blocks = sum(heap_block(int(v)) * int(c) for v, c in zip(values, counts))
    pages = len(DeviceHeap.default_classes) + 1
    return blocks + blocks // 4 + pages * DeviceHeap.page_size


def offset_problems(offsets, sizes, capacity, room):
    """What is wrong with one allocate phase's offsets (-1: failed) of
    ``sizes``: failures although ``room`` was promised, offsets not 16-byte
    aligned, outside [0, capacity) (capacity None: not checked), or live
    allocations overlapping. An empty list when nothing is."""
    problems = []
    live = offsets >= 0
    failed = int((~live).sum())
    if room and failed:
        problems.append(f"{failed} failed although there was room")
    off, size = offsets[live], sizes[live]
    if (off % ALIGN).any():
        problems.append(f"{int((off % ALIGN != 0).sum())} not {ALIGN}-byte aligned")
    if capacity is not None and (off + size > capacity).any():
        problems.append(f"{int((off + size > capacity).sum())} past the end")
    order = np.argsort(off, kind="stable")
    off, size = off[order], size[order]
    overlapping = int((off[:-1] + size[:-1] > off[1:]).sum())
    if overlapping:
        problems.append(f"{overlapping} overlapping")
    return problems


def verdict(problems):
    return "passed" if not problems else "failed: " + "; ".join(problems)


def mixed_sizes(count, seed):
    """``count`` sizes, log-uniform from 16 B to 8 KiB, multiples of 16 (int64)."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(math.log(SMALLEST_MIXED), math.log(LARGEST_MIXED), count))
    return (np.ceil(sizes / ALIGN) * ALIGN).astype(np.int64)


def address_range(offsets, sizes):
    """(max end - min offset) of the live allocations, in bytes."""
    live = offsets >= 0
    if not live.any():
        return 0
    return int((offsets[live] + sizes[live]).max() - offsets[live].min())


class Suite:
    """The cases at one configuration (a :data:`CONFIGS` entry), each timed
    ``repeat`` times after a warm-up run. ``pool``: where the heaps come
    from (None: the current GPU's pool; a Pool over a SimulatedDevice under
    the simulator). ``budget``: the most bytes one allocator may use at once
    (a case needing more is skipped, saying so)."""

    def __init__(self, config, repeat, pool, budget):
        self.config, self.repeat, self.pool, self.budget = config, repeat, pool, budget
        self.block = config["block"]
        self.cuda_malloc = CudaMalloc(min(budget, self._cuda_malloc_need()))

    def _cuda_malloc_need(self):
        """The device malloc heap for the largest per-thread or per-warp
        case: twice its bytes, for the allocator's own overhead."""
        largest = max(self.config["threads"]) * max(self.config["sizes"])
        return 2 * largest + (64 << 20)

    def _grid(self, threads):
        return -(-threads // self.block), self.block

    def _runs(self):
        return 1 if SIMULATOR else self.repeat + 1      # the first one warms up

    # -- one allocator in one allocate/free case -----------------------------------------
    def ours(self, sizes, group, threads):
        """Our heap: malloc and free timed, offsets, tags and counters checked."""
        large = int((sizes > DeviceHeap.default_classes[-1]).sum())
        size = heap_size_for(sizes)
        if size > self.budget:
            return {"skipped": f"skipped: needs a {size / 2**30:.1f} GiB heap (budget "
                               f"{self.budget / 2**30:.1f} GiB)"}
        if large > LARGE_LIMIT:
            return {"skipped": f"skipped: {large} page-run allocations in one launch (more "
                               f"than {LARGE_LIMIT})"}
        grid = self._grid(threads)
        d_sizes = cuda.to_device(sizes)
        offsets = cuda.device_array(sizes.size, np.int64)
        malloc_ms, free_ms = [], []
        with DeviceHeap(size, pool=self.pool) as heap:
            for run in range(self._runs()):
                heap.reset()
                ms, _ = timed(lambda: heap_alloc[grid](heap, d_sizes, group, offsets))
                malloc_ms.append(ms)
                if run == self._runs() - 1:
                    host = offsets.copy_to_host()
                    problems = offset_problems(host, sizes, heap.size, room=True)
                    problems += self._tags(heap, d_sizes, offsets)
                    stats = heap.stats(wait=True)
                ms, _ = timed(lambda: heap_release[grid](heap, group, offsets))
                free_ms.append(ms)
            after = heap.stats(wait=True)
        granted = int((host >= 0).sum())
        if stats["num_allocs"] != granted or stats["num_failed"] != sizes.size - granted:
            problems.append(f"counters: {stats['num_allocs']} allocations and "
                            f"{stats['num_failed']} failures counted, {granted} granted")
        if after["bytes_in_use"] != 0 or after["num_frees"] != granted:
            problems.append(f"after free: {after['bytes_in_use']} bytes in use, "
                            f"{after['num_frees']} frees of {granted}")
        return {"malloc_ms": median(malloc_ms[1:] or malloc_ms),
                "free_ms": median(free_ms[1:] or free_ms), "failed": sizes.size - granted,
                "heap_size": heap.size, "check": verdict(problems), "stats": stats}

    def _tags(self, heap, d_sizes, offsets):
        """Write every live allocation's tags, then read them back: problems."""
        bad = cuda.to_device(np.zeros(1, np.int64))
        grid = self._grid(offsets.size)
        heap_tags[grid](heap, d_sizes, offsets, 1, bad)
        heap_tags[grid](heap, d_sizes, offsets, 0, bad)
        changed = int(bad.copy_to_host()[0])
        return [f"{changed} allocations' tags overwritten"] if changed else []

    def bump(self, sizes, group, threads, capacity=None, kernel=bump_alloc):
        """An atomic bump allocator (``kernel``: :func:`bump_alloc`, one
        atomic per allocation, or :func:`bump_warp_alloc`, one per warp) over
        ``capacity`` bytes (default: room for every allocation): malloc
        timed, offsets checked."""
        rounded = (sizes + ALIGN - 1) // ALIGN * ALIGN
        room = capacity is None
        capacity = int(rounded.sum()) if room else capacity
        grid = self._grid(threads)
        d_sizes = cuda.to_device(sizes)
        counter = cuda.device_array(1, np.int64)
        offsets = cuda.device_array(sizes.size, np.int64)
        times = []
        for _ in range(self._runs()):
            counter.copy_to_device(np.zeros(1, np.int64))
            ms, _ = timed(lambda: kernel[grid](counter, capacity, d_sizes, group, offsets))
            times.append(ms)
        host = offsets.copy_to_host()
        return {"malloc_ms": median(times[1:] or times), "failed": int((host < 0).sum()),
                "check": verdict(offset_problems(host, rounded, capacity, room)),
                "offsets": host}

    def device_malloc(self, sizes, group, threads):
        """CUDA's malloc and free: both timed; pointers checked (NULLs are
        reported as failures, not as a failed check: its heap's overhead
        is CUDA's)."""
        if self.cuda_malloc.skipped:
            return {"skipped": self.cuda_malloc.skipped}
        if 2 * int(sizes.sum()) > self.cuda_malloc.limit:
            return {"skipped": f"skipped: more than half of its {self.cuda_malloc.limit} "
                               "byte heap"}
        cm, malloc_ms, free_ms = self.cuda_malloc, [], []
        d_sizes, ptrs = cm.arrays(sizes)
        for run in range(self._runs()):
            ms, _ = timed(lambda: cm.malloc(d_sizes, ptrs, group, threads, self.block))
            malloc_ms.append(ms)
            host = ptrs.get().astype(np.int64)
            host[host == 0] = -1
            ms, _ = timed(lambda: cm.free(ptrs, group, threads, self.block))
            free_ms.append(ms)
        return {"malloc_ms": median(malloc_ms[1:]), "free_ms": median(free_ms[1:]),
                "failed": int((host < 0).sum()),
                "check": verdict(offset_problems(host, sizes, None, room=False)),
                "offsets": host}

    # -- the cases --------------------------------------------------------------------
    def allocate_free(self, case, threads, sizes, group, size=None):
        """One allocate/free case under the four allocators, with ratios."""
        allocators = {"numba_alloc": self.ours(sizes, group, threads),
                      "bump": self.bump(sizes, group, threads),
                      "warp_bump": self.bump(sizes, group, threads, kernel=bump_warp_alloc),
                      "cuda_malloc": self.device_malloc(sizes, group, threads)}
        for figures in allocators.values():
            figures.pop("offsets", None)
        return {"case": case, "threads": threads, "size": size, "allocations": int(sizes.size),
                "bytes": int(sizes.sum()), "allocators": allocators,
                "ratios": ratios(allocators)}

    def fragmentation(self):
        """Mixed sizes allocated, every other one freed, half as many
        allocated again: address range over live bytes, per allocator."""
        n = self.config["mixed_threads"]
        first, second = mixed_sizes(n, 1), mixed_sizes(n // 2, 2)
        grid1, grid2 = self._grid(n), self._grid(n // 2)
        out = {}
        size = heap_size_for(np.concatenate([first, second]))
        with DeviceHeap(size, pool=self.pool) as heap:
            a, b = cuda.device_array(n, np.int64), cuda.device_array(n // 2, np.int64)
            heap_alloc[grid1](heap, cuda.to_device(first), 1, a)
            odd = a.copy_to_host()
            odd[0::2] = -1                          # the even ones stay
            heap_release[grid1](heap, 1, cuda.to_device(odd))
            heap_alloc[grid2](heap, cuda.to_device(second), 1, b)
            a_host, b_host = a.copy_to_host(), b.copy_to_host()
            failed = int((a_host < 0).sum() + (b_host < 0).sum())
            offsets = np.concatenate([np.where(odd >= 0, -1, a_host), b_host])
            out["numba_alloc"] = self._range_figures(offsets, np.concatenate([first, second]),
                                                     failed, heap.size, heap.stats(wait=True))
        # the bump allocator cannot reuse: its range covers both phases
        both = np.concatenate([first, second])
        bump = self.bump(both, 1, both.size)
        offsets = bump["offsets"]
        offsets[1:first.size:2] = -1               # freed (in vain)
        rounded = (both + ALIGN - 1) // ALIGN * ALIGN
        out["bump"] = self._range_figures(offsets, rounded, bump["failed"], None, None)
        out["cuda_malloc"] = self._device_fragmentation(first, second)
        return {"case": "fragmentation", "threads": n, "size": None,
                "allocations": int(first.size + second.size), "allocators": out, "ratios": {}}

    def _range_figures(self, offsets, sizes, failed, capacity, stats):
        """Fragmentation figures of the live ``offsets`` (-1: freed or
        failed); ``failed`` allocations failed, which is a problem where
        ``capacity`` (the heap's) is given: the heap was sized with room."""
        live = offsets >= 0
        live_bytes = int(sizes[live].sum())
        problems = offset_problems(offsets, sizes, capacity, room=False)
        if failed and capacity is not None:
            problems.append(f"{failed} failed although there was room")
        figures = {"live_bytes": live_bytes, "range_bytes": address_range(offsets, sizes),
                   "failed": failed, "check": verdict(problems)}
        figures["fragmentation"] = figures["range_bytes"] / live_bytes if live_bytes else None
        if stats is not None:
            figures["stats"] = stats
        return figures

    def _device_fragmentation(self, first, second):
        cm = self.cuda_malloc
        if cm.skipped:
            return {"skipped": cm.skipped}
        d_first, a = cm.arrays(first)
        cm.malloc(d_first, a, 1, first.size, self.block)
        a_host = a.get().astype(np.int64)
        freed = a.copy()
        freed[0::2] = 0
        cm.free(freed, 1, first.size, self.block)
        d_second, b = cm.arrays(second)
        cm.malloc(d_second, b, 1, second.size, self.block)
        b_host = b.get().astype(np.int64)
        failed = int((a_host == 0).sum() + (b_host == 0).sum())
        offsets = np.concatenate([np.where(np.arange(first.size) % 2 == 0, a_host, 0), b_host])
        offsets[offsets == 0] = -1
        figures = self._range_figures(offsets, np.concatenate([first, second]), failed, None,
                                      None)
        a[1::2] = 0
        cm.free(a, 1, first.size, self.block)
        cm.free(b, 1, second.size, self.block)
        return figures

    def mixed_fill(self):
        """Rounds of mixed-size allocations into a heap, never freed, until
        one fails: live (requested) bytes when it did, against the heap."""
        heap_bytes, n = self.config["fill_heap"], self.config["fill_round"]
        grid = self._grid(n)
        rounds, live, first_failure, early, problems = 0, 0, None, [], []
        most = heap_bytes // (n * ALIGN) + 2       # by then every request has failed
        with DeviceHeap(heap_bytes, pool=self.pool) as heap:
            offsets = cuda.device_array(n, np.int64)
            while first_failure is None and rounds < most:
                sizes = mixed_sizes(n, 100 + rounds)
                heap_alloc[grid](heap, cuda.to_device(sizes), 1, offsets)
                host = offsets.copy_to_host()
                rounds += 1
                ok = host >= 0
                if not ok.all():
                    first_failure = {"round": rounds, "live_before": live,
                                     "requested": int(sizes.sum())}
                    if live + int(sizes.sum()) <= 0.9 * heap.size:
                        early.append(rounds)
                problems += offset_problems(host, sizes, heap.size, room=False)
                live += int(sizes[ok].sum())
            stats = heap.stats(wait=True)
        if stats["num_allocs"] + stats["num_failed"] != rounds * n:
            problems.append("counters do not add up to the requests")
        if first_failure is None:
            problems.append(f"no allocation failed in {rounds} rounds")
        before = first_failure["live_before"] if first_failure else live
        figures = {"rounds": rounds, "heap_size": heap.size, "live_bytes": live,
                   "live_fraction": live / heap.size, "live_fraction_before": before / heap.size,
                   "granted_fraction": stats["bytes_in_use"] / heap.size,
                   "first_failure": first_failure, "failed_below_90": bool(early),
                   "check": verdict(problems), "stats": stats}
        return {"case": "mixed_fill", "threads": n, "size": None, "allocations": rounds * n,
                "allocators": {"numba_alloc": figures}, "ratios": {}}

    def oom(self):
        """Rounds of N x S bytes, never freed, until a malloc fails; the
        round reached and ``expected_rounds`` (the heap's whole rounds + 1)."""
        n, size = self.config["oom_threads"], self.config["oom_size"]
        sizes = np.full(n, size, np.int64)
        d_sizes, grid = cuda.to_device(sizes), self._grid(n)
        with DeviceHeap(self.config["oom_heap"], pool=self.pool) as heap:
            expected = heap.size // (n * heap_block(size)) + 1
            offsets = cuda.device_array(n, np.int64)
            rounds, failed, problems = 0, 0, []
            while failed == 0 and rounds < 2 * expected:
                heap_alloc[grid](heap, d_sizes, 1, offsets)
                host = offsets.copy_to_host()
                rounds += 1
                failed = int((host < 0).sum())
                problems += offset_problems(host, sizes, heap.size, room=False)
            stats = heap.stats(wait=True)
        ours = {"rounds": rounds, "expected_rounds": expected, "failed": failed,
                "bytes_reached": stats["bytes_in_use"], "heap_size": heap.size,
                "fraction_reached": stats["bytes_in_use"] / heap.size,
                "check": verdict(problems), "stats": stats}
        counter, rounds, failed = cuda.to_device(np.zeros(1, np.int64)), 0, 0
        offsets = cuda.device_array(n, np.int64)
        while failed == 0 and rounds < 2 * expected:
            bump_alloc[grid](counter, heap.size, d_sizes, 1, offsets)
            rounds += 1
            failed = int((offsets.copy_to_host() < 0).sum())
        bump = {"rounds": rounds, "expected_rounds": expected, "failed": failed,
                "bytes_reached": (rounds * n - failed) * size, "heap_size": heap.size,
                "check": "passed" if rounds == expected else f"failed: {rounds} rounds"}
        return {"case": "oom", "threads": n, "size": size, "allocations": rounds * n,
                "allocators": {"numba_alloc": ours, "bump": bump,
                               "cuda_malloc": {"skipped": "not measured: its heap is sized "
                                                          "once, for the other cases"}},
                "ratios": {}}

    def emission(self):
        """Particle emission on the heap, one ``malloc`` per thread and one
        ``malloc_warp`` per warp, against count, scan, allocate and write:
        all timed (the latter with its host read of the total) and their
        totals and checksums compared."""
        n, most = self.config["emit_threads"], self.config["emit_most"]
        grid = self._grid(n)
        expected = int(host_emitted(np.arange(n, dtype=np.int64), most).sum())
        two_times = []
        for _ in range(self._runs()):
            ms, (starts, words, counts) = timed(lambda: two_pass(n, most, grid))
            two_times.append(ms)
        sums = cuda.to_device(np.zeros(2, np.uint64))
        sum_flat[grid](starts, counts, words, sums)
        flat_sums = sums.copy_to_host()
        problems = []
        if int(flat_sums[1]) != expected:
            problems.append(f"particles: {int(flat_sums[1])}, expected {expected}")
        flat = {"malloc_ms": median(two_times[1:] or two_times), "particles": int(flat_sums[1]),
                "checksum": int(flat_sums[0]), "check": verdict(problems)}
        ours = {name: self._emit_on_heap(per_warp, expected, flat["checksum"])
                for name, per_warp in (("numba_alloc", False), ("numba_alloc_warp", True))}
        return {"case": "emission", "threads": n, "size": PARTICLE_WORDS * 4,
                "allocations": n, "allocators": {**ours, "two_pass": flat},
                "ratios": {"two_pass_over_ours": ratio(flat["malloc_ms"],
                                                       ours["numba_alloc"]["malloc_ms"]),
                           "two_pass_over_warp": ratio(flat["malloc_ms"],
                                                       ours["numba_alloc_warp"]["malloc_ms"])}}

    def _emit_on_heap(self, per_warp, expected, checksum):
        """Emission into a heap (reset before each run) by :func:`emit_heap`
        or, ``per_warp``, :func:`emit_heap_warp`; its figures, checked
        against the ``expected`` particles and the two-pass ``checksum``."""
        n, most = self.config["emit_threads"], self.config["emit_most"]
        grid = self._grid(n)
        size = heap_size_for(np.full(n, most * PARTICLE_WORDS * 4, np.int64))
        offsets, counts = cuda.device_array(n, np.int64), cuda.device_array(n, np.int64)
        blocks = cuda.device_array(n, np.int64)
        with DeviceHeap(size, pool=self.pool) as heap:
            times = []
            for _ in range(self._runs()):
                heap.reset()
                if per_warp:
                    ms, _ = timed(lambda: emit_heap_warp[grid](heap, most, offsets, counts,
                                                               blocks))
                else:
                    ms, _ = timed(lambda: emit_heap[grid](heap, most, offsets, counts))
                times.append(ms)
            sums = cuda.to_device(np.zeros(2, np.uint64))
            sum_heap[grid](heap, offsets, counts, sums)
            heap_sums = sums.copy_to_host()
            failed = int((offsets.copy_to_host()[counts.copy_to_host() > 0] < 0).sum())
            allocations = int((blocks.copy_to_host() >= 0).sum()) if per_warp else \
                int((offsets.copy_to_host() >= 0).sum())
            free_ms, _ = timed(lambda: heap_release[grid](heap, 1, blocks if per_warp
                                                          else offsets))
            stats = heap.stats(wait=True)
        problems = []
        if failed:
            problems.append(f"{failed} emissions failed although there was room")
        if int(heap_sums[1]) != expected:
            problems.append(f"particles: {int(heap_sums[1])}, expected {expected}")
        if int(heap_sums[0]) != checksum:
            problems.append(f"checksum {int(heap_sums[0])}, the two-pass version's {checksum}")
        if not stats["num_allocs"] == stats["num_frees"] == allocations:
            problems.append(f"counters: {stats['num_allocs']} allocations and "
                            f"{stats['num_frees']} frees counted, {allocations} made")
        return {"malloc_ms": median(times[1:] or times), "free_ms": free_ms,
                "particles": int(heap_sums[1]), "checksum": int(heap_sums[0]),
                "allocations": allocations, "failed": failed, "check": verdict(problems),
                "stats": stats}


def host_emitted(i, most):
    """:func:`emitted` on the host, for an int64 array."""
    return ((i * 2654435761) % 4294967296 >> 13) % (most + 1)


def two_pass(n, most, grid):
    """What Numba users write today: count, exclusive scan, read the total,
    allocate one array, write. (starts, the words, counts)."""
    counts = cuda.device_array(n, np.int64)
    count_particles[grid](most, counts)
    starts = exclusive_scan(counts)
    total = int(starts[n - 1]) + int(counts[n - 1])
    words = cuda.device_array(max(total, 1) * PARTICLE_WORDS, np.uint32)
    emit_flat[grid](most, starts, words)
    return starts, words, counts


def ratio(numerator, denominator):
    """numerator / denominator, or None where either is missing or zero."""
    if not numerator or not denominator:
        return None
    return numerator / denominator


def ratios(allocators):
    """``cuda_over_ours`` (how many times faster our malloc is than CUDA's),
    ``cuda_free_over_ours`` (the same for free), ``ours_over_bump`` (our
    malloc's time as a multiple of the bump floor's: one atomic per warp)
    and ``ours_over_thread_bump`` (of the bump with one atomic per
    allocation), from one run."""
    ours, bump, floor, cm = (allocators[k]
                             for k in ("numba_alloc", "bump", "warp_bump", "cuda_malloc"))
    return {"cuda_over_ours": ratio(cm.get("malloc_ms"), ours.get("malloc_ms")),
            "cuda_free_over_ours": ratio(cm.get("free_ms"), ours.get("free_ms")),
            "ours_over_bump": ratio(ours.get("malloc_ms"), floor.get("malloc_ms")),
            "ours_over_thread_bump": ratio(ours.get("malloc_ms"), bump.get("malloc_ms"))}


def plan(suite):
    """[(case label, a function returning its record)] of every case of
    ``suite`` (a :class:`Suite`), in order: those the goals need first
    (per-thread at GOAL_SIZES up to QUICK_GOAL_BYTES, emission, mixed fill)."""
    config = suite.config

    def allocate_free(case, group, keys):
        cases = []
        for threads, size in keys:
            sizes = np.full(-(-threads // group), size * group, np.int64)
            cases.append((f"{case} {threads} x {size} B", functools.partial(
                suite.allocate_free, case, threads, sizes, group, size)))
        return cases

    every = [(threads, size) for threads in config["threads"] for size in config["sizes"]]
    quick = sorted((k for k in every if k[1] in GOAL_SIZES and k[0] * k[1] <= QUICK_GOAL_BYTES),
                   key=lambda k: k[0] * k[1])
    return (allocate_free("per_thread", 1, quick)
            + [("emission", suite.emission), ("mixed_fill", suite.mixed_fill)]
            + allocate_free("per_thread", 1, [k for k in every if k not in quick])
            + [("oom", suite.oom), ("fragmentation", suite.fragmentation)]
            + allocate_free("per_warp", WARP, every)
            + [(f"mixed {threads}", functools.partial(
                suite.allocate_free, "mixed", threads, mixed_sizes(threads, 0), 1))
               for threads in config["threads"]]
            + [(f"scaling {threads}", functools.partial(
                suite.allocate_free, "scaling", threads, np.full(threads, 16, np.int64), 1, 16))
               for threads in config["scaling"]])
