"""Making Numba's objects follow blocks that defragmentation moved, or that
reclaim brought back from host memory at a new address.

Where Numba keeps a device address, as of numba-cuda 0.30, and what happens
to it here:

* ``PoolPointer``/``PoolView`` (numba_alloc.plugin.emm): their CUdeviceptr and
  c_size_t are changed in place, which also fixes every OwnedPointer, since
  each caches the one c_size_t its pointer returns;
* ``DeviceNDArray._strided_memory_view_shim`` (a cached_property the kernel
  launch path reads): :func:`follow_launch_caches` makes a pool array's
  shim a :class:`MovableShim` registered with the block's PoolPointer,
  which sets its address when the block moves (copies of the array made by
  ``bind()`` share the shim, so they follow too);
* ``__cuda_array_interface__``: read live; but whoever reads it keeps a
  plain int, so reading it pins the block (it will never move);
  ``cuda.is_cuda_array`` (a ``hasattr`` of it, which @vectorize asks of
  every argument) answers for Numba's arrays without reading it;
* IPC handles: the manager pins a block when it exports one;
* NRT's memsys: its address lives in a device global, so it is pinned.

Before anything moves, :func:`unsupported_reason` checks these internals and
defragmentation is refused, with the reason, on a Numba whose internals
differ. Thread safety: relocation runs under the pool's lock with the device
idle; another thread that launches kernels on arrays being moved at that
moment is not covered (see docs/defragmentation.md).
"""

import functools
import inspect
from importlib.metadata import version

from numba.cuda.cudadrv import devicearray
from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase
from numba.cuda.cudadrv.driver import OwnedPointer

from ..policy.block import ALLOCATED, Block

TESTED_VERSIONS = ("0.30.4",)

# the launch-path cache's class (numba-cuda >= 0.26); a stand-in elsewhere,
# where unsupported_reason() refuses defragmentation
_Shim = getattr(devicearray, "_StridedMemoryViewShim", object)


def root_of(gpu_data):
    """The PoolPointer behind a Numba pointer (OwnedPointer, PoolPointer or
    PoolView), or None for memory numba_alloc did not allocate."""
    try:
        # an OwnedPointer's _view is the pointer it forwards attributes to:
        # reading it there skips OwnedPointer.__getattr__
        return getattr(getattr(gpu_data, "_view", gpu_data), "root", None)
    except ReferenceError:          # an OwnedPointer whose pointer was released
        return None


def block_of(gpu_data):
    """The pool block behind a Numba pointer (OwnedPointer, PoolPointer or
    PoolView), or None for memory numba_alloc did not allocate: the
    pointer's own ``block`` (a PoolView keeps its root's), not its root, a
    property. _launch.find makes the same lookup inline on every launch
    with reclaim on."""
    try:
        block = getattr(getattr(gpu_data, "_view", gpu_data), "block", None)
    except ReferenceError:          # an OwnedPointer whose pointer was released
        return None
    return block if type(block) is Block else None


def _source_contains(function, text):
    try:
        return text in inspect.getsource(function)
    except (OSError, TypeError):    # no source to read: cannot tell
        return False


@functools.cache
def unsupported_reason():
    """Why this Numba's internals cannot be fixed up after a move, or None."""
    try:
        numba_cuda = version("numba-cuda")
    except Exception:
        numba_cuda = "unknown"
    checks = (
        (lambda: isinstance(DeviceNDArrayBase.__dict__.get("_strided_memory_view_shim"),
                            functools.cached_property),
         "DeviceNDArray._strided_memory_view_shim is not a functools.cached_property"),
        (lambda: "ptr" in getattr(_Shim, "__slots__", ())
         and _source_contains(getattr(devicearray, "_to_strided_memory_view", None),
                              "obj._strided_memory_view_shim"),
         "the kernel launch path does not read the address from _StridedMemoryViewShim.ptr"),
        (lambda: _source_contains(OwnedPointer.__init__,
                                  "self.device_ctypes_pointer = self._view.device_ctypes_pointer"),
         "OwnedPointer does not cache its view's device_ctypes_pointer"),
        (lambda: _source_contains(DeviceNDArrayBase.device_ctypes_pointer.fget,
                                  "gpu_data.device_ctypes_pointer"),
         "DeviceNDArray does not read its address from gpu_data"),
    )
    for ok, problem in checks:
        if not ok():
            return (f"numba-cuda {numba_cuda} is not supported: {problem} "
                    f"(tested with {', '.join(TESTED_VERSIONS)})")
    return None


