"""What makes a pool array *active* under the Numba plugin (the ``reclaim``
setting): kernel launches, copies and address reads.

With reclaim on, a pool may move an inactive block to host memory when it
needs room; the block's Numba objects point at the null address until it
comes back (reclaim.bring_back: a new address, which every PoolPointer,
view and launch cache follows, as after a defragmentation). These hooks into
numba-cuda 0.30, installed while a Numba pool has reclaim on (or still has
blocks in host memory) and removed when none has, bring pool arrays back
before Numba reads their addresses:

* ``dispatcher._Kernel.launch``: the pool arrays among a launch's arguments
  (top level, inside tuples and ``cuda.In``/``Out``/``InOut``) are brought
  back and made active together, per pool (:meth:`Pool.use`: all or none),
  before ``_prepare_args`` reads their addresses; arrays found only then
  (made by an argument extension, or in containers ``_launch.find`` does
  not open) join through the launch cache (``_launch.ActiveShim``), as do blocks
  allocated from the pool during the launch. They stay protected after it
  until the pool next synchronizes the device (reclaim does before it
  takes a block whose last use may still have work queued: policy
  residency.py): no event is recorded per launch.
* ``driver.host_to_device``, ``device_to_host``, ``device_to_device`` and
  ``device_memset`` (behind ``copy_to_host``, ``copy_to_device``,
  ``cuda.to_device(..., to=)``, indexing and ``__setitem__``), and
  ``PoolPointer.memset``: their pool operands, the same way.
* ``DeviceNDArrayBase.device_ctypes_pointer`` (address reads, and the
  copies' own reads): a reclaimed array comes back first; read while a
  launch prepares its arguments (an argument extension passing an address),
  the array joins that launch. Read elsewhere, the address is good while
  the block stays resident, that is until a request may reclaim it again:
  keep using it inside a launch, a copy or :meth:`Pool.use`.

Work queued on a pool's arrays before the hooks tracked them (before its
reclaim was on) is unknown to them: reclaim takes nothing from the pool
while a thread (this one too) is still inside a launch, copy or memset
begun before that (:func:`settle`), and then the device is synchronized
once.

Readers of ``__cuda_array_interface__`` and IPC exports pin the block
(relocation.py), so it is brought back and never reclaimed again. The
device synchronization that ends the protection of a launch's or an
asynchronous copy's arrays covers work on every stream, non-blocking ones
too; a synchronous copy leaves none queued. The copies that bring blocks
back are queued on the legacy default stream; for work on another stream,
or queued while another device is current (Numba queues it in that
device's context, whose streams do not follow this one's), the host waits
for them first, whichever use brought the blocks back (reclaim.begin_use),
not for work on the legacy one of the pool's device (``_launch.ordered``,
Backend.is_current).

A launch's cost is kept low (benchmarks/bench_launch_hooks.py measures
it): finding its arrays and the launch cache's reads are compiled
(_launch.pyx), its scalars are skipped by type, each pool's blocks are
made active under one acquisition of its lock and inactive under one more,
each in one compiled call (policy core_uses.pxi), and nothing calls the
driver.

:func:`unsupported_reason` checks these internals first; the pool refuses
``reclaim`` under the plugin, naming the reason, where they differ. Thread
safe: the hooks take each pool's lock through Pool.use and Pool.pin, and
install/uninstall under a module lock.
"""

import functools
import inspect
import sys
import threading
import weakref

from numba.cuda import dispatcher as _dispatcher
from numba.cuda.cudadrv import driver as _driver
from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase

from ..policy import residency
from . import relocation
from ._launch import ActiveShim, Uses, launch_uses
from ._launch import find as _find
from ._launch import needed as _needed
from ._launch import ordered as _ordered
from ._launch import scope as _scope
from .relocation import block_of

_COPIES = ("host_to_device", "device_to_host", "device_to_device")

_lock = threading.Lock()            # installs and uninstalls
_pools = weakref.WeakSet()          # the Numba pools that have had reclaim on
_originals = {}                     # (owner, name) -> what the hook replaced
_epoch = 0                          # how many times a pool's reclaim has turned on
# pool -> the _epoch its reclaim turned on at, for the pools whose work begun
# before then (untracked) may still be running
_unsettled = weakref.WeakKeyDictionary()


def _parameters(function):
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


