# cython: language_level=3
"""The reclaim hooks' work on every kernel launch (activity.py), compiled
ahead of time (Cython, when the package is installed) because it runs
inside numba-cuda's launch path: finding the reclaiming pools' blocks
among a launch's arguments (:func:`find`), making them active for the
launch (:class:`Uses`), and the launch-path cache's descriptor through
which an array read while a launch prepares its arguments joins it
(:class:`ActiveShim`), and the thread's current launch (:func:`scope`,
kept in a C thread-specific slot: a threading.local's lookup costs more
than the rest of a read of the cache). activity.py says what they are for;
the code here only makes them cheap. Thread safe: no state shared between
threads (a Uses belongs to the thread that made it).
"""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject_GenericGetAttr, PyObject_GenericGetDict
from cpython.pythread cimport PyThread_tss_create, PyThread_tss_get, PyThread_tss_set
from cpython.ref cimport Py_DECREF, Py_INCREF

import numpy as np
from numba.cuda.args import ArgHint
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.cudadrv.driver import OwnedPointer, binding

from ..policy.core import Block
from ..policy.core import begin_uses as _begin_uses
from ..policy.core import end_uses as _end_uses
from ..policy.pool import Pool
from ..policy.reclaim import ACTIVE_BYTES as _ACTIVE_BYTES

# argument types that are never device memory: a launch's scalars skip the
# attribute lookups below
cdef frozenset _SCALARS = frozenset({
    int, float, bool, complex, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
    np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
    np.bool_})


# stream 0's handles (the legacy default stream, or under
# CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 the thread's per-thread one)
cdef frozenset _LEGACY = frozenset({0, int(binding.CU_STREAM_LEGACY)})


cpdef ordered(stream):
    """``stream`` as Pool._begin_use takes it: 0 for stream 0 (0, or a
    stream object of handle 0 or CU_STREAM_LEGACY, which numba-cuda's
    launch passes for stream 0; either stream it may be, the legacy one or
    the thread's per-thread one, runs after the legacy stream's earlier
    work), else the stream."""
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


# the thread's current launch: a strong reference to its Uses, or NULL
cdef Py_tss_t _scope
if PyThread_tss_create(&_scope):
    raise MemoryError("no thread-specific storage key for the launch scope")


cpdef scope():
    """The :class:`Uses` of the launch running on this thread (the
    innermost, for a launch made while another prepares its arguments), or
    None."""
    cdef void *current = PyThread_tss_get(&_scope)
    return None if current == NULL else <object>current


cdef int _set_scope(object uses) except -1:
    """Make ``uses`` (a Uses, or None) this thread's scope, releasing the
    reference the slot held."""
    cdef void *previous = PyThread_tss_get(&_scope)
    cdef void *now = NULL
    if uses is not None:
        Py_INCREF(uses)
        now = <void *>uses
    if PyThread_tss_set(&_scope, now):
        if now != NULL:
            Py_DECREF(uses)
        raise MemoryError("cannot set the launch scope")
    if previous != NULL:
        Py_DECREF(<object>previous)
    return 0


cdef object _pointer_view(object pointer):
    """What an OwnedPointer forwards attributes to (its ``_view``), read
    without its ``__getattr__`` hook; another pointer is its own view."""
    if type(pointer) is OwnedPointer:
        return PyObject_GenericGetAttr(pointer, "_view")
    return getattr(pointer, "_view", pointer)


def find(values, dict found, list arrays=None):
    """Add the blocks of pools that need the hooks behind ``values``
    (arrays, pointers, argument hints, tuples of them: namedtuples too, as
    Numba recurses into them) to ``found`` (pool -> the list of its
    distinct blocks), and the values they are behind to ``arrays``."""
    _find(values, found, arrays)


cdef int _find(values, dict found, list arrays) except -1:
    for value in values:
        kind = type(value)
        if kind is float or kind is int or kind in _SCALARS:
            continue
        # Numba's device arrays (__cuda_memory__, a class attribute) skip the lookup
        if kind is not DeviceNDArray and not getattr(value, "__cuda_memory__", False):
            if isinstance(value, tuple):
                _find(value, found, arrays)
                continue
            if not isinstance(value, ArgHint):
                continue                # not Numba's device memory (a host array)
            value = value.value
            if not getattr(value, "__cuda_memory__", False):
                continue
        # the pool block behind the pointer (relocation.block_of): an
        # OwnedPointer's _view is the pointer it forwards attributes to; a
        # device array's own attributes are in its __dict__, read directly
        pointer = None
        if kind is DeviceNDArray:
            pointer = (<dict>PyObject_GenericGetDict(value, NULL)).get("gpu_data")
        if pointer is None:
            pointer = getattr(value, "gpu_data", value)
        try:
            block = getattr(_pointer_view(pointer), "block", None)
        except ReferenceError:          # an OwnedPointer whose pointer was released
            continue
        if type(block) is not Block:
            continue
        pool = block.pool
        blocks = found.get(pool)
        if blocks is None:
            if not needed(pool):
                continue
            blocks = found[pool] = []
        if not _holds(blocks, block):
            (<list>blocks).append(block)
        if arrays is not None:
            arrays.append(value)
    return 0


cdef bint _holds(list values, value):
    """Whether ``value`` is (itself) one of ``values``: a launch's arrays
    and blocks are few, compared in C."""
    cdef Py_ssize_t i
    for i in range(PyList_GET_SIZE(values)):
        if <void *>PyList_GET_ITEM(values, i) == <void *>value:
            return True
    return False


