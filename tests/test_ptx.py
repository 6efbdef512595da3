"""Every kernel the project launches compiles for a GPU (sm_90), without one.

The CUDA simulator runs kernels as Python, so it never checks that Numba can
type and lower them for a GPU; ``cuda.compile_ptx`` does, with NVVM from
PyPI (the ``cu12``/``cu13`` extras) or a CUDA toolkit; where neither is
installed, every test here skips, naming the extras. Compiles run in
subprocesses with the simulator off, whatever this process's environment
says.
"""

import collections
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
def compiled(once):
    """{kernel name: [its compile reports]} from tests/ptx_kernels.py."""
    reports = {}
    for line in once("ptx_kernels", lambda: python(os.path.join(HERE, "ptx_kernels.py"))
                     ).splitlines():
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
            "heap_sim.churn", "heap_sim.warp_blocks"} <= set(compiled)
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


def test_the_copy_kernel_moves_aligned_words_with_128_bit_loads_and_stores(compiled):
    """Its aligned path: 128-bit global loads and stores (ld/st.global.v2.u64),
    four loads issued before their stores, and no 64-bit pairs standing in
    for them (the loads of 64 bits read the launch table, the stores of 64
    bits are block 0's counts; the bytes at the edges go one by one)."""
    (report,) = compiled["numba_alloc.device.kernels.copy_moves"]
    accesses = report["global"]
    assert accesses["loads"].get("128", 0) >= 4 and accesses["stores"].get("128", 0) >= 4
    assert set(accesses["loads"]) <= {"8", "64", "128"}
    assert set(accesses["stores"]) <= {"8", "64", "128"}
    assert accesses["stores"].get("64", 0) <= 2
    loop = report["widest_loop"]
    assert loop["loads"] == loop["loads_before_store"] == 4
    assert loop["per_16_bytes"] <= 6


def test_the_copy_kernel_has_one_global_atomic(compiled):
    """One atomic site (thread 0 of each block adds its chunk's bytes);
    the simulator counts how often it runs (test_kernels.py)."""
    (report,) = compiled["numba_alloc.device.kernels.copy_moves"]
    assert report["global"]["atomics"] == 1


def test_global_accesses_reads_ptx_widths_and_atomics():
    from numba_alloc.device import inspection
    ptx = textwrap.dedent("""
        $L__BB0_2:
        	ld.global.v2.u64 	{%rd1, %rd2}, [%rd3];
        	ld.global.nc.v4.u32 	{%r1, %r2, %r3, %r4}, [%rd4];
        	@%p1 st.global.u8 	[%rd5], %rs1;
        	st.global.v2.u64 	[%rd6], {%rd1, %rd2};
        	add.s64 	%rd3, %rd3, 16;
        	@%p2 bra 	$L__BB0_2;
        	atom.global.add.u64 	%rd7, [%rd8], %rd9;
        	red.global.add.u64 	[%rd8], %rd9;
        	ld.param.u64 	%rd10, [param_0];
    """)
    assert inspection.global_accesses(ptx) == {"loads": {128: 2}, "stores": {8: 1, 128: 1},
                                               "atomics": 2}
    assert inspection.widest_loop(ptx) == {"loads": 2, "loads_before_store": 2,
                                           "instructions": 6, "per_16_bytes": 3.0}


# (function, kind, who runs it) of every global atomic reached from a kernel
# calling the heap's method: "leader", one lane of its group; "lanes", every
# lane that gets there (tests/heap_ptx.py)
MALLOC_SMALL = {
    # a warp's lanes asking for one class: their leader, per page it reserves
    # blocks on (_reserve; an empty page taken, _take_seen, its grants moved;
    # now and then _flush_grants), per bitmap word it sets their bits in
    # (_claim_word), bits it could not find given back (_take_bits), the
    # group's failures (_malloc_small)
    ("_reserve", "add", "leader"): 3, ("_take_seen", "cas", "leader"): 1,
    ("_move_grants", "add", "leader"): 1, ("_flush_grants", "cas", "leader"): 1,
    ("_flush_grants", "add", "leader"): 1, ("_claim_word", "or", "leader"): 1,
    ("_take_bits", "add", "leader"): 1, ("_malloc_small", "add", "leader"): 1,
    # one lane of the warp: the bytes in use of all its lanes, and the peak
    ("_add_in_use", "add", "leader"): 1, ("_add_in_use", "max", "leader"): 1}
