"""Staged blocks: device memory a library takes from the pool for the GPU
work it queues itself (under the Numba plugin, numba-cuda's device copies of
the host arrays a kernel is given, through cuda-core's memory resource,
plugin/staging.py). A staged block is pinned (never moved or reclaimed),
counted in ``staged_bytes`` and ``staged`` besides allocated_bytes. A part
of :class:`~numba_alloc.policy.pool.Pool`."""

from .block import Block
from ..validate import request_size


class Staging:
    """Blocks held for work queued outside the pool's users."""

    def stage(self, nbytes, make, moves=False) -> tuple[Block, object]:
        """(block, what ``make(address)`` returned): a pinned block of at
        least ``nbytes`` bytes, staged until :meth:`unstage_later`, and the
        object the caller makes over its address (cuda-core's Buffer), made
        under the pool's lock. Raises as :meth:`malloc` does, or what
        ``make`` raises; on any error the pool's blocks, segments and
        current counters are as before (an out-of-memory error counts in
        num_ooms; a segment grown for a block ``make`` refused is given
        back, and counts as grown and released), except that what made room
        for the block stays done: cached free segments returned to the
        device stay returned, and with reclaim on, inactive blocks moved to
        host memory stay there (intact; they come back at their next use).
        Raises TypeError when
        ``make`` is not callable. ``moves``: whether the request may
        defragment (move live blocks); a kernel launch staging its host
        arguments has read its device arrays' addresses already, and they
        must stay where they are (unless something else keeps them in
        place). Thread safe."""
        if not callable(make):
            raise TypeError(f"make must be a callable taking the block's address, got {make!r}")
        if type(nbytes) is not int or nbytes < 0:
            nbytes = request_size(nbytes)
        with self._lock:
            if self._deferred:
                self._free_deferred()
            mark = self._growth_mark()
            if not moves:
                self._moves_barred += 1
            try:
                block, undo = self._malloc_undoable(nbytes)
            finally:
                if not moves:
                    self._moves_barred -= 1
            try:
                made = make(block.address)
            except BaseException:
                self._untake(block, undo, mark)
                raise
            self.pin(block)
            self._staged[block.address] = block
            self.stats.up("staged_bytes", block.allocated_size)
            self.stats.up("staged", 1)
            for observer in self._block_observers:
                observer.on_malloc(self, block)
        return block, made

    def unstage_later(self, block) -> None:
        """Free the staged ``block`` as :meth:`free_later` does (at the start
        of the pool's next operation; reusable once the GPU work queued
        before then has finished). For cuda-core's deallocate, which may run
        in a garbage-collector finalizer: takes no lock, never raises; a
        block that is no longer staged (the pool was reset since) is
        ignored, as is anything that is not a staged block."""
        address = getattr(block, "address", None)
        if address is not None and self._staged.get(address) is block:
            self._deferred.append(block)

    def _unstage(self, block):
        """Under the lock, as ``block`` is freed: when it is staged, it no
        longer is, and the staging counters drop. (Staged blocks are pinned,
        so their addresses do not change.)"""
        if self._staged.get(block.address) is block:
            del self._staged[block.address]
            self.stats.down("staged_bytes", block.allocated_size)
            self.stats.down("staged", 1)

    def _forget_staged(self):
        """Under the lock, as the pool resets: no block is staged."""
        for block in self._staged.values():
            self.stats.down("staged_bytes", block.allocated_size)
            self.stats.down("staged", 1)
        self._staged.clear()

    def _staged_records(self):
        """The snapshot's ``staged``: address and size of each staged block."""
        return [{"address": block.address, "size": block.allocated_size,
                 "requested_size": block.size}
                for block in sorted(self._staged.values(), key=lambda b: b.address)]