cdef class Uses:
    """Blocks made active (as in Pool.use) until :meth:`close`; making those
    ``found`` (pool -> its distinct blocks, a list or a dict's keys, not
    changed after) active is all or none. ``completed``: their work is done
    when close() runs (a synchronous copy); else it was queued on
    ``stream`` (as Pool._begin_use takes it). ``arrays``: the arrays (a
    list, held meanwhile) whose blocks are among ``found``. With
    ``scoped``, it is this thread's :func:`scope` (the launch running on it)
    until close(), which puts back the one before."""

    cdef list _held                     # (pool, its blocks) to end the use of
    cdef readonly list arrays
    cdef bint _completed, _scoped
    cdef object _stream, _outer

    def __init__(self, dict found, bint completed=False, stream=0, list arrays=None,
                 bint scoped=False):
        self._begin(found, completed, stream, arrays, scoped)

    cdef int _begin(self, dict found, bint completed, stream, list arrays,
                    bint scoped) except -1:
        self._held = []
        self.arrays = [] if arrays is None else arrays
        self._completed, self._stream = completed, stream
        if len(found) == 1:             # the common case: one pool, nothing to undo
            for pool, blocks in found.items():
                self._held.append((pool, _begin_use(pool, blocks, stream)))
        else:
            try:
                for pool, blocks in found.items():
                    self._held.append((pool, _begin_use(pool, blocks, stream)))
            except BaseException:
                try:
                    self.close()
                except BaseException:       # the first error is the one raised
                    pass
                raise
        if scoped:
            self._outer = scope()
            _set_scope(self)
            self._scoped = True
        return 0

    def join(self, pool, block):
        """Make ``block`` active until :meth:`close` too (once)."""
        for held, blocks in self._held:
            if held is pool and block in blocks:
                return
        self._held.append((pool, _begin_use(pool, [block], self._stream)))

    def close(self):
        """End every use, even when one raises (the first error is raised)."""
        cdef list held = self._held
        error = None
        if self._scoped:
            self._scoped = False
            _set_scope(self._outer)
            self._outer = None
        if len(held) == 1:              # the common case: one pool
            pool, handles = held.pop()
            _end_use(pool, handles, self._completed)
            return
        while held:
            pool, handles = held.pop()
            try:
                _end_use(pool, handles, self._completed)
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error


def launch_uses(args, stream):
    """The :class:`Uses` of a kernel launch of ``args`` (:func:`find`) on
    ``stream``, the thread's :func:`scope` until it is closed."""
    cdef dict found = {}
    cdef list arrays = []
    cdef Uses uses = Uses.__new__(Uses)
    _find(args, found, arrays)
    uses._begin(found, False, ordered(stream), arrays, True)
    return uses


cdef object _begin_use(pool, blocks, stream):
    """``pool._begin_use(blocks, stream)``, for a Pool in the common case
    (policy/uses.py: no frees deferred, no block reclaimed, nothing to wait
    for) made here, without a Python call: the same steps under its lock.
    Those attributes of a Pool are plain instance attributes, read from its
    ``__dict__`` (not looked up through its many classes first)."""
    if type(pool) is not Pool:
        return pool._begin_use(blocks, stream)
    cdef dict attributes = PyObject_GenericGetDict(pool, NULL)
    with attributes["_lock"]:
        r = attributes["_residency"]
        if attributes["_deferred"] or r.reclaimed or (
                r.arrival is not None and (stream or not attributes["backend"].is_current())):
            return pool._begin_use(blocks, stream)
        wrong = _begin_uses(attributes["_p"], pool, blocks, attributes["_handles"], r.active,
                            True, _ACTIVE_BYTES)
        if wrong is not None:
            pool._allocated_row(wrong, "use")       # raises, naming the block
    return blocks


cdef object _end_use(pool, handles, bint completed):
    """``pool._end_use(handles, completed)``, for a Pool made here as
    :func:`_begin_use` does (policy/uses.py: one compiled call under its
    lock)."""
    if type(pool) is not Pool:
        return pool._end_use(handles, completed)
    cdef dict attributes = PyObject_GenericGetDict(pool, NULL)
    with attributes["_lock"]:
        r = attributes["_residency"]
        _end_uses(attributes["_p"], handles, attributes["_handles"], r.active, r.last_use,
                  r.epoch, completed, _ACTIVE_BYTES)


cdef class ActiveShim:
    """DeviceNDArray's launch-path cache (``following``: relocation's
    descriptor, which follows moves) as a data descriptor, so that every
    read sees the array: unless the launch running on this thread (its
    :func:`scope`) already holds it (among the scope's ``arrays``),
    ``activate(array, scope)`` runs first (the array joins that launch, or
    comes back from host memory outside one). Then the cached value, or
    ``following``'s."""

    follows_moves = True        # relocation.follow_launch_caches: already installed

    cdef object _following, _activate
    cdef str _name

    def __init__(self, following, activate):
        self._following, self._activate = following, activate
        self._name = following.attrname

    def __get__(self, instance, owner):
        if instance is None:
            return self
        cdef void *current = PyThread_tss_get(&_scope)
        if current == NULL:
            self._activate(instance, None)
        elif not _holds((<Uses>current).arrays, instance):
            self._activate(instance, <object>current)
        cdef dict cache = PyObject_GenericGetDict(instance, NULL)
        cached = cache.get(self._name)
        return self._following.__get__(instance, owner) if cached is None else cached

    def __set__(self, instance, value):
        instance.__dict__[self._name] = value

    def __delete__(self, instance):
        try:
            del instance.__dict__[self._name]
        except KeyError:
            raise AttributeError(self._name) from None