@functools.cache
def unsupported_reason():
    """Why reclaim cannot run under this Numba's plugin, or None."""
    reason = relocation.unsupported_reason()
    if reason:
        return reason
    launch = getattr(getattr(_dispatcher, "_Kernel", None), "launch", None)
    checks = [
        (launch is not None and _parameters(launch)[:6]
         == ("self", "args", "griddim", "blockdim", "stream", "sharedmem")
         and relocation._source_contains(launch, "self._prepare_args("),
         "_Kernel.launch(self, args, griddim, blockdim, stream, sharedmem) does not prepare "
         "its arguments itself"),
        (isinstance(DeviceNDArrayBase.__dict__.get("device_ctypes_pointer"), property),
         "DeviceNDArrayBase.device_ctypes_pointer is not a property"),
        (relocation._source_contains(DeviceNDArrayBase.copy_to_host, "_driver.device_to_host(")
         and relocation._source_contains(DeviceNDArrayBase.copy_to_device,
                                         "_driver.host_to_device("),
         "DeviceNDArray's copies do not call the driver module's copy functions"),
    ]
    for name, params in [(name, ("dst", "src", "size", "stream")) for name in _COPIES] + [
            ("device_memset", ("dst", "val", "size", "stream"))]:
        checks.append((_parameters(getattr(_driver, name, None)) == params,
                       f"driver.{name} does not take ({', '.join(params)})"))
    for ok, problem in checks:
        if not ok:
            return (f"reclaim under the Numba plugin: {problem} "
                    f"(tested with numba-cuda {', '.join(relocation.TESTED_VERSIONS)})")
    return None


def joined(pool, block):
    """A block memalloc just allocated from ``pool``: active until the end
    of the launch running on this thread, if one is (memory an argument
    extension allocates while the launch prepares its arguments; numba-cuda
    0.30 copies host arrays to memory outside the plugin)."""
    current = _scope()
    if current is not None and pool._settings.reclaim:
        current.join(pool, block)


def _hooked_launch(launch):
    @functools.wraps(launch)
    def hooked(self, args, griddim, blockdim, stream=0, sharedmem=0):
        epoch = _epoch          # read by _issuing: what this launch tracks  # noqa: F841
        uses = launch_uses(args, stream)              # this thread's scope until closed
        try:
            return launch(self, args, griddim, blockdim, stream, sharedmem)
        finally:
            uses.close()
    return hooked


def _copying(operands, stream, call, *args):
    """``call(*args)``, a copy or memset queued on ``stream`` (0: it is
    synchronous), with the pool blocks behind ``operands`` active."""
    epoch = _epoch              # read by _issuing: what this call tracks  # noqa: F841
    found = {}
    _find(operands, found)
    if not found:
        return call(*args)
    uses = Uses(found, not stream, _ordered(stream))
    try:
        return call(*args)
    finally:
        uses.close()


def _hooked_copy(copy):
    def hooked(dst, src, size, stream=0):
        return _copying((dst, src), stream, copy, dst, src, size, stream)
    return functools.wraps(copy)(hooked)


def _hooked_memset(memset):
    def hooked(dst, val, size, stream=0):
        return _copying((dst,), stream, memset, dst, val, size, stream)
    return functools.wraps(memset)(hooked)


def _resident(block):
    """Bring ``block`` back if it is reclaimed (pin then unpin: no event)."""
    pool = block.pool
    if pool._is_reclaimed(block):
        with pool.lock:
            if pool._is_reclaimed(block):
                pool.pin(block)
                pool.unpin(block)


def _used(block, scope):
    """A pool ``block`` (or None) read for its address: it joins the launch
    running on this thread (``scope``, or None), else comes back if it is
    reclaimed (outside a launch, a block that is not costs a lookup)."""
    if block is None:
        return
    if scope is not None:
        if _needed(block.pool):
            scope.join(block.pool, block)
    elif block in block.pool._residency.reclaimed:
        _resident(block)


def _activate(array, scope):
    """An ``array`` read by ActiveShim outside what the launch running on
    this thread (``scope``, or None) holds: it joins that launch, or comes
    back from host memory outside one. A safety net behind ``_launch.find``
    (inside any tuple, or made by an argument extension)."""
    _used(block_of(array.gpu_data), scope)


