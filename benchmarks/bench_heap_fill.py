"""Where ``mixed_fill`` (kernels/heap_suite.py) first fails, at any heap size.

``--simulate``: the suite's own ``Suite.mixed_fill`` under Numba's CUDA
simulator (run with NUMBA_ENABLE_CUDASIM=1; each thread a Python thread, so
keep heaps modest). ``--model``: a host model of the same fill, no kernels:
the rounds' sizes as the suite draws them, each request taking a block of
the smallest class that holds it from a page of that class with a free
block, else from an unassigned page, else failing (as the heap's small path
does: requests never freed, every page of a class searched); live bytes
are requested bytes. Prints one JSON object per heap size.

    python benchmarks/bench_heap_fill.py --model --heap 256MiB --round 1000
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/bench_heap_fill.py --simulate --heap 2MiB --round 16
"""

import argparse
import importlib
import json
import time

import numpy as np

from numba_alloc import DeviceHeap
from numba_alloc.units import parse_size

POWER_OF_TWO = tuple(16 << k for k in range(10))     # the classes before issue 11's change


def model(heap_size, per_round, classes):
    """The host model's figures for one heap (see the module docstring)."""
    suite = importlib.import_module("numba_alloc.workloads.heap_suite")
    sizes_of = np.array(classes, np.int64)
    capacity = DeviceHeap.page_size // sizes_of
    free_pages = heap_size // DeviceHeap.page_size
    room = np.zeros(len(classes), np.int64)       # free blocks in each class's pages
    live = granted = rounds = 0
    while True:
        sizes = suite.mixed_sizes(per_round, 100 + rounds)
        rounds += 1
        before, failed = live, 0
        for n, k in zip(sizes.tolist(), np.searchsorted(sizes_of, sizes).tolist()):
            if room[k] == 0:
                if free_pages == 0:
                    failed += 1
                    continue
                free_pages -= 1
                room[k] = capacity[k]
            room[k] -= 1
            live += n
            granted += int(sizes_of[k])
        if failed:
            return {"rounds": rounds, "failed": failed, "live_fraction_before": before / heap_size,
                    "live_fraction": live / heap_size, "granted_fraction": granted / heap_size,
                    "failed_below_90": before + int(sizes.sum()) <= 0.9 * heap_size}


def simulate(heap_size, per_round, block):
    """``Suite.mixed_fill`` in the CUDA simulator, with the default classes."""
    from numba_alloc import Pool, SimulatedDevice
    suite = importlib.import_module("numba_alloc.workloads.heap_suite")
    config = dict(suite.CONFIGS["tiny"], fill_heap=heap_size, fill_round=per_round, block=block)
    pool = Pool(SimulatedDevice(heap_size + (heap_size >> 2) + (8 << 20)))
    figures = suite.Suite(config, 1, pool, 1 << 40).mixed_fill()["allocators"]["numba_alloc"]
    return {k: figures[k] for k in ("rounds", "live_fraction_before", "live_fraction",
                                    "granted_fraction", "failed_below_90", "check")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--model", action="store_true", help="the host model")
    how.add_argument("--simulate", action="store_true", help="the CUDA simulator")
    parser.add_argument("--heap", nargs="+", default=["256MiB"], help="heap sizes")
    parser.add_argument("--round", type=int, default=1000, help="allocations per round")
    parser.add_argument("--block", type=int, default=32, help="threads per block (--simulate)")
    parser.add_argument("--power-of-two", action="store_true",
                        help="(--model) the classes 16, 32, ..., 8192 instead of the default")
    args = parser.parse_args()
    classes = POWER_OF_TWO if args.power_of_two else DeviceHeap.default_classes
    for heap in args.heap:
        size = parse_size(heap, "heap")
        start = time.perf_counter()
        if args.model:
            figures = model(size, args.round, classes)
        else:
            figures = simulate(size, args.round, args.block)
        print(json.dumps({"how": "model" if args.model else "simulator", "heap": heap,
                          "round": args.round, "classes": len(classes) if args.model else
                          len(DeviceHeap.default_classes), **figures,
                          "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
