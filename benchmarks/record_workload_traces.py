"""Record the allocation traces of numba-alloc bench's kernel workloads.

Each workload (kernels/: cg, stencil, ragged, churn) runs its allocation
sequence, which depends only on its scale and a fixed seed, on a simulated
80 GiB device (no computation) with the pool's history recorded; the
history is written as an RMM CSV log, gzip-compressed, for
benchmarks/bench_traces.py and ``numba-alloc replay``.

    python benchmarks/record_workload_traces.py [--size SIZE] [--out DIR] [WORKLOAD...]

SIZE: small, medium or large (the default: full size for an 80 GiB GPU);
DIR: benchmarks/traces/ unless given. A workload that runs out of memory
on the simulated device stops there, as it does on a GPU; its trace ends
there too.
"""

import argparse
import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numba_alloc  # noqa: E402
from numba_alloc import Pool, SimulatedDevice  # noqa: E402
from numba_alloc.workloads import SIZES, WORKLOADS, parse_scale  # noqa: E402
from numba_alloc.workloads.arrays import OutOfMemory  # noqa: E402
from numba_alloc.workloads.simulated import SimulatedArrays  # noqa: E402


def record(name, scale, out):
    pool = Pool(SimulatedDevice("80GiB"))
    numba_alloc.record_history(device=pool, max_entries=10_000_000)
    arrays = SimulatedArrays(pool, compute=False)
    try:
        WORKLOADS[name].run(arrays, scale)
        arrays.synchronize()
    except OutOfMemory:
        pass
    with gzip.open(out, "wt", newline="") as f:
        return numba_alloc.dump_trace(f, device=pool)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", help=", ".join(sorted(WORKLOADS)) + " (all)")
    parser.add_argument("--size", default="large", help=", ".join(SIZES))
    parser.add_argument("--out", default=os.path.join(HERE, "traces"))
    args = parser.parse_args()
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)}: choose from {', '.join(sorted(WORKLOADS))}")
    os.makedirs(args.out, exist_ok=True)
    for name in args.workloads or sorted(WORKLOADS):
        out = os.path.join(args.out, f"{name}-{args.size}.csv.gz")
        events = record(name, parse_scale(args.size), out)
        print(f"{out}: {events:,} events, {os.path.getsize(out) / 2 ** 20:.2f} MiB compressed")


if __name__ == "__main__":
    main()