def nrt_memsys_block():
    """The block holding NRT's memsys, if Numba allocated it from the pool."""
    try:
        from numba.cuda.memory_management.nrt import rtsys
    except ImportError:
        return None
    memsys = getattr(rtsys, "_memsys", None)
    return None if memsys is None else block_of(memsys.gpu_data)


class MovableShim(_Shim):
    """The launch-path cache of a pool array: ``offset`` bytes into its
    block, its ``ptr`` set by the block's PoolPointer when the block moves."""

    __slots__ = ("offset", "__weakref__")


_MISSING = object()


class _FollowingShim(functools.cached_property):
    """DeviceNDArray._strided_memory_view_shim once follow_launch_caches()
    has wrapped it. Its ``__get__`` takes no lock, as from Python 3.12: up
    to 3.11 cached_property holds one lock for every instance while it
    computes, and computing takes the pool's lock, while a defragmentation
    holds the pool's lock and launches kernels, which read this property
    (a deadlock). Two threads computing at once both get a valid shim."""

    follows_moves = True

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        cache = instance.__dict__
        value = cache.get(self.attrname, _MISSING)
        if value is _MISSING:
            value = cache[self.attrname] = self.func(instance)
        return value


def follow_launch_caches():
    """Make the launch-path cache of every pool array computed from now on a
    :class:`MovableShim` its PoolPointer keeps (weakly) and moves. It is
    computed under the pool's lock, so that no move falls between reading
    the address and registering the shim. Other arrays are unaffected.
    Idempotent; does nothing where unsupported_reason() refuses moves."""
    current = DeviceNDArrayBase.__dict__.get("_strided_memory_view_shim")
    if getattr(current, "follows_moves", False) or unsupported_reason() is not None:
        return
    compute = current.func

    def shim(self):
        root = root_of(self.gpu_data)
        if root is None:
            return compute(self)
        block = root.block
        with block.pool.lock:
            cached = compute(self)
            if block.state is not ALLOCATED:
                return cached
            movable = MovableShim(ptr=cached.ptr, shape=cached.shape, dtype=cached.dtype,
                                  size=cached.size, _layout=cached._layout)
            movable.offset = cached.ptr - block.address
            root.add_shim(movable)
            return movable

    shim.__doc__ = compute.__doc__
    following = _FollowingShim(shim)
    following.__set_name__(DeviceNDArrayBase, "_strided_memory_view_shim")
    DeviceNDArrayBase._strided_memory_view_shim = following


def pin_on_array_interface():
    """Make reading a pool array's ``__cuda_array_interface__`` pin its block:
    the reader (CuPy, PyTorch, cuda-python, ...) keeps the address as an int.
    Idempotent; other managers' arrays are unaffected."""
    current = DeviceNDArrayBase.__cuda_array_interface__
    if getattr(current.fget, "_numba_alloc_pins", False):
        return
    read = current.fget

    def interface(self):
        block = block_of(self.gpu_data)
        if block is None:
            return read(self)
        # under the lock: not while another thread brings the block back or moves it
        with block.pool.lock:
            if block.state is ALLOCATED:
                block.pool.pin(block)    # for good: a later unpin() must not free it to move
            return read(self)

    interface._numba_alloc_pins = True
    DeviceNDArrayBase.__cuda_array_interface__ = property(interface, doc=current.__doc__)
    _answer_is_cuda_array()


def _answer_is_cuda_array():
    """``cuda.is_cuda_array`` (``hasattr`` of the interface: @vectorize asks
    it of every argument) answers for Numba's own arrays without reading
    the interface, which would pin them for good."""
    from numba import cuda
    from numba.cuda import api
    current = getattr(api, "is_cuda_array", None)
    if current is None or getattr(current, "_numba_alloc_pins", False):
        return

    def is_cuda_array(obj):
        return isinstance(obj, DeviceNDArrayBase) or current(obj)

    is_cuda_array.__doc__ = current.__doc__
    is_cuda_array._numba_alloc_pins = True
    api.is_cuda_array = is_cuda_array
    if getattr(cuda, "is_cuda_array", None) is current:
        cuda.is_cuda_array = is_cuda_array
