"""NRT, numba-cuda's runtime for memory made inside kernels (``np.empty``
and the like): whether kernels use it, its counters, and what decides
where it allocates. By default NRT draws from CUDA's device malloc heap
(the ``malloc_heap_size`` setting, CUDA's 8 MiB by default), outside the
pool, its limit and its counters; with the ``nrt_heap_size`` setting, from a
heap carved from the pool (plugin/nrt_link.py, plugin/nrt_heap.py).

Asked only about a pool on a GPU, when numba.cuda is in use: numba.cuda is
imported on the first question, not with numba_alloc (which imports none
of it).
"""

import functools
import threading

NRT_COUNTERS = ("alloc", "free", "mi_alloc", "mi_free")
SETTING = "nrt_heap_size"
_KEPT_NAMES = 3                     # kernels with CUDA's heap named in the refusal

_lock = threading.Lock()
_cuda_heap_kernels = []             # names of kernels linked with CUDA's heap (a few)
_cuda_heap_count = 0                # how many


def in_use():
    """Whether kernels compile with NRT (NUMBA_CUDA_ENABLE_NRT=1), or NRT
    has started in this process."""
    from numba.cuda import config
    from numba.cuda.memory_management.nrt import rtsys
    return bool(getattr(config, "CUDA_ENABLE_NRT", False)) or rtsys._initialized


def counters():
    """``nrt.{alloc,free,mi_alloc,mi_free}``: NRT's counts of its
    allocations and frees (of memory and of meminfos), kept by numba-cuda
    when NUMBA_CUDA_NRT_STATS=1; read from the device, which launches NRT's
    read kernels and waits for the device. {} when the statistics are off or
    NRT has not started. Thread safe as numba-cuda's runtime is."""
    from numba.cuda import config
    from numba.cuda.memory_management.nrt import rtsys
    if not (getattr(config, "CUDA_NRT_STATS", False) and rtsys._initialized):
        return {}
    stats = rtsys.get_allocation_stats()
    return {f"nrt.{name}": int(getattr(stats, name)) for name in NRT_COUNTERS}


@functools.cache
def unsupported_reason():
    """Why NRT cannot be served by the pool under this numba-cuda (its
    internals differ from those plugin/nrt_link.py hooks), or None."""
    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.linkable_code import CUSource
    from .activity import _parameters
    kernel = getattr(dispatcher, "_Kernel", None)
    library = getattr(dispatcher, "NRT_LIBRARY", None)
    source = getattr(library, "data", "") if isinstance(library, CUSource) else ""
    checks = [
        (_parameters(getattr(kernel, "maybe_link_nrt", None)) == ("self", "link", "tgt_ctx",
                                                                   "asm"),
         "_Kernel.maybe_link_nrt(self, link, tgt_ctx, asm) is not where NRT is linked"),
        ("codelibrary" in _parameters(getattr(kernel, "_rebuild", None))
         and "nrt" in _parameters(getattr(codegen.CUDACodeLibrary, "_rebuild", None)),
         "_Kernel._rebuild(..., codelibrary, ...) and CUDACodeLibrary._rebuild(..., nrt, ...) "
         "are not where a kernel from Numba's disk cache gets NRT"),
        (isinstance(source, str) and "malloc(" in source and "free(" in source,
         "numba-cuda's NRT_LIBRARY is not CUDA source that calls malloc and free"),
        (_parameters(getattr(driver.Context, "create_module_image", None))
         == ("self", "image", "setup_callbacks", "teardown_callbacks"),
         "Context.create_module_image(self, image, setup_callbacks, teardown_callbacks) is "
         "not where modules are loaded"),
        (callable(getattr(driver.CudaPythonModule, "get_global_symbol", None)),
         "CudaPythonModule has no get_global_symbol"),
        (_parameters(getattr(codegen.CUDACodeLibrary, "_reduce_states", None)) == ("self",),
         "CUDACodeLibrary._reduce_states(self) is not where a kernel is pickled"),
    ]
    for ok, problem in checks:
        if not ok:
            return (f"{SETTING}: numba-cuda's internals differ from those numba_alloc serves "
                    f"NRT through (built for numba-cuda 0.30): {problem}")
    return None


def linked_with_cuda_heap(name):
    """Record that kernel ``name`` was linked with NRT on CUDA's heap."""
    global _cuda_heap_count
    with _lock:
        _cuda_heap_count += 1
        if len(_cuda_heap_kernels) < _KEPT_NAMES:
            _cuda_heap_kernels.append(name)


def switch_on_refused():
    """Why ``nrt_heap_size`` cannot be set now (kernels that use NRT were
    linked with CUDA's heap in this process), or None."""
    with _lock:
        if not _cuda_heap_count:
            return None
        names = ", ".join(_cuda_heap_kernels) + (", ..." if _cuda_heap_count > _KEPT_NAMES
                                                 else "")
        return (f"{SETTING} can be set only before the first kernel that uses NRT is "
                f"compiled: {_cuda_heap_count} were linked with CUDA's device malloc heap "
                f"({names}); set it first (NUMBA_ALLOC_CONF={SETTING}:256MiB, or "
                "numba_alloc.configure before compiling them)")
