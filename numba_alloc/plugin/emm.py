"""Numba's External Memory Management plugin: thin glue over the pool.

``NUMBA_CUDA_MEMORY_MANAGER=numba_alloc`` makes Numba build one
:class:`NumbaAllocManager` per context (that is, per device: Numba uses the
primary context). Constructing it with ``context=None``, as
``set_memory_manager`` does, makes no CUDA call.
"""

import contextlib
import ctypes
import threading
import weakref

from numba.cuda.cudadrv.driver import (
    AutoFreePointer,
    GetIpcHandleMixin,
    HostOnlyCUDAMemoryManager,
    MappedMemory,
    MemoryInfo,
    MemoryPointer,
    OwnedPointer,
    PinnedMemory,
    binding,
)

from . import activity, nrt_link, registry, staging
from ..backends.cuda_device import CudaDevice
from ..policy.block import LARGE
from .relocation import follow_launch_caches, pin_on_array_interface
from .relocator import NumbaRelocator


_store = dict.__setitem__          # the allocations dict's own, without UniqueDict's check
# Where the Numba objects of a block reclaimed to host memory point: the
# null address, so that a use that bypasses the reclaim hooks (one reading
# the pointer object's address directly) faults or is refused by the driver
# instead of reaching memory that may now be another block's.
PARKED = 0


def _set_address(device_pointer, address):
    """Change a CUdeviceptr's value in place (as MemoryPointer.view sets it)."""
    ctypes.c_void_p.from_address(device_pointer.getPtr()).value = address


def _close_quietly(backend):
    """Give back a failed set-up's backend memory; the set-up's own error
    is the one raised."""
    if backend is not None:
        try:
            backend.close()
        except Exception:      # noqa: BLE001 - the context frees it at teardown
            pass


class PoolPointer(AutoFreePointer):
    """The pointer memalloc returns: Numba's AutoFreePointer (freed when the
    last OwnedPointer to it goes) that knows its pool ``block``.

    So that the block can move, everything Numba reads its address from is
    one object changed in place by :meth:`relocate`: ``device_pointer`` (also
    ``handle``), and ``device_ctypes_pointer``, which returns the same
    c_size_t every time, so that every OwnedPointer caches that one object.
    Its views (:class:`PoolView`) and the launch-path caches of arrays on
    the block (relocation.MovableShim) are kept weakly, in sets made on
    first use, to be moved too; they are added and moved under the pool's
    lock."""

    offset = 0
    _views = None
    _shims = None

    def __init__(self, context, block, finalizer):
        address = block.address
        MemoryPointer.__init__(self, context, binding.CUdeviceptr(address), block.size,
                               finalizer=finalizer)
        self.refct = 0                  # all AutoFreePointer.__init__ adds, without its frame
        self.block = block
        self._ctypes_pointer = ctypes.c_size_t(address)

    @property
    def root(self):
        return self

    @property
    def device_ctypes_pointer(self):
        return self._ctypes_pointer

    def view(self, start, stop=None):
        return _view(self, self, start, stop)

    memset = activity.memset

    def add_view(self, view):
        """Move ``view`` with the block from now on (under the pool's lock)."""
        if self._views is None:
            self._views = weakref.WeakSet()
        self._views.add(view)

    def add_shim(self, shim):
        """Set ``shim.ptr`` to the block's address plus ``shim.offset`` when
        the block moves (under the pool's lock)."""
        if self._shims is None:
            self._shims = weakref.WeakSet()
        self._shims.add(shim)

    def relocate(self):
        """Follow the block to its current address, views and shims
        included; to PARKED while it is reclaimed to host memory."""
        block = self.block
        # a block that moves or comes back is live: only reclaim parks it
        address = PARKED if block.pool._is_reclaimed(block) else block.address
        _set_address(self.device_pointer, address)
        self._ctypes_pointer.value = address
        if self._views:
            for view in list(self._views):
                view.relocate()
        if self._shims:
            for shim in list(self._shims):
                shim.ptr = address + shim.offset


