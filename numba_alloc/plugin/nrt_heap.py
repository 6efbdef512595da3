"""The device heap that serves NRT (``np.empty`` and the like inside
kernels) for one pool under the ``nrt_heap_size`` setting, instead of
CUDA's device malloc heap.

Two pinned blocks of the pool, never moved by defragmentation nor
reclaimed: a :class:`NrtDeviceHeap` (a DeviceHeap: its pages and its
bookkeeping, with the counters in device memory) and the descriptor
kernels read it through (device/nrt_heap.py: the heap's data address and
bytes, its meta address and words), whose address every loaded module
linked with NRT served by the heap holds in a global (plugin/nrt_link.py).
The descriptor stays where it is for the pool's life; a new
``nrt_heap_size`` replaces the heap behind it between launches
(:meth:`NrtHeap.replacement`, :meth:`NrtHeap.install`: the pool's
check_settings and commit). The heap is carved when the first kernel linked
with it is loaded on the device (:func:`heap_of`), so a program that never
uses NRT holds nothing.

Statistics: ``nrt.*`` in memory_stats (numba_alloc.policy.counters.NRT_HEAP_COUNTERS,
read without waiting for kernels still running), counted since the first
heap (a replaced heap's figures are kept), and :meth:`NrtHeap.stats` per
size class. Thread safe: everything runs under the pool's lock, but the
reads of :meth:`NrtHeap.stats`, which go round it.
"""

import numpy as np

from ..device import nrt_heap as device
from ..backends.simulated import SimulatedDevice
from .device_heap import DeviceHeap

_SUMMED = ("num_allocs", "num_frees", "num_failed", "num_invalid_frees")


class NrtDeviceHeap(DeviceHeap):
    """A DeviceHeap that serves NRT: counted in ``nrt.*``, not in
    ``device_heap.*``. ``announced=False``: carved as a replacement, which
    the pool's observers hear of only once it serves (:meth:`NrtHeap.adopt`)
    and which goes back as if never carved otherwise (:meth:`discard`)."""

    serves_nrt = True

    def __init__(self, size, pool, classes=DeviceHeap.default_classes, announced=True):
        self._announced = announced
        super().__init__(size, pool, classes)

    def discard(self):
        """Give back a replacement that will not serve, as if never carved
        (under the pool's lock, held since it was carved)."""
        self._withdraw()


def write_words(backend, address, words):
    """Write the int64 ``words`` to device memory at ``address`` (a block of
    ``backend``'s), synchronously."""
    words = np.asarray(words, np.int64)
    if isinstance(backend, SimulatedDevice):
        backend.write(address, words)
        return
    with backend.in_context():
        backend._array(address, words.shape, np.int64).copy_to_device(words)


