"""Registers the device heap's kernels need on sm_90, without a GPU.

Compiles tests/heap_sim.py's fill and release kernels and the heap suite's
heap_alloc and heap_release with ``cuda.compile_ptx`` (NVVM), then runs
``ptxas -arch=sm_90 -v`` (on PATH) on each PTX: prints, per kernel, the PTX
lines, the virtual registers the PTX declares per type and ptxas's "Used N
registers" line. ptxas older than the NVVM rejects the PTX's ``.version``,
so it is lowered to ``--ptx-version`` (the heap uses nothing newer).

    python benchmarks/heap_ptx_registers.py --ptx-version 9.0
"""

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import types as types_ns
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from numba import cuda, types  # noqa: E402

from numba_alloc.device import heap_type  # noqa: E402

CC = (9, 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptx-version", help="the .version ptxas gets (default: NVVM's)")
    args = parser.parse_args()
    # compiling the heap's overloads asks for the current device: answer sm_90
    mock.patch("numba.cuda.dispatcher.get_current_device",
               lambda: types_ns.SimpleNamespace(compute_capability=CC)).start()
    import heap_sim
    suite = importlib.import_module("numba_alloc.workloads.heap_suite")
    heap, i64, n = heap_type.device_heap_type, types.int64[::1], types.int64
    kernels = [("heap_sim.fill", heap_sim.fill, (heap, i64, i64, i64)),
               ("heap_sim.release", heap_sim.release, (heap, i64)),
               ("heap_suite.heap_alloc", suite.heap_alloc, (heap, i64, n, i64)),
               ("heap_suite.heap_release", suite.heap_release, (heap, n, i64))]
    for name, kernel, signature in kernels:
        ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=CC)
        declared = {kind: int(count) for kind, count in
                    re.findall(r"\.reg \.(\w+)\s+%\w+<(\d+)>", ptx)}
        if args.ptx_version:
            ptx = re.sub(r"^\.version \S+", f".version {args.ptx_version}", ptx, flags=re.M)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kernel.ptx")
            with open(path, "w") as f:
                f.write(ptx)
            proc = subprocess.run(["ptxas", f"-arch=sm_{CC[0]}{CC[1]}", "-v", path, "-o",
                                   os.path.join(tmp, "kernel.cubin")],
                                  capture_output=True, text=True)
        used = [line.split(": ", 1)[-1] for line in proc.stderr.splitlines() if "Used" in line]
        print(f"{name}: PTX lines {ptx.count(chr(10))}, virtual registers {declared}; ptxas: "
              + (used[0] if used else proc.stderr.strip()))


if __name__ == "__main__":
    main()
