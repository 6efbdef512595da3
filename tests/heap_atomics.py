"""Global atomics per malloc and per free of the device heap, counted under
the CUDA simulator (the same source as on a GPU; run by test_heap_atomics.py
in a subprocess with NUMBA_ENABLE_CUDASIM=1); prints one JSON object.

Every atomic the heap's device functions make goes through ``hk.cuda.atomic``,
here a counting wrapper; a kernel's count over the lanes that called
malloc (or free) is the figure (per warp for malloc_warp). The simulator's lanes of a warp form one
group when they reach ``activemask()`` together: the window they get is
widened so that a busy machine does not split a warp."""

import json
import math

import numpy as np
from numba import cuda

from numba_alloc import DeviceHeap, Pool, SimulatedDevice
from numba_alloc.device import heap_kernels as hk
from numba_alloc.device.heap_simulator import _SimulatorAtomics

import simulator_threads


class CountingAtomics(_SimulatorAtomics):
    """The simulator's atomics, counted (``count``: calls of any kind)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def _counted(name):
        def call(self, *args):
            with self._lock:
                self.count += 1
            return getattr(_SimulatorAtomics, name)(self, *args)
        return call

    add, max, or_, and_, exch, cas = map(_counted, ("add", "max", "or_", "and_", "exch", "cas"))


@cuda.jit
def allocate(heap, sizes, offsets):
    i = cuda.grid(1)
    offsets[i] = heap.malloc(sizes[i])


@cuda.jit
def release(heap, offsets):
    i = cuda.grid(1)
    heap.free(offsets[i])


@cuda.jit
def allocate_warp(heap, sizes, offsets, blocks):
    i = cuda.grid(1)
    off, mine = heap.malloc_warp(sizes[i])
    offsets[i] = off
    blocks[i] = off if mine else -1


def mixed_sizes(count, seed):
    """``count`` sizes, log-uniform from 16 B to 8 KiB, multiples of 16 (the
    heap suite's mixed case)."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(math.log(16), math.log(8192), count))
    return (np.ceil(sizes / 16) * 16).astype(np.int64)


def per_lane(atomics, launch, lanes):
    before = atomics.count
    launch()
    return (atomics.count - before) / lanes


def stats(heap):
    """heap.stats(), and the word the kernels keep bytes in use in (for the peak)."""
    return dict(heap.stats(), device_bytes_in_use=int(heap._meta[hk.BYTES_IN_USE]))


def scenario(atomics, pool, sizes, free_order):
    """Atomics per malloc (a fresh heap, one thread per size, warps of 32)
    and per free (the blocks freed in ``free_order``), then per malloc and
    per free of a second round on the same heap; with the stats after each
    round."""
    n = sizes.size
    heap = DeviceHeap("16MiB", pool=pool)
    out = {}
    for round_ in ("first", "second"):
        offsets = np.zeros(n, np.int64)
        out[f"malloc_{round_}"] = per_lane(
            atomics, lambda: allocate[1, n](heap, sizes, offsets), n)
        assert (offsets >= 0).all(), "a malloc failed"
        out[f"stats_after_malloc_{round_}"] = stats(heap)
        freed = offsets[free_order]
        out[f"free_{round_}"] = per_lane(atomics, lambda: release[1, n](heap, freed), n)
        out[f"stats_after_free_{round_}"] = stats(heap)
    out["sizes"] = sizes.tolist()
    heap.close()
    return out


def warp_scenario(atomics, pool, sizes):
    """Atomics per warp of one malloc_warp by a whole warp (a fresh heap,
    then the same heap again) and of freeing its block (by the lane holding
    it, lane 0, launched alone: the other lanes would return before the
    warp's ``activemask()``), with the stats after each."""
    heap = DeviceHeap("16MiB", pool=pool)
    out = {}
    for round_ in ("first", "second"):
        offsets, blocks = np.zeros(32, np.int64), np.zeros(32, np.int64)
        out[f"malloc_{round_}"] = per_lane(
            atomics, lambda: allocate_warp[1, 32](heap, sizes, offsets, blocks), 1)
        assert (offsets >= 0).all() and (blocks >= 0).sum() == 1 == (blocks[0] >= 0)
        out[f"stats_after_malloc_{round_}"] = stats(heap)
        out[f"free_{round_}"] = per_lane(atomics, lambda: release[1, 1](heap, blocks[:1]), 1)
        out[f"stats_after_free_{round_}"] = stats(heap)
    out["sizes"], out["offsets"] = sizes.tolist(), offsets.tolist()
    heap.close()
    return out


def main():
    atomics = CountingAtomics()
    hk.cuda.atomic = atomics
    hk.cuda.warps.WINDOW = 10.0         # every lane of a warp gathers (none diverges)
    pool = Pool(SimulatedDevice("64MiB"))
    out = {}
    one = np.full(32, 16, np.int64)
    out["one_size"] = scenario(atomics, pool, one, np.arange(32))
    mixed = mixed_sizes(128, 0)
    order = np.random.default_rng(1).permutation(128)
    out["mixed"] = scenario(atomics, pool, mixed, order)
    # particle emission's requests: 16 B x 0 to 16 particles per lane
    particles = (np.arange(32) * 2654435761 % 2**32 >> 13) % 17
    out["warp_block"] = warp_scenario(atomics, pool, 16 * particles.astype(np.int64))
    out["group_sizes"] = dict(hk.cuda.warps.group_sizes)
    print(json.dumps(out))


if __name__ == "__main__":
    simulator_threads.install()
    main()