class NrtHeap:
    """NRT's heap for ``pool`` (a :class:`~numba_alloc.Pool`): a heap of
    ``size`` bytes (rounded up to 64 KiB pages) and its descriptor. All or
    nothing: raises the pool's OutOfMemoryError (or a failing driver call's
    error) with the pool as before. Call under the pool's lock.
    ``announced=False``: carved unannounced, for :meth:`_announce` once what
    needs it has succeeded, or :meth:`_discard` (as if never carved), under
    the pool's lock held since."""

    def __init__(self, pool, size, announced=True):
        self._pool = pool
        self._retired = dict.fromkeys((*_SUMMED, "peak_bytes_in_use"), 0)
        self._switched = None       # (heap, its predecessor's counters) between switch and adopt
        with pool.lock:
            # carved unannounced, so that a failure below gives it back as if
            # never carved (its segment too), and the observers hear of
            # nothing
            self._heap = NrtDeviceHeap(size, pool, announced=False)
            mark = pool._growth_mark()
            try:
                block, undo = pool._malloc_undoable(8 * device.DESCRIPTOR_WORDS)
                try:
                    write_words(pool.backend, block.address, self._words(self._heap))
                except BaseException:
                    pool._untake(block, undo, mark)
                    raise
            except BaseException:
                self._heap.discard()
                raise
            pool.pin(block)
            self._descriptor = block
            self._undo = undo, mark         # (for _discard, until _announce)
            if announced:
                self._announce()

    def _announce(self):
        """Tell the pool's observers of the heap's and the descriptor's
        blocks (carved unannounced): they are kept."""
        self._undo = None
        self._heap._announce()
        for observer in self._pool._block_observers:
            observer.on_malloc(self._pool, self._descriptor)

    def _discard(self):
        """Give back the blocks of a heap carved unannounced, as if never
        carved (the descriptor's, then the heap's, each with what the pool
        grew for it): only while nothing else has happened in the pool
        since (under the pool's lock, held since the carve)."""
        pool, block, (undo, mark) = self._pool, self._descriptor, self._undo
        self._undo = None
        pool.unpin(block)
        pool._untake(block, undo, mark)
        self._heap.discard()

    @staticmethod
    def _words(heap):
        words = [0] * device.DESCRIPTOR_WORDS
        words[device.DATA_ADDRESS] = heap.address
        words[device.DATA_BYTES] = heap.size
        words[device.META_ADDRESS] = heap.address + heap.size
        words[device.META_WORDS] = heap._meta_len
        return words

    @property
    def descriptor_address(self):
        """The device address of the descriptor (what a module's global holds)."""
        return self._descriptor.address

    @property
    def heap(self):
        """The :class:`NrtDeviceHeap` serving NRT now."""
        return self._heap

    def replacement(self, size) -> NrtDeviceHeap:
        """A new heap of ``size`` bytes from the pool, not yet serving, for
        :meth:`switch` then :meth:`adopt`, or :meth:`abandon`, under the
        pool's lock held until then: raises as the constructor does."""
        return NrtDeviceHeap(size, self._pool, self._heap.size_classes, announced=False)

    def switch(self, heap) -> None:
        """Point NRT at ``heap`` (from :meth:`replacement`): waits for the
        device (no kernel may still use the old heap), reads the old heap's
        counters (RuntimeError when they cannot be read) and points the
        descriptor at the new one. The steps that can fail (a driver
        call): then nothing has switched. Follow with
        :meth:`adopt`, or :meth:`abandon`. Under the pool's lock, between
        launches."""
        pool = self._pool
        pool.backend.synchronize()
        counters, up_to_date = self._heap.counters(wait=True)
        if not up_to_date:      # the copy was not started: its figures would be lost
            raise RuntimeError(
                f"nrt_heap_size: NRT's heap is not replaced: its counters, which nrt.* keeps, "
                f"could not be read from the device ({self._heap._reader.failure})")
        write_words(pool.backend, self._descriptor.address, self._words(heap))
        self._switched = heap, counters

    def adopt(self, heap) -> None:
        """Serve NRT from ``heap``, switched to by :meth:`switch`: the old
        heap closes, its counters kept in the totals. Cannot fail."""
        switched, self._switched = self._switched, None
        counters = switched[1]
        heap._announce()
        old, self._heap = self._heap, heap
        for name in _SUMMED:
            self._retired[name] += counters[name]
        self._retired["peak_bytes_in_use"] = max(self._retired["peak_bytes_in_use"],
                                                 counters["peak_bytes_in_use"])
        old.close()

    def abandon(self, heap) -> None:
        """Give back ``heap`` (from :meth:`replacement`), which will not
        serve, as if never carved; when :meth:`switch` pointed the
        descriptor at it, point it back at the heap still serving first
        (a driver call: should it fail, the device is lost, as CUDA's
        errors are sticky; the heap is given back all the same)."""
        switched, self._switched = self._switched, None
        try:
            if switched is not None and switched[0] is heap:
                write_words(self._pool.backend, self._descriptor.address,
                            self._words(self._heap))
        finally:
            heap.discard()

    def counters(self) -> dict:
        """The ``nrt.*`` counters (NRT_HEAP_COUNTERS' names, without the
        prefix), read without waiting for kernels still running. Under the
        pool's lock (memory_stats)."""
        return self._figures(self._heap.counters()[0], self._sizes(self._heap), self._retired)

    def _sizes(self, heap):
        """(size, reserved_bytes) of the ``nrt.*`` counters while ``heap``
        serves; under the pool's lock."""
        return heap.size, heap.reserved_bytes + self._descriptor.allocated_size

    def _figures(self, now, sizes, retired):
        """The ``nrt.*`` counters from ``now`` (one read of a heap's
        counters), ``sizes`` (:meth:`_sizes` of that heap) and ``retired``
        (the replaced heaps' figures kept when it began to serve)."""
        figures = {"size": sizes[0], "reserved_bytes": sizes[1],
                   "bytes_in_use": now["bytes_in_use"],
                   "peak_bytes_in_use": max(now["peak_bytes_in_use"],
                                            retired["peak_bytes_in_use"])}
        figures.update({name: now[name] + retired[name] for name in _SUMMED})
        return figures

    def stats(self, wait=False) -> dict:
        """The heap's :meth:`DeviceHeap.stats` (``classes``: per size class
        its allocations, frees, failures and bytes in use: those of the heap
        serving now), with the counters of :meth:`counters` (since the
        first heap) and the descriptor's address, all from one read. Thread
        safe: the pool's lock is not held while it reads (nor while it
        waits, with ``wait``); a heap replaced meanwhile (a new
        nrt_heap_size, another thread's) is read again from its successor."""
        while True:
            with self._pool.lock:
                heap, sizes, retired = self._heap, self._sizes(self._heap), dict(self._retired)
                descriptor = self.descriptor_address
            try:
                stats = heap.stats(wait=wait, compact=True)
            except RuntimeError:
                if heap is self._heap:          # not replaced: the error is the answer
                    raise
                continue
            return {**stats, **self._figures(stats, sizes, retired),
                    "descriptor_address": descriptor}


def _size(pool):
    size = pool.settings().nrt_heap_size
    if size is None:
        raise RuntimeError("nrt_heap_size is unset for this pool: NRT is not served "
                           "by the pool")
    return size


def heap_of(pool) -> NrtHeap:
    """``pool``'s NRT heap, carved now (``nrt_heap_size`` bytes) if it has
    none. RuntimeError when the pool's nrt_heap_size is unset; raises as
    :class:`NrtHeap` does, changing nothing. Thread safe."""
    with pool.lock:
        if pool.nrt_heap is None:
            pool.nrt_heap = NrtHeap(pool, _size(pool))
        return pool.nrt_heap


def serve(pool, use):
    """``use(descriptor_address)`` for ``pool``'s NRT heap, carved now if it
    has none (as :func:`heap_of`, which it raises as): should ``use`` raise
    (a module's global the driver does not write), a heap carved for it
    goes back as if never carved, the pool as before. Thread safe: under
    the pool's lock throughout."""
    with pool.lock:
        if pool.nrt_heap is not None:
            use(pool.nrt_heap.descriptor_address)
            return
        heap = NrtHeap(pool, _size(pool), announced=False)
        try:
            use(heap.descriptor_address)
        except BaseException:
            heap._discard()
            raise
        heap._announce()
        pool.nrt_heap = heap
