"""NRT served by the pool (the ``nrt_heap_size`` setting): what numba-cuda
links into kernels that use NRT, and what their modules get when loaded.

Four hooks into numba-cuda 0.30, installed by the plugin when it makes a
pool (:func:`install`; harmless while the setting is unset everywhere):

* ``dispatcher._Kernel.maybe_link_nrt``: where numba-cuda adds its NRT
  library (``nrt.cu``, whose allocator is CUDA's device malloc) to a
  kernel's link, and the current device's ``nrt_heap_size`` is set, the
  kernel links :func:`library` instead: the same NRT source with its
  ``malloc``/``free`` served by the pool's heap
  (:func:`numba_alloc.device.nrt_heap.nrt_source`) and the heap's malloc
  and free as PTX (:func:`numba_alloc.device.nrt_heap.heap_ptx`). One
  library per kernel: nothing in a kernel frees into the other heap.
  Where it is unset, CUDA's stays, and the kernel is recorded: switching
  ``nrt_heap_size`` on afterwards is refused
  (:func:`numba_alloc.plugin.nrt.switch_on_refused`).
* ``dispatcher._Kernel._rebuild``: where a kernel is rebuilt from Numba's
  disk cache (or unpickled), which never passes ``maybe_link_nrt``: one
  whose library links numba-cuda's NRT (the only NRT a cache holds) is
  recorded as linked with CUDA's heap, as one compiled without the setting
  is, so that switching ``nrt_heap_size`` on afterwards is refused too.
* ``Context.create_module_image``: a kernel's module (one with setup
  callbacks) holding the descriptor global gets the address of its
  device's heap descriptor (the heap is carved then if need be:
  plugin/nrt_heap.py; given back, as if never carved, when the driver does
  not write the global). Refused, the module unloaded, RuntimeError naming
  the setting: such a module on a device whose ``nrt_heap_size`` is unset,
  and, on a device where it is set, a module with CUDA's NRT (its
  ``TheMSys`` global without the descriptor): compiled before the setting,
  for another device, or read from Numba's disk cache.
* ``codegen.CUDACodeLibrary._reduce_states``: a kernel linked with the
  heap cannot be pickled (for Numba's disk cache, ``cache=True``, or
  otherwise): numba-cuda pickles only its own NRT library, and raised
  "Cannot pickle CUDACodeLibrary with linking files", naming neither the
  setting nor a way out; RuntimeError naming the setting, the kernel and
  what to do instead.

Costs: the heap's PTX is compiled once per process (seconds, at the first
kernel that uses NRT under the setting); each module load looks up one or
two globals (none while the setting is unset and no kernel links the
heap); a launch pays nothing.

:func:`numba_alloc.plugin.nrt.unsupported_reason` checks these internals
first; the setting is refused, naming the reason, where they differ.
Thread safe.
"""

import ctypes
import threading

from ..device import nrt_heap as device
from . import nrt
from .nrt import SETTING
from .nrt_heap import serve

MEMSYS_SYMBOL = "TheMSys"           # numba-cuda's NRT statistics, in every module NRT is in

_lock = threading.Lock()
_originals = {}                     # (owner, name) -> what the hook replaced
_library = []                       # the LinkableCode objects of NRT served by the heap
_linked_heap = False                # whether a kernel linked the heap in this process


def library():
    """[the CUSource of NRT served by the heap, the PTXSources of the heap's
    malloc and free]: what a kernel that uses NRT links under the setting
    (made once, under Numba's compiler lock; compiling the PTX takes
    seconds)."""
    from numba.cuda import dispatcher
    from numba.cuda.core.compiler_lock import global_compiler_lock
    from numba.cuda.cudadrv.linkable_code import CUSource, PTXSource
    with global_compiler_lock:
        if not _library:
            source = device.nrt_source(dispatcher.NRT_LIBRARY.data)
            made = [CUSource(source, name="numba_alloc_nrt.cu", nrt=True)]
            made += [PTXSource(ptx.encode(), name=f"{symbol}.ptx")
                     for symbol, ptx in device.heap_ptx().items()]
            _library.extend(made)
        return list(_library)


def _pool_of(ctx):
    """The numba_alloc pool of context ``ctx`` (made if need be), or None."""
    manager = ctx.memory_manager
    return getattr(manager, "pool", None) or (manager.initialize() if getattr(
        manager, "is_numba_alloc", False) else None)


def _heap_on(pool):
    return pool is not None and pool.settings().nrt_heap_size is not None


def _maybe_link_nrt(self, link, tgt_ctx, asm):
    global _linked_heap
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv.devices import get_context
    before = len(link)
    _originals[dispatcher._Kernel, "maybe_link_nrt"](self, link, tgt_ctx, asm)
    if len(link) == before or link[-1] is not dispatcher.NRT_LIBRARY:
        return
    if _heap_on(_pool_of(get_context())):
        link[-1:] = library()
        _linked_heap = True
    else:
        nrt.linked_with_cuda_heap(getattr(self.py_func, "__qualname__", repr(self.py_func)))