def _hooked_address(read):
    def device_ctypes_pointer(self):
        _used(block_of(self.gpu_data), _scope())
        return read(self)
    device_ctypes_pointer.__doc__ = read.__doc__
    return property(device_ctypes_pointer)


def memset(pointer, byte, count=None, stream=0):
    """MemoryPointer.memset for a pool pointer or view: its block active."""
    _copying((pointer,), stream, _driver.MemoryPointer.memset, pointer, byte, count, stream)


def _hooks():
    """(owner, name, make the hook from what is there)."""
    return ([(_dispatcher._Kernel, "launch", _hooked_launch)]
            + [(_driver, name, _hooked_copy) for name in _COPIES]
            + [(_driver, "device_memset", _hooked_memset)]
            + [(DeviceNDArrayBase, "device_ctypes_pointer",
                lambda prop: _hooked_address(prop.fget)),
               (DeviceNDArrayBase, "_strided_memory_view_shim",
                lambda following: ActiveShim(following, _activate))])


def installed():
    """Whether the hooks are in place."""
    return bool(_originals)


def keeps_in_place(pool):
    """Whether a launch's arrays from ``pool`` stay in place while it runs,
    so that a request it makes may move the pool's other blocks: the hooks
    are installed, watch this pool's blocks, and no call that they did not
    track may still be issuing work on it (:func:`settle`: this launch too,
    when it began before the pool's reclaim turned on). Takes the pool's
    lock; hold it until the request is made."""
    if not (_originals and _needed(pool)):
        return False
    with pool.lock:
        return settle(pool)


def preparing_arguments():
    """Whether this thread is inside numba-cuda's kernel launch preparing
    its arguments (``_Kernel._prepare_args``: the arguments before have had
    their addresses read, and the kernel is not queued yet): a request made
    there (an argument extension's, the staging of host arrays) comes from
    that launch. Not while it loads its module (get_cufunc, before any
    argument is read). Walks this thread's frames: for the paths that would
    move blocks only."""
    code = getattr(_dispatcher._Kernel.__dict__.get("_prepare_args"), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def reclaiming(pool, on):
    """A Numba ``pool`` turned reclaim on or off (``on`` is its setting
    now). The hooks are installed while some pool needs them (_needed;
    unsupported_reason() must be None): after reclaim is turned off they
    stay until its reclaimed blocks are back or freed, seen at a later call."""
    global _epoch
    with _lock:
        _pools.add(pool)
        if on:
            _epoch += 1
            _unsettled[pool] = _epoch
        needed = any(_needed(p) for p in list(_pools))
        if needed and not _originals:
            for owner, name, hook in _hooks():
                current = owner.__dict__[name]
                _originals[owner, name] = current
                setattr(owner, name, hook(current))
        elif not needed and _originals:
            for (owner, name), original in _originals.items():
                setattr(owner, name, original)
            _originals.clear()


def _issuing(since):
    """Whether a thread (this one too) is inside a launch, copy or memset
    that did not track the arrays of a pool whose reclaim turned on at epoch
    ``since``: one begun without the hooks, or through them before then. It
    may have read its arguments' addresses and not yet queued the work. Such
    a call has a frame of a function the hooks wrap whose caller is not a
    hook (:func:`_hooked_launch`, :func:`_copying`) holding a later epoch."""
    wrapped = [*_originals.values(), _driver.MemoryPointer.memset]
    codes = {f.__code__ for f in wrapped if hasattr(f, "__code__")}
    hooks = {_copying.__code__, _dispatcher._Kernel.__dict__["launch"].__code__}
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code in codes:
                caller = frame.f_back
                if (caller is None or caller.f_code not in hooks
                        or caller.f_locals.get("epoch", 0) < since):
                    return True
            frame = frame.f_back
    return False


def settle(pool):
    """Whether reclaim may take ``pool``'s blocks now (under its lock,
    before reclaim picks victims). Once after its reclaim turned on: False
    while a call that did not track its arrays may still be issuing work
    (:func:`_issuing`); then the device is synchronized, so that the work
    queued before they were tracked has completed."""
    since = _unsettled.get(pool)
    if since is None:
        return True
    if _issuing(since):
        return False
    pool._pending.synchronize()
    residency.device_idle(pool, True)      # untracked work: any device's
    _unsettled.pop(pool, None)
    return True
