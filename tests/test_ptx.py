"""Every kernel the project launches compiles for a GPU (sm_90), without one.

The CUDA simulator runs kernels as Python, so it never checks that Numba can
type and lower them for a GPU; ``cuda.compile_ptx`` does, with NVVM from
PyPI (the ``cu12``/``cu13`` extras) or a CUDA toolkit; where neither is
installed, every test here skips, naming the extras. Compiles run in
subprocesses with the simulator off, whatever this process's environment
says.
"""

import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

import gpu_kernels
from numba_alloc.cli.bench import workloads as kernels

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}


def python(*args):
    proc = subprocess.run([sys.executable, *args], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


NVVM_PROBE = textwrap.dedent("""
    from numba.cuda.cudadrv import nvvm
    try:
        print("" if nvvm.is_available() else "libNVVM is not available")
    except Exception as error:       # cuda-pathfinder's DynamicLibNotFoundError, ...
        print(f"{type(error).__name__}: {error}")
""")


@pytest.fixture(scope="module", autouse=True)
def nvvm():
    """Skip every test here, naming the extras, where NVVM cannot load."""
    missing = python("-c", NVVM_PROBE).strip()
    if missing:
        pytest.skip(f"no NVVM to compile kernels with ({missing}): install the cu13 extra, "
                    "or cu12 with a CUDA 12 driver: pip install -e \".[test,cu13]\"")


@pytest.fixture(scope="module")
def compiled():
    """{kernel name: [its compile reports]} from tests/ptx_kernels.py."""
    reports = {}
    for line in python(os.path.join(HERE, "ptx_kernels.py")).splitlines():
        report = json.loads(line)
        reports.setdefault(report["kernel"], []).append(report)
    return reports


def test_every_kernel_compiles_for_sm_90(compiled):
    failed = [f"{r['kernel']} {r['signature']}: {r['error']}"
              for reports in compiled.values() for r in reports if r["error"] or not r["sm_90"]]
    assert not failed, "\n".join(failed)


def test_every_kernel_is_compiled(compiled):
    """Each function of kernels/ and of the GPU tests' kernels that uses
    ``cuda`` is a kernel: the recorded launches and PTX_KERNELS cover it."""
    modules = [kernels.linalg, *kernels.WORKLOADS.values(), gpu_kernels]
    defined = {f"{m.__name__}.{name}" for m in modules for name, f in vars(m).items()
               if inspect.isfunction(f) and f.__module__ == m.__name__
               and "cuda" in f.__code__.co_names}
    assert {"numba_alloc.workloads.linalg.dot", "numba_alloc.workloads.cg.matvec",
            "gpu_kernels.add_one"} <= defined
    assert defined | {"numba_alloc.device.kernels.copy_moves"} <= set(compiled)
    # the device heap's methods (the extension type) and a device function using them
    assert {"heap_sim.fill", "heap_sim.floats", "heap_sim.release",
            "heap_sim.churn"} <= set(compiled)
    assert "gpu_kernels.twice" in compiled          # @vectorize's scalar function
    assert {"bench_reclaim_gpu.layer_step", "bench_reclaim_gpu.add",
            "bench_launch_hooks.axpbyc"} <= set(compiled)


def test_every_kernel_of_the_heap_suite_is_compiled(compiled):
    """The heap suite's kernels are ``cuda.jit`` dispatchers: each one that
    is not a device function is compiled."""
    from numba.cuda.dispatcher import CUDADispatcher
    suite = importlib.import_module("numba_alloc.workloads.heap_suite")
    kernels = {f"{suite.__name__}.{name}" for name, k in vars(suite).items()
               if isinstance(k, CUDADispatcher) and not k.targetoptions.get("device")}
    assert {"numba_alloc.workloads.heap_suite.heap_alloc",
            "numba_alloc.workloads.heap_suite.scan_blocks"} <= kernels
    assert kernels <= set(compiled)


NUMPY_2_5 = textwrap.dedent("""
    import sys
    import numpy as np
    if hasattr(np, "row_stack"):      # before NumPy 2.5: as NumPy 2.5 and later
        del np.row_stack
        np.__version__ = "2.5.2"
    if sys.argv[1] == "shim":
        import numba_alloc
    from numba import cuda, types

    def kernel(x):
        x[cuda.grid(1)] += 1

    try:
        ptx, _ = cuda.compile_ptx(kernel, (types.float32[::1],), cc=(9, 0))
    except AttributeError as e:
        print("AttributeError:", e)
    else:
        print("compiled", ".target sm_90" in ptx, "row_stack" in dir(np))
""")


def test_kernels_compile_without_np_row_stack_once_numba_alloc_is_imported():
    """numba-cuda 0.30 overloads np.row_stack, which NumPy 2.5 removed: the
    shim lets kernels compile and leaves NumPy without it."""
    bare = python("-c", NUMPY_2_5, "bare").strip()
    if bare.startswith("compiled"):
        pytest.skip("this numba-cuda compiles without np.row_stack: numpy_compat can go")
    assert "row_stack" in bare, bare
    assert python("-c", NUMPY_2_5, "shim").strip() == "compiled True False"


HEAP_VIEW_STORES = textwrap.dedent("""
    import types as types_ns
    from unittest import mock

    import numba
    from numba import cuda, types
    mock.patch("numba.cuda.dispatcher.get_current_device",
               lambda: types_ns.SimpleNamespace(compute_capability=(9, 0))).start()
    from numba_alloc.device import heap_type

    def two_ends(heap, off, n):
        words = heap.view(off, n, numba.uint32)
        words[0] = 1
        words[words.size - 1] = 2

    def a_loop(heap, off, n):
        words = heap.view(off, n, numba.uint32)
        for j in range(words.size):
            words[j] = j

    def beside_an_inlined_call(heap, off, n):      # an inline="always" overload: DCE runs
        heap.view(off, n, numba.uint8)[n - 1] = heap.view(off, n, numba.uint8).size

    for kernel in (two_ends, a_loop, beside_an_inlined_call):
        ptx, _ = cuda.compile_ptx(kernel, (heap_type.device_heap_type, types.int64,
                                           types.int64), cc=(9, 0))
        print(kernel.__name__, ptx.count("st.global"))
""")


def test_stores_through_a_heap_view_survive_compilation():
    """heap.view is inlined into the kernel; Numba's dead code elimination
    then dropped every store through a view at a computed index (it does
    not know .view() returns an alias of the heap), so on a GPU the heap
    suite found every allocation's last tag missing."""
    counts = {name: int(n) for name, n in
              (line.split() for line in python("-c", HEAP_VIEW_STORES).splitlines())}
    assert counts["two_ends"] == 2 and counts["beside_an_inlined_call"] == 1
    assert counts["a_loop"] >= 1                    # (NVVM unrolls it)
