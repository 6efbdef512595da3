"""Pins and uses: what may not move or be reclaimed, bringing reclaimed
blocks back for a use, and reading a handle's state. A part of
:class:`~numba_alloc.policy.pool.Pool`."""

import contextlib
from collections.abc import Iterator

from . import core as _core
from . import reclaim as _reclaim
from .block import ALLOCATED, DEAD, FREE, PENDING, Block, Segment
from .core import NF, TABLE

_GEN, _PIN, _SEG, _STATE = _core.GEN, _core.PIN, _core.SEG, _core.STATE
_ROW_MASK, _ROW_BITS = _core.ROW_MASK, _core.ROW_BITS
_CORE_STATES = {_core.ALLOCATED: ALLOCATED, _core.PENDING: PENDING, _core.FREE: FREE}
# what every launch under the Numba plugin calls with reclaim on, bound once
_begin_uses, _end_uses, _ACTIVE_BYTES = _core.begin_uses, _core.end_uses, _reclaim.ACTIVE_BYTES


class Uses:
    """Pins, uses and the state of handles."""

    def pin(self, block) -> None:
        """Keep a live block where it is until as many :meth:`unpin` calls
        (IPC export, an address that left Numba); a reclaimed block is
        brought back first (OutOfMemoryError when it cannot be). Raises
        ValueError for a block that is not live in this pool."""
        with self._lock:
            if self._is_reclaimed(block):
                _reclaim.bring_back(self, [block])      # pinned once
                return
            self._mv[TABLE + self._allocated_row(block, "pin") * NF + _PIN] += 1

    @contextlib.contextmanager
    def use(self, *blocks) -> Iterator[None]:
        """Make ``blocks`` resident and active for the duration of the
        ``with`` block: reclaimed ones come back (all of them, or none:
        OutOfMemoryError, and each block is as it was), and none of them is
        reclaimed or moved until the GPU work queued inside has completed.
        Outside it a block is inactive: with the ``reclaim`` setting on, the
        pool may reclaim it to host memory when it needs room, and its
        address then means nothing (``block.resident`` is False) until its
        next use. ValueError for a block that is not live in this pool.
        Thread safe; uses nest."""
        for block in blocks:
            if type(block) is not Block:
                raise TypeError(f"use: blocks must be Block handles from malloc, got {block!r}")
        handles = self._begin_use(list(dict.fromkeys(blocks)))
        try:
            yield
        finally:
            self._end_use(handles)

    def _begin_use(self, handles, stream=0):
        """Enter :meth:`use` for ``handles`` (a list of distinct Block
        handles, or a dict's keys), for work queued on ``stream`` (0: the
        legacy default stream, or the thread's per-thread one, which waits
        for the legacy stream's earlier work); returns them, to pass to
        :meth:`_end_use`.
        Every kernel launch under the Numba plugin with reclaim on makes
        one: while no block is reclaimed, one compiled call (the launch
        path makes these steps itself, plugin/_launch.pyx: keep them
        alike)."""
        with self._lock:
            if self._deferred:
                self._free_deferred()
            r = self._residency
            if r.reclaimed or (r.arrival is not None
                               and (stream or not self.backend.is_current())):
                _reclaim.begin_use(self, handles, stream)   # blocks to bring back, or wait for
            else:
                wrong = _begin_uses(self._p, self, handles, self._handles, r.active, True,
                                    _ACTIVE_BYTES)
                if wrong is not None:
                    self._allocated_row(wrong, "use")       # raises, naming the block
        return handles

    def _end_use(self, handles, completed=False):
        """Leave :meth:`use` for what :meth:`_begin_use` returned: the
        blocks stay protected until the GPU work queued meanwhile is known
        to have completed (``completed``: it has; else once the pool has
        synchronized the device: residency.py). One compiled call (also
        made by the launch path itself, plugin/_launch.pyx)."""
        with self._lock:
            r = self._residency
            _end_uses(self._p, handles, self._handles, r.active, r.last_use, r.epoch, completed,
                      _ACTIVE_BYTES)

    def _is_reclaimed(self, block):
        """Whether ``block`` is a live block of this pool in host memory."""
        return type(block) is Block and block in self._residency.reclaimed

    def is_resident(self, block) -> bool:
        """Whether ``block`` is a live block of this pool with device memory
        (not reclaimed to host memory). Takes no lock."""
        return self.state_of(block) is ALLOCATED and not self._is_reclaimed(block)

    def unpin(self, block) -> None:
        """Undo one :meth:`pin`; ValueError if the block is not pinned."""
        with self._lock:
            if self._is_reclaimed(block):
                raise ValueError(f"unpin: {block!r} is not pinned (it is reclaimed: in "
                                 "host memory)")
            r = TABLE + self._allocated_row(block, "unpin") * NF + _PIN
            if not self._mv[r]:
                raise ValueError(f"unpin: {block!r} is not pinned")
            self._mv[r] -= 1

    def _allocated_row(self, block, action):
        """The row of ``block`` when it is itself (not a copy) an allocated
        block of this pool; else ValueError naming ``action``, or -1 when
        ``action`` is None."""
        row = self._live_row(block)
        if (row < 0 or self._handles[row] is not block
                or self._mv[TABLE + row * NF + _STATE] != _core.ALLOCATED):
            if action is None:
                return -1
            raise ValueError(f"{action}: {block!r} is not a live block of this pool")
        return row

    def _live_row(self, block):
        """The core row of ``block`` while it is a handle of this pool that
        is allocated or pending; -1 otherwise."""
        if type(block) is not Block or block.pool is not self:
            return -1
        row = block._ticket & _ROW_MASK
        r, mv = TABLE + row * NF, self._mv
        state = mv[r + _STATE]
        if (mv[r + _GEN] == block._ticket >> _ROW_BITS
                and (state == _core.ALLOCATED or state == _core.PENDING)):
            return row
        return -1

    def state_of(self, block) -> str:
        """ALLOCATED (a reclaimed block too), PENDING (freed, its GPU work
        may be running) or DEAD (any handle that is not a live block of this
        pool). Takes no lock: a reclaim makes a block reclaimed before it
        releases its row, and a bring-back gives it a row before it is no
        longer reclaimed, so a block without a row is looked up again."""
        if self._is_reclaimed(block):
            return ALLOCATED
        row = self._live_row(block)
        state = _CORE_STATES[self._mv[TABLE + row * NF + _STATE]] if row >= 0 else DEAD
        if state is ALLOCATED or state is PENDING:
            return state
        # its row released since _live_row looked (FREE) or none
        return ALLOCATED if self._is_reclaimed(block) else DEAD

    def pins_of(self, block) -> int:
        """How many pins hold ``block`` (0 once it is no longer live, or
        while it is reclaimed)."""
        if self._is_reclaimed(block):
            return 0
        row = self._live_row(block)
        return 0 if row < 0 else self._mv[TABLE + row * NF + _PIN]

    def segment_of(self, block) -> Segment | None:
        """The :class:`~numba_alloc.policy.block.Segment` holding a live ``block``,
        else None (also while it is reclaimed)."""
        if self._is_reclaimed(block):
            return None
        row = self._live_row(block)
        return None if row < 0 else self._segments.get(self._mv[TABLE + row * NF + _SEG])
