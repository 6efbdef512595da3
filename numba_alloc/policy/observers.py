"""What a pool tells its observers (history, scoped trackers, traces), and
the relocator that moves what follows a block when defragmentation moves it.

An observer subclasses :class:`PoolObserver` and overrides what it needs;
:meth:`Pool.add_observer` attaches it. The pool calls observers under its
lock, after the event has happened and its counters are updated, so an
observer must be quick, must not call back into the pool, and must not raise.
With no observer of blocks and segments attached (one that overrides
on_malloc, on_free, on_free_completed, on_segment_alloc or on_segment_free: see
:func:`watches_blocks`) the pool's cost on its request and free paths is
one truth test; an observer of the rarer events only (out of memory,
defragmentation, reclaim, cache flushes) costs them nothing.
"""

import numpy as np


class PoolObserver:
    def on_malloc(self, pool, block):
        """``block`` was handed out (``address``, ``size``, ``allocated_size``)."""

    def on_free(self, pool, block):
        """``block`` was freed by its user (it is pending until its GPU work
        ends: :meth:`on_free_completed`)."""

    def on_free_completed(self, pool, address, size, allocated_size):
        """The free of the block at ``address`` (``size`` bytes requested,
        ``allocated_size`` held) completed: its GPU work is done and its
        memory reusable (after :meth:`on_free`; a free whose work was done
        completes at the pool's next look at its pending frees)."""

    def on_free_reclaimed(self, pool, block):
        """``block`` was freed by its user while in host memory: no device
        memory changes (its own went at its reclaim, :meth:`on_reclaim`)."""

    def on_segment_alloc(self, pool, segment):
        """The pool reserved ``segment`` from the device. A mapped one
        (``segment.mapped``: pages under the reserved range of
        expandable_segments) has already joined the mapped segments it
        touches: the pool now has one segment over them all."""

    def on_segment_free(self, pool, segment):
        """The pool returned ``segment`` to the device. A mapped one may be
        pages out of a longer mapped segment, which they cut in two (or
        shorten)."""

    def on_out_of_memory(self, pool, nbytes):
        """A request for ``nbytes`` failed with OutOfMemoryError."""

    def on_defragment(self, pool, blocks_moved, bytes_moved):
        """A defragmentation's copies completed: ``blocks_moved`` live blocks,
        ``bytes_moved`` bytes (each block was told to :meth:`on_move`)."""

    def on_cache_flush(self, pool, segments, nbytes):
        """The pool returned all its fully free segments to the device
        (empty_cache, or pressure a single return did not relieve):
        ``segments`` of them, ``nbytes`` bytes."""

    def on_move(self, pool, block, old_address):
        """Defragmentation moved live ``block`` from ``old_address`` to ``block.address``."""

    def on_reclaim(self, pool, block):
        """Reclaim copied live ``block`` to host memory and freed its device
        memory (at ``block.address``, which now means nothing)."""

    def on_bring_back(self, pool, block, old_address):
        """A reclaimed block got device memory again, ``block`` (its address
        and sizes; the block it was at ``old_address`` before its reclaim
        takes that memory once the bring-back completes), heard before the
        victims a later block of the same bring-back reclaims; when the
        bring-back fails, ``block`` is then heard reclaimed."""


BLOCK_EVENTS = ("on_malloc", "on_free", "on_free_completed", "on_segment_alloc",
                "on_segment_free")


def watches_blocks(observer):
    """Whether ``observer`` overrides an event of :data:`BLOCK_EVENTS`, those
    of the pool's request and free paths."""
    return any(getattr(type(observer), event) is not getattr(PoolObserver, event)
               for event in BLOCK_EVENTS)


class Observed:
    """Attaching observers: a part of :class:`~numba_alloc.policy.pool.Pool`."""

    def add_observer(self, observer) -> None:
        """Attach a :class:`~numba_alloc.policy.observers.PoolObserver`; TypeError for
        anything else."""
        if not isinstance(observer, PoolObserver):
            raise TypeError("observer must be a numba_alloc.policy.observers.PoolObserver "
                            f"(subclass it and override what you need), got {observer!r}")
        with self._lock:
            self._observers = self._observers + (observer,)
            self._observers_changed()

    def remove_observer(self, observer) -> None:
        """Detach an observer, once it has been told of the frees handed to
        free_later() meanwhile; ValueError if it is not attached."""
        with self._lock:
            self._free_deferred()
            observers = list(self._observers)
            if observer not in observers:
                raise ValueError(f"remove_observer: {observer!r} is not attached to this pool")
            observers.remove(observer)
            self._observers = tuple(observers)
            self._observers_changed()

    def _observers_changed(self):
        """Pick the observers of blocks (the hot paths') from every one, and
        tell the pending frees whether anyone hears of their completion."""
        self._block_observers = tuple(filter(watches_blocks, self._observers))
        self._pending.on_retire = self._frees_completed if self._block_observers else None

    def _frees_completed(self, freed):
        """Tell the observers of blocks that the frees ``freed`` completed
        ([(address, requested size, allocated size)])."""
        for observer in self._block_observers:
            for address, size, allocated_size in freed:
                observer.on_free_completed(self, address, size, allocated_size)


class Relocator:
    """What moves with a block besides the pool's record of it: the Numba
    glue implements this so that its pointer objects follow their blocks.
    The pool calls it under its lock, with the device idle."""

    def pin_unmovable(self, pool):
        """Pin blocks that must not move (pool.pin), or raise
        DefragmentationRefused when moving is not safe at all."""

    def movable(self, block):
        """Whether allocated ``block`` may move: False while the glue has not
        yet registered what follows it (a block another thread has just
        allocated)."""
        return True

    def movable_blocks(self, handles, rows):
        """:meth:`movable` of the blocks registered at ``rows`` (an int64
        array) in ``handles``: a bool array."""
        return np.fromiter((self.movable(handles[row]) for row in rows.tolist()), np.bool_,
                           len(rows))

    def relocated(self, pool, moves):
        """Blocks have moved (defragmentation, reclaim, or reclaimed blocks
        brought back): ``moves`` lists (block, old address), and each
        resident block's ``address`` is the new one. Make every reference
        follow; a reclaimed block has no device address (pool.is_resident
        is False): references to it are pointed where any use faults."""

    def reclaim_refused(self):
        """Why the ``reclaim`` setting cannot be turned on under this glue,
        or None."""
        return None

    def nrt_heap_refused(self):
        """Why the ``nrt_heap_size`` setting cannot be set now (kernels that
        use NRT were linked with another heap, or this glue cannot serve
        NRT), or None."""
        return None

    def reclaiming(self, pool, on):
        """``pool`` turned the ``reclaim`` setting on or off (it may only turn
        it on when :meth:`reclaim_refused` is None), or, with it off, its
        last reclaimed block left host memory. Cannot fail."""

    def reclaim_ready(self, pool):
        """Whether reclaim may take ``pool``'s blocks now (called under its
        lock before reclaim picks victims; it may wait for the device first):
        False while work the glue could not see may still be being queued
        on them."""
        return True

    def pin_unreclaimable(self, pool):
        """Pin blocks that must stay resident (pool.pin): reclaim calls this
        before it picks victims."""
