# cython: language_level=3
"""The reclaim hooks' work on every kernel launch (activity.py), compiled
ahead of time (Cython, when the package is installed) because it runs
inside numba-cuda's launch path: finding the reclaiming pools' blocks
among a launch's arguments (:func:`find`), making them active for the
launch (:class:`Uses`), and the launch-path cache's descriptor through
which an array read while a launch prepares its arguments joins it
(:class:`ActiveShim`). activity.py says what they are for; the code here
only makes them cheap. Thread safe: no state shared between threads (a
Uses belongs to the thread that made it).
"""

import numpy as np
from numba.cuda.args import ArgHint
from numba.cuda.cudadrv.driver import binding

from ..policy.core import Block

# argument types that are never device memory: a launch's scalars skip the
# attribute lookups below
cdef frozenset _SCALARS = frozenset({
    int, float, bool, complex, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
    np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
    np.bool_})


# the legacy default stream's handles
cdef frozenset _LEGACY = frozenset({0, int(binding.CU_STREAM_LEGACY)})


def ordered(stream):
    """``stream`` as Pool._begin_use takes it: 0 for the legacy default
    stream (0, or a stream object of handle 0 or CU_STREAM_LEGACY, which
    numba-cuda's launch passes for stream 0), else the stream."""
    if not stream:
        return 0
    cuda_stream = getattr(stream, "__cuda_stream__", None)
    if cuda_stream is not None and int(cuda_stream()[1]) in _LEGACY:
        return 0
    return stream


cpdef bint needed(pool):
    """Whether ``pool`` needs the hooks: reclaim is on, or blocks it
    reclaimed before it was turned off are still in host memory."""
    return pool._settings.reclaim or bool(pool._residency.reclaimed)


def find(values, dict found, set arrays=None):
    """Add the blocks of pools that need the hooks behind ``values``
    (arrays, pointers, argument hints, tuples of them: namedtuples too, as
    Numba recurses into them) to ``found`` (pool -> {block: None}), and the
    ids of the values they are behind to ``arrays``."""
    for value in values:
        if type(value) in _SCALARS:
            continue
        if not getattr(value, "__cuda_memory__", False):
            if isinstance(value, tuple):
                find(value, found, arrays)
                continue
            if not isinstance(value, ArgHint):
                continue                # not Numba's device memory (a host array)
            value = value.value
            if not getattr(value, "__cuda_memory__", False):
                continue
        # the pool block behind the pointer (relocation.block_of): an
        # OwnedPointer's _view is the pointer it forwards attributes to
        pointer = getattr(value, "gpu_data", value)
        try:
            block = getattr(getattr(pointer, "_view", pointer), "block", None)
        except ReferenceError:          # an OwnedPointer whose pointer was released
            continue
        if type(block) is not Block:
            continue
        pool = block.pool
        blocks = found.get(pool)
        if blocks is None:
            if not needed(pool):
                continue
            blocks = found[pool] = {}
        blocks[block] = None
        if arrays is not None:
            arrays.add(id(value))


cdef class Uses:
    """Blocks made active (as in Pool.use) until :meth:`close`; making those
    ``found`` (pool -> {block: None}, not changed after) active is all or
    none. ``completed``: their work is done when close() runs (a synchronous
    copy); else it was queued on ``stream`` (as Pool._begin_use takes it).
    ``arrays``: the ids of the arrays whose blocks are among ``found``
    (alive meanwhile). With ``local`` (a threading.local), it is that
    thread's ``scope`` (the launch running on it) until close(), which puts
    back the one before."""

    cdef list _held                     # (pool, {block: None}) to end the use of
    cdef readonly object arrays
    cdef bint _completed
    cdef object _stream, _local, _outer

    def __init__(self, dict found, bint completed=False, stream=0, arrays=frozenset(),
                 local=None):
        self._held = []
        self.arrays = arrays
        self._completed, self._stream = completed, stream
        if len(found) == 1:             # the common case: one pool, nothing to undo
            for pool, blocks in found.items():
                self._held.append((pool, pool._begin_use(blocks, stream)))
        else:
            try:
                for pool, blocks in found.items():
                    self._held.append((pool, pool._begin_use(blocks, stream)))
            except BaseException:
                try:
                    self.close()
                except BaseException:       # the first error is the one raised
                    pass
                raise
        if local is not None:
            self._local, self._outer = local, getattr(local, "scope", None)
            local.scope = self

    def join(self, pool, block):
        """Make ``block`` active until :meth:`close` too (once)."""
        for held, blocks in self._held:
            if held is pool and block in blocks:
                return
        self._held.append((pool, pool._begin_use({block: None}, self._stream)))

    def close(self):
        """End every use, even when one raises (the first error is raised)."""
        cdef list held = self._held
        error = None
        if self._local is not None:
            self._local.scope = self._outer
            self._local = self._outer = None
        if len(held) == 1:              # the common case: one pool
            pool, handles = held.pop()
            pool._end_use(handles, self._completed)
            return
        while held:
            pool, handles = held.pop()
            try:
                pool._end_use(handles, self._completed)
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error


def launch_uses(args, stream, local):
    """The :class:`Uses` of a kernel launch of ``args`` (:func:`find`) on
    ``stream``, the thread's scope in ``local`` until it is closed."""
    cdef dict found = {}
    cdef set arrays = set()
    find(args, found, arrays)
    return Uses(found, False, ordered(stream), arrays, local)


cdef class ActiveShim:
    """DeviceNDArray's launch-path cache (``following``: relocation's
    descriptor, which follows moves) as a data descriptor, so that every
    read sees the array: unless the launch running on this thread (the
    ``scope`` attribute of the threading.local ``local``) already holds it
    (a :class:`Uses`: its id among the scope's ``arrays``), ``activate(array, scope)`` runs
    first (the array joins that launch, or comes back from host memory
    outside one). Then the cached value, or ``following``'s."""

    follows_moves = True        # relocation.follow_launch_caches: already installed

    cdef object _following, _local, _activate
    cdef str _name

    def __init__(self, following, local, activate):
        self._following, self._local, self._activate = following, local, activate
        self._name = following.attrname

    def __get__(self, instance, owner):
        if instance is None:
            return self
        scope = getattr(self._local, "scope", None)
        if scope is None or id(instance) not in (<Uses>scope).arrays:
            self._activate(instance, scope)
        cached = instance.__dict__.get(self._name)
        return self._following.__get__(instance, owner) if cached is None else cached

    def __set__(self, instance, value):
        instance.__dict__[self._name] = value

    def __delete__(self, instance):
        try:
            del instance.__dict__[self._name]
        except KeyError:
            raise AttributeError(self._name) from None
