"""Every kernel the project launches on a GPU, with the argument types of its
launches, compiled for sm_90 by ``cuda.compile_ptx`` (NVVM, no GPU or
driver needed). Run as a script (by test_ptx.py, without the CUDA
simulator); prints one JSON line per (kernel, signature): whether it
compiled, and what its PTX does with global memory
(``inspection.global_accesses`` and ``widest_loop``).

The workloads' signatures are recorded by running each workload through
:class:`kernels.gpu.CudaArrays`'s launch code with ``cuda.jit`` replaced by
a recorder and host arrays standing in for device arrays (both
C-contiguous, so Numba types them alike). The copy kernel's are those of
``CudaDevice.copy``'s launch; the GPU tests list theirs in
``gpu_kernels.PTX_KERNELS`` (and ``PTX_DEVICE_FUNCTIONS``), the
benchmarks' in theirs (``benchmarks/bench_reclaim_gpu.py``,
``benchmarks/bench_launch_hooks.py``); the device
heap's suite's are listed in :func:`heap_suite_launches`.
"""

import importlib
import json
import os
import sys
import time
import types as types_ns
from unittest import mock

import numpy as np
from numba import cuda, types
from numba.cuda.typing.typeof import Purpose, typeof

import gpu_kernels
import heap_sim
from numba_alloc.cli.bench import workloads as kernels
from numba_alloc.workloads.gpu import CudaArrays
from numba_alloc.device import heap_type, inspection
from numba_alloc.device import kernels as copy_kernels

heap_suite = importlib.import_module("numba_alloc.workloads.heap_suite")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import bench_launch_hooks  # noqa: E402
import bench_reclaim_gpu  # noqa: E402

CC = (9, 0)

# numba_alloc/backends/cuda_device.py, CudaDevice.copy: both segments as uint8,
# the scratch (int64), and where the launch's header is in it (a Python int)
COPY_MOVES_ARGS = (types.uint8[::1], types.uint8[::1], types.int64[::1], types.int64)


class _Recorder:
    """Stands in for a kernel's ``cuda.jit`` dispatcher: ``recorder[grid](*args)``
    records the argument types as Numba's dispatcher types them."""

    def __init__(self, kernel, launches):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return self.record

    def record(self, *args):
        self.launches.add((self.kernel, tuple(typeof(a, Purpose.argument) for a in args)))


class HostArrays(CudaArrays):
    """CudaArrays over host arrays, with no device work: with ``cuda.jit``
    replaced by a recorder, its launches are recorded, not compiled."""

    computes = False

    def __init__(self):
        super().__init__()
        self._compiled = {}

    def to_host(self, array):
        return None

    def synchronize(self):
        pass

    def _allocate(self, shape, dtype, nbytes):
        return np.empty(shape, dtype)

    def _copy_in(self, array, host):
        pass


def workload_launches():
    """{(kernel, argument types)} of every workload at its smallest size."""
    launches = set()
    with mock.patch.object(cuda, "jit", lambda function, **options: _Recorder(function, launches)):
        for workload in kernels.WORKLOADS.values():
            workload.run(HostArrays(), kernels.SIMULATOR_SCALE, workload.SIMULATOR_STEPS)
    return launches


def heap_launches():
    """The device heap's simulator kernels (heap_sim.py), with the heap as
    its extension type: malloc, free and view in kernels and in a device
    function."""
    heap, i64 = heap_type.device_heap_type, types.int64[::1]
    return {(heap_sim.fill.py_func, (heap, i64, i64, i64)),
            (heap_sim.floats.py_func, (heap, i64)),
            (heap_sim.release.py_func, (heap, i64)),
            (heap_sim.churn.py_func, (heap, i64, types.int64, i64, i64)),
            (heap_sim.one_block_freed.py_func, (heap, types.int64, i64)),
            (heap_sim.warp_blocks.py_func, (heap, i64, i64, i64))}


def heap_suite_launches():
    """The device heap suite's kernels (kernels/heap_suite.py), with the
    argument types of its launches: device arrays and Python ints (int64)."""
    heap, i64, u32, u64 = (heap_type.device_heap_type, types.int64[::1], types.uint32[::1],
                           types.uint64[::1])
    n = types.int64
    kernels = {heap_suite.heap_alloc: (heap, i64, n, i64),
               heap_suite.heap_release: (heap, n, i64),
               heap_suite.heap_tags: (heap, i64, i64, n, i64),
               heap_suite.bump_alloc: (i64, n, i64, n, i64),
               heap_suite.bump_warp_alloc: (i64, n, i64, n, i64),
               heap_suite.emit_heap: (heap, n, i64, i64),
               heap_suite.emit_heap_warp: (heap, n, i64, i64, i64),
               heap_suite.busy: (n, u64),
               heap_suite.sum_heap: (heap, i64, i64, u64),
               heap_suite.count_particles: (n, i64),
               heap_suite.emit_flat: (n, i64, u32),
               heap_suite.sum_flat: (i64, i64, u32, u64),
               heap_suite.scan_blocks: (i64, i64, i64),
               heap_suite.add_block_sums: (i64, i64)}
    return {(kernel.py_func, signature) for kernel, signature in kernels.items()}


def all_launches():
    """[(name, python function, signature, device)] of every kernel the
    project launches (device: a device function, as @vectorize compiles
    it), sorted by name."""
    launches = (workload_launches() | {(copy_kernels.copy_moves, COPY_MOVES_ARGS)}
                | set(gpu_kernels.PTX_KERNELS) | heap_launches() | heap_suite_launches()
                | set(bench_reclaim_gpu.PTX_KERNELS) | set(bench_launch_hooks.PTX_KERNELS))
    named = [(f"{f.__module__}.{f.__qualname__}", f, signature, False)
             for f, signature in launches]
    named += [(f"{f.__module__}.{f.__qualname__}", f, signature, True)
              for f, signature in gpu_kernels.PTX_DEVICE_FUNCTIONS]
    return sorted(named, key=lambda row: (row[0], str(row[2])))


def main():
    # numba-cuda compiles device functions and overloads (the heap's methods)
    # for the current device's compute capability, which needs a GPU: answer
    # with the one compile_ptx targets
    mock.patch("numba.cuda.dispatcher.get_current_device",
               lambda: types_ns.SimpleNamespace(compute_capability=CC)).start()
    for name, function, signature, device in all_launches():
        start = time.perf_counter()
        ptx = ""
        try:
            ptx, _ = cuda.compile_ptx(function, signature, cc=CC, device=device)
            error, target = None, ".target sm_90" in ptx
        except Exception as e:  # reported, and failed, by test_ptx.py
            error, target = f"{type(e).__name__}: {e}", False
        print(json.dumps({"kernel": name, "signature": str(signature), "error": error,
                          "sm_90": target, "seconds": round(time.perf_counter() - start, 3),
                          "global": inspection.global_accesses(ptx),
                          "widest_loop": inspection.widest_loop(ptx)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
