"""NRT served by the pool (nrt_heap_size) through numba-cuda's own compile,
link and load path over the driver stand-in: each scenario runs in a fresh
process (test_nrt_link.py), ``python nrt_standin.py NAME``, and prints one
JSON line. NRT is on (NUMBA_CUDA_ENABLE_NRT=1, set by the test); the
setting comes from NUMBA_ALLOC_CONF where the test sets it.

Kernels are compiled with ``lto=True``: numba-cuda then compiles NRT's CUDA
source to LTO-IR, which needs no driver (as PTX, NVRTC asks the driver's
version), and ``inspect_lto_ptx`` shows the NRT functions as linked. The
stand-in runs kernels as their Python functions (np.empty is NumPy's
there): what a GPU's NRT does with the heap is nrt_sim.py's and the GPU
session's."""

import ctypes
import json
import re
import sys

import standin

STANDIN = standin.install(capacity=256 << 20, devices=2)

import numpy as np  # noqa: E402 (after the stand-in, before CUDA is used)
from numba import cuda  # noqa: E402
from numba.cuda.cudadrv import driver  # noqa: E402

import numba_alloc  # noqa: E402

numba_alloc.install()

CC = (9, 0)
CALL = re.compile(r"call(?:\.uni)?\s*(?:\([^)]*\),\s*)?\s*(\w+)")
FUNCTION = re.compile(r"\.(?:extern|visible)\s+\.func\s+(?:\(([^)]*)\)\s*)?(\w+)\s*\(([^)]*)\)")


@cuda.jit(lto=True)
def sums(out):
    """Each thread sums an np.empty of 8 items it filled."""
    i = cuda.grid(1)
    x = np.empty(8, np.int64)
    for j in range(8):
        x[j] = i + j
    out[i] = x.sum()


def _calls(ptx):
    return sorted(set(CALL.findall(ptx)) - {"prototype"})


def _prototypes(ptx, names):
    """{name: [the return's type or None, the parameters' types]} of the
    functions ``names`` as ``ptx`` declares or defines them."""
    found = {}
    for ret, name, params in FUNCTION.findall(ptx):
        if name in names:
            found[name] = [re.findall(r"\.param\s+\.(\w+)", ret)[0] if ret else None,
                           re.findall(r"\.param\s+\.(\w+)", params)]
    return found


def _kernel_of(dispatcher):
    return next(iter(dispatcher.overloads.values()))


def _descriptor_global(kernel):
    """The value of the loaded module's descriptor global, or None when the
    module has none (CUDA_ERROR_NOT_FOUND)."""
    module = kernel._codelibrary.get_cufunc().module
    try:
        pointer, _ = module.get_global_symbol("numba_alloc_nrt_heap")
    except driver.CudaAPIError as e:
        return e.code.name
    value = ctypes.c_uint64()
    driver.device_to_host(value, pointer, 8)
    return value.value


def _launch(dispatcher):
    out = cuda.device_array(64, np.int64)
    dispatcher[2, 32](out)
    return out.copy_to_host().tolist() == [8 * i + 28 for i in range(64)]


def _nrt_stats():
    return {k: v for k, v in numba_alloc.memory_stats().items() if k.startswith("nrt.")}