MALLOC_LARGE = {  # a run of whole pages (above the largest class): one lane's
    ("_malloc_large", "add", "lanes"): 4, ("_malloc_large", "exch", "lanes"): 1,
    ("_take_seen", "cas", "lanes"): 1, ("_move_grants", "add", "lanes"): 1,
    ("_add_in_use", "add", "lanes"): 1, ("_add_in_use", "max", "lanes"): 1}
FREE = {
    # one lane per bitmap word (its lanes' bits cleared at once), per page
    # (their blocks off its count) and per warp (bytes in use, invalid frees)
    ("heap_free", "and", "leader"): 1, ("heap_free", "add", "leader"): 2,
    ("_add_in_use", "add", "leader"): 1, ("_add_in_use", "max", "leader"): 1,
    # a lane freeing a run, or a block that turned out not live (its bytes
    # back, raising the peak as a malloc's do)
    ("heap_free", "exch", "lanes"): 1, ("heap_free", "add", "lanes"): 2,
    ("_add_in_use", "add", "lanes"): 2, ("_add_in_use", "max", "lanes"): 2}


@pytest.fixture(scope="module")
def heap_atomics(once):
    """tests/heap_ptx.py's report on the heap's compiled methods."""
    return json.loads(once("heap_ptx", lambda: python(os.path.join(HERE, "heap_ptx.py"))))


def test_the_heaps_common_path_takes_atomics_per_group_not_per_lane(heap_atomics):
    """In the compiled code (sm_90, NVVM's optimizations off so that each
    Python function is a PTX function and each atomic one source site),
    every atomic of a small-class malloc and of a free runs on one lane of
    its group: per lane are only a negative size's failure, page runs and
    a free of a block that is not live. So a warp of 32 asking for one class
    on a page with room takes 4 global atomics (the page's word, one bitmap
    word, bytes in use, the peak); a free 3 (the counts under
    the simulator, tests/test_heap_atomics.py). Before, each lane set and
    cleared its own bit: 32 atomics on the bitmap for the warp."""
    def table(report):
        return collections.Counter(tuple(site) for site in report["sites"])
    assert table(heap_atomics["malloc"]) == collections.Counter(
        {**MALLOC_SMALL, **MALLOC_LARGE, ("heap_malloc", "add", "lanes"): 1})
    # malloc_warp: the leader mallocs the warp's one block, whatever its size
    leader = collections.Counter()
    for (function, kind, _), n in [*MALLOC_SMALL.items(), *MALLOC_LARGE.items()]:
        leader[(function, kind, "leader")] += n
    leader[("heap_malloc_warp", "add", "leader")] += 1      # negative sizes, counted once
    assert table(heap_atomics["malloc_warp"]) == leader
    assert table(heap_atomics["free"]) == collections.Counter(FREE)
    # optimized, as a GPU runs them: NVVM inlines and unrolls some sites,
    # but the bitmap still has one atomic site each way
    for name, report in heap_atomics.items():
        kinds = {kind for _, kind, _ in report["sites"]}
        assert report["sm_90"] and set(report["optimized"]) == kinds, name
    assert heap_atomics["malloc"]["optimized"]["or"] == 1
    assert heap_atomics["malloc_warp"]["optimized"]["or"] == 1
    assert heap_atomics["free"]["optimized"]["and"] == 1
    print({name: report["optimized"] for name, report in heap_atomics.items()})


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
