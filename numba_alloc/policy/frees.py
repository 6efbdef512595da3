"""Frees: a user's free, a finalizer's (free_later, done at the next
operation), the batches that close, holds (Numba's defer_cleanup) and
synchronize. A part of :class:`~numba_alloc.policy.pool.Pool`."""

import contextlib
from collections.abc import Iterator

from . import core as _core
from . import reclaim as _reclaim
from . import residency
from .block import Block, keep_values

_ROW_BITS, _ROW_MASK = _core.ROW_BITS, _core.ROW_MASK
_release_block = _core.release_block


class Frees:
    """Giving blocks back; each becomes reusable once the GPU work queued
    before its free has finished."""

    def free(self, block) -> None:
        """Return a block from :meth:`malloc`. It becomes reusable once the
        GPU work queued before this call has finished. Raises ValueError for a
        block that is not live in this pool (double free, foreign block, a
        copy of a handle). Thread safe."""
        with self._lock:
            if type(block) is Block:
                if not (self._staged or self._block_observers):
                    # the fast path: the core releases a live handle's block
                    done = _release_block(self._p, self._handles, block)
                    if done:
                        if done == 2:
                            self._retire_completed_frees()
                        return
                else:
                    row = block._ticket & _ROW_MASK
                    if row < len(self._handles) and self._handles[row] is block:
                        self._release(block, row)
                        return
            if self._is_reclaimed(block):
                _reclaim.free_reclaimed(self, block)
                for observer in self._observers:
                    observer.on_free_reclaimed(self, block)
                return
            self._allocated_row(block, "free")      # raises: not a live block of this pool
            raise AssertionError("a live block without its handle registered")

    def _release(self, block, row):
        """Under the lock: free the allocated ``block`` registered at ``row``
        (its handle is there: a live block's handle is registered at its
        row while it is allocated, and only then)."""
        if self._staged:
            self._unstage(block)
        keep_values(block, self._mv, row)
        done = _core.release(self._p, row, block._ticket >> _ROW_BITS)
        self._handles[row] = None
        if self._block_observers:
            for observer in self._block_observers:
                observer.on_free(self, block)
        if done == 2:
            self._retire_completed_frees()

    def _retire_completed_frees(self):
        """Cover the open frees with an event and retire the batches whose
        events have completed (when they fill a batch, or before a large
        request splits a free block: reuse first), so that freed memory is
        reused while it is still in cache and the pool grows less. Best
        effort: when the backend fails, the frees stay open, and the next
        request that needs memory records their event (and raises)."""
        with self._lock:
            pending = self._pending
            try:
                pending.close_batch()
                pending.poll()
            except Exception:       # noqa: BLE001 (left to the next allocation, see above)
                pass

    def free_later(self, block) -> None:
        """Free ``block`` at the start of the pool's next operation (any
        malloc, synchronize, defragmentation, reset or stats read).
        For garbage-collector finalizers: they may run in the middle of a
        pool operation on this thread, or while this thread holds a lock
        another thread waits on inside the pool. Takes no lock and never
        raises; a block that is no longer live by then is skipped."""
        self._deferred.append(block)

    def _free_deferred(self):
        """Under the lock: the frees free_later() queued, skipping blocks no
        longer live. Every free of the Numba plugin comes this way (its
        finalizers): without observers or staged blocks, through the core's
        fast path, as :meth:`free`."""
        deferred, handles = self._deferred, self._handles
        while deferred:
            block = deferred.popleft()
            if type(block) is not Block:
                continue
            if not (self._block_observers or self._staged):
                done = _release_block(self._p, handles, block)
                if done:
                    if done == 2:
                        self._retire_completed_frees()
                    continue
            else:
                row = block._ticket & _ROW_MASK
                if row < len(handles) and handles[row] is block:
                    self._release(block, row)
                    continue
            if self._is_reclaimed(block):
                self.free(block)

    @contextlib.contextmanager
    def hold_frees(self) -> Iterator[None]:
        """While active (nestable, for all threads), freed blocks stay
        pending and are not handed out again, nor are the pinned host
        blocks given back to the host cache (Numba's defer_cleanup)."""
        with self._lock:
            self._pending.hold += 1
        try:
            with self.host_cache.hold():
                yield
        finally:
            with self._lock:
                self._pending.hold -= 1

    def synchronize(self) -> None:
        """Wait for pending frees to become reusable, and for the GPU work
        of the blocks' last uses (synchronizes the device only when some of
        either may not have completed)."""
        with self._lock:
            self._synchronize()

    def _synchronize(self):
        """:meth:`synchronize` under the lock; whether it synchronized the
        device (counted in num_sync_all_streams)."""
        self._free_deferred()
        pending = self._pending
        pending.close_batch()
        pending.poll()
        queued = residency.any_queued_use(self)
        if pending.batched or queued:
            pending.synchronize()
            residency.device_idle(self, queued)
            return True
        return False