def heap_serves_nrt():
    """NUMBA_ALLOC_CONF=nrt_heap_size:4MiB: the kernel links numba_alloc's
    NRT, its module's global holds the pool's descriptor, the heap counts
    in the pool."""
    from numba_alloc.device.nrt_heap import heap_ptx
    right = _launch(sums)
    kernel = _kernel_of(sums)
    with numba_alloc.device_pool() as pool:
        descriptor = pool.nrt_heap.descriptor_address
        served = {"address": pool.nrt_heap.heap.address, "size": pool.nrt_heap.heap.size}
        words = np.zeros(4, np.int64)
        driver.device_to_host(words, driver.MemoryPointer(None, driver.binding.CUdeviceptr(
            descriptor), 32), 32)
        pinned = [b["pinned"] for s in pool.snapshot()["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated"]
    summary = str(numba_alloc.memory_summary())
    nrt_ptx, heap = kernel.inspect_lto_ptx(cc=CC), heap_ptx()
    return {"right": right,
            "linked": sorted(getattr(f, "name", str(f)) for f in
                             kernel._codelibrary._linking_files),
            "calls": _calls(nrt_ptx),
            # how NRT calls the heap's functions, and how they are defined
            "declared": _prototypes(nrt_ptx, heap),
            "defined": {symbol: _prototypes(ptx, [symbol])[symbol]
                        for symbol, ptx in heap.items()},
            "heap_calls": {symbol: _calls(ptx) for symbol, ptx in heap.items()},
            "global": _descriptor_global(kernel), "descriptor": descriptor,
            "words": words.tolist(), "heap": served, "pinned": pinned, "stats": _nrt_stats(),
            "allocated": numba_alloc.memory_allocated(),
            "summary": "of which NRT's heap (np.empty in kernels)" in summary,
            "errors": STANDIN.errors}


def cuda_heap_without_the_setting():
    """No setting: numba-cuda's own NRT (CUDA's malloc), no descriptor in
    the module; setting it afterwards is refused, naming the kernel, for
    every device and for the pool itself (Pool.configure)."""
    right = _launch(sums)
    kernel = _kernel_of(sums)
    refused = {}
    with numba_alloc.device_pool() as pool:
        for name, configure in (("defaults", numba_alloc.configure),
                                ("pool", pool.configure)):
            try:
                configure(nrt_heap_size="4MiB")
                refused[name] = None
            except RuntimeError as e:
                refused[name] = str(e)
        pool_setting = pool.settings().nrt_heap_size
    return {"right": right, "calls": _calls(kernel.inspect_lto_ptx(cc=CC)),
            "global": _descriptor_global(kernel), "refused": refused,
            "setting": numba_alloc.settings().nrt_heap_size, "pool_setting": pool_setting,
            "stats": _nrt_stats(), "errors": STANDIN.errors}


def cached_kernel_blocks_switching_on():
    """A kernel that uses NRT, with ``cache=True`` (NUMBA_CACHE_DIR, set by
    the test, which runs this twice: the first run fills the cache, the
    second loads the kernel from it): it runs with CUDA's NRT, and setting
    nrt_heap_size afterwards is refused naming it, however it was loaded."""
    cached = cuda.jit(lto=True, cache=True)(sums.py_func)
    right = _launch(cached)
    try:
        numba_alloc.configure(nrt_heap_size="4MiB")
        refused = None
    except RuntimeError as e:
        refused = str(e)
    return {"from_cache": sum(cached.stats.cache_hits.values()) > 0,
            "right": right and _launch(cached), "global": _descriptor_global(_kernel_of(cached)),
            "refused": refused, "setting": numba_alloc.settings().nrt_heap_size,
            "errors": STANDIN.errors}


def no_nrt(out):
    """sums' results without NRT."""
    i = cuda.grid(1)
    out[i] = 8 * i + 28


def cached_kernel_under_the_setting():
    """NUMBA_ALLOC_CONF=nrt_heap_size:4MiB and Numba's disk cache
    (NUMBA_CACHE_DIR, set by the test): a kernel that uses NRT with
    ``cache=True`` is refused at its first launch (numba-cuda cannot pickle
    it), naming the setting and what to do; the same kernel without
    ``cache=True``, and a kernel without NRT with it, run."""
    try:
        _launch(cuda.jit(lto=True, cache=True)(sums.py_func))
        refused = None
    except RuntimeError as e:
        refused = str(e)
    cached = cuda.jit(cache=True)(no_nrt)
    return {"refused": refused, "right": _launch(cuda.jit(lto=True)(sums.py_func)),
            "cached_right": _launch(cached), "cached": sum(cached.stats.cache_misses.values()),
            "global": _descriptor_global(_kernel_of(cached)), "errors": STANDIN.errors}


def _modules(device):
    with cuda.gpus[device]:
        return len(cuda.current_context().modules)


def _refusal(dispatcher, device):
    """What launching ``dispatcher`` on GPU ``device`` raised (its message)."""
    with cuda.gpus[device]:
        try:
            _launch(dispatcher)
        except RuntimeError as e:
            return str(e)
    return None


def one_library_per_kernel_across_devices():
    """nrt_heap_size for GPU 0 only: a kernel compiled there (the heap's NRT)
    is refused on GPU 1, and one compiled on GPU 1 (CUDA's NRT) is refused on
    GPU 0; each refused module is unloaded, and nothing is carved on GPU 1."""
    from numba_alloc.plugin import registry
    registry.set_device_settings(0, nrt_heap_size="4MiB")
    with cuda.gpus[0]:
        on_zero = cuda.jit(lto=True)(sums.py_func)
        right = _launch(on_zero)
    with cuda.gpus[1]:
        on_one = cuda.jit(lto=True)(sums.py_func)
        right = right and _launch(on_one)
        with numba_alloc.device_pool() as pool:
            before = pool.memory_stats()["allocated_bytes.all.current"]
    modules = [_modules(0), _modules(1)]
    refused = {"heap_on_one": _refusal(on_zero, 1), "cuda_on_zero": _refusal(on_one, 0)}
    with cuda.gpus[1]:
        with numba_alloc.device_pool() as pool:
            after = pool.memory_stats()["allocated_bytes.all.current"]
            carved = pool.nrt_heap is not None
    return {"right": right, "refused": refused, "modules": modules,
            "modules_after": [_modules(0), _modules(1)], "pool_one": [before, after],
            "carved_on_one": carved, "errors": STANDIN.errors}


def a_full_pool_refuses_the_heap_and_the_launch():
    """nrt_heap_size larger than the pool's limit: the first launch raises
    the pool's OutOfMemoryError, the module is unloaded, the pool as before;
    with more room, the same kernel runs."""
    out = cuda.device_array(64, np.int64)
    before = numba_alloc.memory_allocated()
    try:
        sums[2, 32](out)
        raised = None
    except numba_alloc.OutOfMemoryError as e:
        raised = str(e).split(". ")[0]
    allocated = [before, numba_alloc.memory_allocated()]
    modules = _modules(0)
    numba_alloc.configure(limit="64MiB")
    right = _launch(sums)
    return {"raised": raised, "allocated": allocated, "modules": modules, "right": right,
            "stats": _nrt_stats(), "errors": STANDIN.errors}


def _refuse_next_global_write():
    """Make the stand-in's driver refuse (CUDA_ERROR_UNKNOWN) the next
    cuMemcpyHtoD of 8 bytes (a module's descriptor global; the heap's own
    writes are longer), then answer as before; returns a list that holds
    the call's name once it has refused. numba-cuda binds a driver function
    at its first call: the bound one is dropped, so that the next call
    binds the refusing one."""
    from cuda.bindings import driver as real
    functions, name = STANDIN.binding._functions, "cuMemcpyHtoD"
    original, refused = functions[name], []

    def refuse_once(dst, src, nbytes):
        if refused or int(nbytes) != 8:
            return original(dst, src, nbytes)
        refused.append(name)
        return (real.CUresult.CUDA_ERROR_UNKNOWN,)
    functions[name] = refuse_once
    vars(driver.driver).pop(name, None)
    return refused


def a_failed_descriptor_write_gives_the_heap_back():
    """NUMBA_ALLOC_CONF=nrt_heap_size:4MiB: the driver refuses the write of
    the heap descriptor's address into the first module's global, once:
    the launch raises the driver's error, the module is unloaded and the
    heap carved for it goes back (the pool's blocks and statistics as
    before, no nrt.* figures); the next launch carves it and runs."""
    out = cuda.device_array(64, np.int64)
    with numba_alloc.device_pool() as pool:
        before = {k: v for k, v in pool.memory_stats().items()
                  if k.endswith(".current") or k.startswith("nrt.")}
    refused = _refuse_next_global_write()
    try:
        sums[2, 32](out)
        raised = None
    except driver.CudaAPIError as e:
        raised = e.code.name
    with numba_alloc.device_pool() as pool:
        after = {k: v for k, v in pool.memory_stats().items()
                 if k.endswith(".current") or k.startswith("nrt.")}
        carved = pool.nrt_heap is not None
    changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
    return {"raised": raised, "refused": refused, "modules": _modules(0), "carved": carved,
            "changed": changed, "right": _launch(sums), "size": _nrt_stats()["nrt.size"],
            "errors": STANDIN.errors}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