def _rebuild_kernel(cls, *args, **kwargs):
    """``_Kernel._rebuild``: the kernel rebuilt (from Numba's disk cache, or
    unpickled), recorded as linked with CUDA's heap when its library links
    numba-cuda's NRT (a kernel linked with the pool's heap is never cached
    nor pickled), whatever the setting where it is rebuilt (where it is set,
    the kernel's launch is refused: _set_up)."""
    from numba.cuda import dispatcher
    kernel = _originals[dispatcher._Kernel, "_rebuild"].__func__(cls, *args, **kwargs)
    library = kernel._codelibrary
    if dispatcher.NRT_LIBRARY in library._linking_files:
        nrt.linked_with_cuda_heap(library.name)
    return kernel


def _reduce_states(self):
    """``CUDACodeLibrary._reduce_states``: RuntimeError for a library linked
    with NRT served by the pool's heap (numba-cuda can pickle only its own
    NRT library), else what numba-cuda's returns."""
    from numba.cuda import codegen
    if any(file is made for file in self._linking_files for made in _library):
        raise RuntimeError(
            f"kernel {self.name} uses NRT (np.empty and the like) served by the pool's heap "
            f"({SETTING} is set) and cannot be cached on disk (cache=True) nor pickled: "
            f"numba-cuda keeps only its own NRT in a cache. Compile kernels that use NRT "
            f"without cache=True while {SETTING} is set (kernels without NRT may keep it), "
            f"or leave {SETTING} unset to cache them (their NRT then draws on CUDA's device "
            "malloc heap)")
    return _originals[codegen.CUDACodeLibrary, "_reduce_states"](self)


def _global(module, name):
    """The MemoryPointer of ``module``'s global ``name``, or None when the
    module has none (the driver's other errors are raised)."""
    from numba.cuda.cudadrv.driver import CudaAPIError, binding
    try:
        return module.get_global_symbol(name)[0]
    except CudaAPIError as e:
        if int(e.code) != int(binding.CUresult.CUDA_ERROR_NOT_FOUND):
            raise
        return None


def _set_up(ctx, module):
    """Give ``module`` (a kernel's, just loaded into ``ctx``) its device's
    heap descriptor, or refuse it (RuntimeError)."""
    from numba.cuda.cudadrv import driver
    device_id = ctx.device.id
    pool = _pool_of(ctx)
    heap_on = _heap_on(pool)
    if not (heap_on or _linked_heap):
        return
    symbol = _global(module, device.DESCRIPTOR_SYMBOL)
    if symbol is None:
        if heap_on and _global(module, MEMSYS_SYMBOL) is not None:
            raise RuntimeError(
                f"{SETTING} is set for GPU {device_id}, but this kernel was linked with NRT "
                "drawing on CUDA's device malloc heap (compiled before the setting, for a "
                "device without it, or read from Numba's disk cache): compile it again "
                "with the setting in force (a new cuda.jit, without cache=True)")
        return
    if not heap_on:
        raise RuntimeError(
            f"this kernel was linked with NRT served by the pool's heap ({SETTING}), but "
            f"{SETTING} is unset for GPU {device_id}: set it for that device too "
            f"(numba_alloc.configure({SETTING}=...))")
    # the heap carved for this module goes back when the global's write fails
    serve(pool, lambda address: driver.host_to_device(symbol, ctypes.c_uint64(address), 8))


def _create_module_image(self, image, setup_callbacks=None, teardown_callbacks=None):
    from numba.cuda.cudadrv import driver
    original = _originals[driver.Context, "create_module_image"]
    module = original(self, image, setup_callbacks, teardown_callbacks)
    if setup_callbacks is None:         # not a kernel's (NRT's own statistics module, ...)
        return module
    try:
        _set_up(self, module)
    except BaseException:
        self.unload_module(module)
        raise
    return module


def install():
    """Install the hooks (idempotent; not where unsupported_reason() says
    why not: the setting is refused there). Thread safe."""
    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import driver
    if nrt.unsupported_reason():
        return
    with _lock:
        for owner, name, hook in ((dispatcher._Kernel, "maybe_link_nrt", _maybe_link_nrt),
                                  (dispatcher._Kernel, "_rebuild", classmethod(_rebuild_kernel)),
                                  (driver.Context, "create_module_image",
                                   _create_module_image),
                                  (codegen.CUDACodeLibrary, "_reduce_states", _reduce_states)):
            if (owner, name) not in _originals:
                _originals[owner, name] = getattr(owner, name)
                setattr(owner, name, hook)