class PoolView(MemoryPointer):
    """A slice of a PoolPointer (``offset`` bytes into its block), built as
    MemoryPointer.view builds one, but movable with its root."""

    def __init__(self, root, offset, size):
        address = root.device_ctypes_pointer.value + offset     # PARKED + offset while reclaimed
        super().__init__(root.context, binding.CUdeviceptr(address), size, owner=root)
        self.root, self.block, self.offset = root, root.block, offset
        self._ctypes_pointer = ctypes.c_size_t(address)
        root.add_view(self)

    device_ctypes_pointer = PoolPointer.device_ctypes_pointer
    memset = activity.memset

    def view(self, start, stop=None):
        return _view(self.root, self, start, stop)

    def relocate(self):
        address = self.root.device_ctypes_pointer.value + self.offset
        _set_address(self.device_pointer, address)
        self._ctypes_pointer.value = address


def _view(root, base, start, stop):
    """MemoryPointer.view's contract for a pool pointer or view ``base``."""
    size = base.size - start if stop is None else stop - start
    if size < 0:
        raise RuntimeError("size cannot be negative")
    with root.block.pool.lock:         # no move between reading the address and registering
        return OwnedPointer(weakref.proxy(root), PoolView(root, base.offset + start, size))


def _give_back_host_block(cache, block, allocations):
    """The finalizer of a pinned or mapped host block: back to its pool's
    host cache (takes no lock, as finalizers must)."""
    def give_back():
        allocations.pop(block, None)
        cache.give_back(block)
    return give_back


def _numba_made(context):
    """Whether Numba's runtime made ``context`` (its device is Numba's
    Device, not a raw CUdevice of a Context a third party built)."""
    return hasattr(context.device, "_dev")


def _free_block(pool, block, allocations):
    """The finalizer of a PoolPointer: drop the manager's reference and hand
    the block to the pool's free_later() (a finalizer may run inside a pool
    operation, so it takes no lock). Harmless after the pool's reset (the
    block is no longer live then) and at interpreter exit (no driver call)."""
    def free():
        allocations.pop(block, None)
        pool.free_later(block)
    return free


class NumbaAllocManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Device memory from numba_alloc's pool; host memory as Numba does it."""

    is_numba_alloc = True       # what registry.resolve_pool recognises a context's manager by

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = None
        self._initializing = False
        self._lock = threading.RLock()
        self._copy_settled = False      # copy kernel loaded, or its load tried, for this pool

    def initialize(self):
        """Create the device's pool (no device memory yet). Numba calls this
        on some paths to a context and not on others, so every entry point
        that needs the pool makes it too; the context must be current. Thread
        safe: one pool, published only once its relocation hooks are in.

        A Context object that Numba's runtime did not make (a third party's,
        over a raw CUdevice, pushed to share the primary context) gets no
        pool here: it gets its own at its first allocation, and that pool is
        not the device's (numba_alloc's functions keep reporting the pool of
        Numba's own context, which the same program's arrays come from)."""
        if self.pool is None and _numba_made(self.context):
            self._make_pool()
        return self.pool

    def _make_pool(self):
        """The context's pool, made if it has none (see initialize)."""
        if self.pool is not None:
            return self.pool
        with self._lock:
            # Numba may call initialize() again from inside this one, on this
            # thread (a driver call that ensures a context): build one pool.
            if self.pool is None and not self._initializing:
                self._initializing = True
                numba_made = _numba_made(self.context)
                backend = None
                try:
                    backend = CudaDevice(self.context)
                    capacity = backend.memory_info()[1]
                    pool = (registry.create_pool(backend) if numba_made
                            else registry.unregistered_pool(backend))
                except BaseException:
                    _close_quietly(backend)
                    raise
                finally:
                    self._initializing = False
                try:
                    self._set_up(pool, numba_made)
                except BaseException:
                    registry.forget_pool(pool)
                    _close_quietly(backend)
                    raise
                self.deallocations.memory_capacity = capacity
                self.pool = pool
        return self.pool

    def _set_up(self, pool, numba_made):
        """What a new pool needs before it serves Numba."""
        pool.relocator = NumbaRelocator(self.allocations)
        self._context = weakref.proxy(self.context)     # what Numba's pointers hold
        pin_on_array_interface()
        # before reclaim's hooks: they wrap the launch caches that
        # follow moves (installed after them, these would wrap Numba's
        # own, and a launch after a move would pass the old address)
        follow_launch_caches()
        if pool.settings().reclaim:     # NUMBA_ALLOC_CONF (registry checked it)
            pool.relocator.reclaiming(pool, True)
        if numba_made:
            # numba-cuda's copies of host arrays passed to kernels come from the pool too
            staging.install(self.context.device)
        # kernels that use NRT link numba_alloc's where nrt_heap_size is set
        nrt_link.install()

    def load_copy_kernel(self):
        """Load the copy kernel (CudaDevice.load_copy_kernel), once until the
        next context reset. memalloc calls it when defrag is on, before the
        pool's lock and before the first allocation reserves an arena (also
        at the first allocation after configure(defrag=True)). A failure is
        not retried here (numba_alloc.defragment() retries); defragmentation
        is refused naming it. Not called from initialize(), which Numba may
        run under its runtime lock: compiling there would invert Numba's
        lock order (compiler lock, then runtime lock)."""
        self._copy_settled = True       # also stops re-entry from the compile's own allocations
        load = getattr(self.pool.backend, "load_copy_kernel", None)
        if load is not None:            # a CUDA device (tests stand in other backends)
            load()

    def memalloc(self, size):
        pool = self.pool or self._make_pool()
        if not self._copy_settled and pool.settings().defrag:
            self.load_copy_kernel()
        block = pool.malloc(size)
        if activity.installed():        # reclaim on: memory made during a launch joins it
            try:
                activity.joined(pool, block)
            except BaseException:
                pool.free(block)
                raise
        mem = PoolPointer(self._context, block, _free_block(pool, block, self.allocations))
        # As Numba's own manager: the manager holds the pointer, its
        # OwnedPointers count references, and the last one frees it. A live
        # block is in no other entry: no need for UniqueDict's check.
        _store(self.allocations, block, mem)
        return mem.own()

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        """Pinned (``mapped``: and mapped) host memory from the pool's host
        cache (policy/host_cache.py): reused once the GPU work queued before
        its free has finished, instead of a cuMemHostAlloc and cuMemFreeHost
        each time. Raises HostOutOfMemoryError (a MemoryError) over the
        host_cache_limit or when the host has no room."""
        pool = self.pool or self._make_pool()
        flags = ((binding.CU_MEMHOSTALLOC_DEVICEMAP if mapped else 0)
                 | (binding.CU_MEMHOSTALLOC_PORTABLE if portable else 0)
                 | (binding.CU_MEMHOSTALLOC_WRITECOMBINED if wc else 0))
        block = pool.host_cache.take(size, int(flags), mapped)
        finalizer = _give_back_host_block(pool.host_cache, block, self.allocations)
        try:
            if not mapped:
                return PinnedMemory(self._context, block.buffer, size, finalizer=finalizer)
            mem = MappedMemory(self._context, block.buffer, size, finalizer=finalizer)
        except BaseException:
            pool.host_cache.give_back(block)
            raise
        _store(self.allocations, block, mem)
        return mem.own()

    def memallocmanaged(self, size, attach_global):
        """Numba's managed memory, counted in the pool's managed_bytes and
        managed (policy/managed.py) until it is freed."""
        pool = self.pool or self._make_pool()
        owned = super().memallocmanaged(size, attach_global)
        # Numba keeps the ManagedMemory in allocations until its last owner goes
        managed = self.allocations[owned._mem.device_pointer]
        pool.managed.add(size)
        weakref.finalize(managed, pool.managed.drop_later, size)
        return owned

    def get_memory_info(self):
        """(free, total) bytes: total is the device's; free is what a new
        allocation could get, the bytes the pool holds in free, reusable
        blocks plus what it may still reserve (the device's free memory,
        within the pool's limit; with growth off, the arena its first
        allocation reserves, and nothing once it has)."""
        pool = self.pool or self._make_pool()
        with pool.lock:             # the device's and the pool's figures of one instant
            free, total = pool.backend.memory_info()
            active = pool.current("active_bytes", retire_completed=True)
            reserved = pool.current("reserved_bytes")
            settings = pool.settings()
            limit = min(settings.resolve_limit(total), total)
            if settings.growth:
                room = min(free, limit - reserved)
            elif pool.initialized:
                room = 0
            elif settings.limit is None:
                room = free - pool.backend.headroom(free)
            else:
                room = min(free, limit)
        return MemoryInfo(free=reserved - active + room, total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle for a block inside a pool segment (the segment's
        base plus the block's offset). The block is pinned in its pool (also
        another device's): it never moves; unpinned again if the export
        raises. A block in pages mapped under expandable_segments, which
        CUDA's IPC handles (cuIpcGetMemHandle: cuMemAlloc memory only) do
        not cover, first moves into a segment of its own (Pool.pin_for_export;
        the copy kernel is loaded first, outside the pool's lock, for any
        large block there: one in host memory, or in a segment of its own
        that another thread's request may reclaim before the pin, comes back
        into mapped pages)."""
        block = getattr(memory.owner, "block", None)
        if block is None:
            return super().get_ipc_handle(memory)
        pool, segment = block.pool, block.segment
        # a small block stays in the small pool's segments, never in pages
        if pool.maps_pages and (segment is None or segment.kind == LARGE):
            load = getattr(pool.backend, "load_copy_kernel", None)
            if load is not None:
                load()
        pool.pin_for_export(block)
        try:
            return super().get_ipc_handle(memory)
        except BaseException:
            pool.unpin(block)
            raise

    def reset(self):
        """Release the pool's memory (Numba's Context.reset, also from
        cuda.close() with no context current: the backend makes its own
        context current for what it calls). When the pool's reset raises,
        the manager drops the pool (a later reset asks the driver nothing;
        the next allocation makes a new pool), unloads the context's modules
        and flushes its pending deallocations (:meth:`_flush_context`), and
        re-raises."""
        super().reset()
        if self.pool is not None:
            # the context's modules are unloaded, even if the pool's reset raises
            self._copy_settled = False
            forget = getattr(self.pool.backend, "forget_copy_kernel", None)
            if forget is not None:      # a CUDA device (tests stand in other backends)
                forget()
            try:
                self.pool.reset()
            except BaseException:
                # Numba's Device.reset resets the primary context whatever this
                # raises (cuDevicePrimaryCtxReset in its finally), freeing what the
                # pool could not return, and drops a free that failed as its own
                # manager does: the pool goes, so that a retried cuda.close() asks
                # the reset context for nothing and succeeds
                self.pool = None
                self._flush_context()
                raise

    def _flush_context(self):
        """What Context.reset does after this manager's reset (which raised:
        it stops there), done now, while the context still lives: its modules
        unloaded and its pending deallocations (the pool's events among
        them) flushed. The primary context reset that follows destroys their
        handles: left queued, a retried cuda.close() would ask the reset
        context for them (CUDA_ERROR_INVALID_HANDLE). What the driver
        refuses is dropped (gone with the reset); the pool's error is raised."""
        context = self.context
        try:
            context.modules.clear()
        except Exception:      # noqa: BLE001 - the pool's error is the one raised
            pass
        pending = context.deallocations
        while True:
            try:
                pending.clear()
                return
            except Exception:      # noqa: BLE001 - that handle went bad: the next one
                continue

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, freed blocks are not made reusable."""
        with super().defer_cleanup(), (self.pool or self._make_pool()).hold_frees():
            yield

    @property
    def interface_version(self):
        return 1
