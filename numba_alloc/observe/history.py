"""A pool's recorded history: a ring buffer of what it did, with times and,
optionally, the Python stack of each event.

:func:`record_history` attaches a :class:`History` (a
:class:`~numba_alloc.policy.observers.PoolObserver`) to a pool. It records block
allocations and frees, segment allocations and frees, defragmentation moves
and out-of-memory errors as :class:`TraceEntry` tuples, keeping the newest
``max_entries``. Each entry carries the pool's live totals after the event,
so a timeline can be drawn from any window of the ring. With ``stacks`` on,
each entry also carries the Python stack that caused it (frames inside
numba_alloc left out), and the frames of every live block's allocation are
kept apart from the ring, for snapshots.

Thread safety: the pool calls the history under its lock; readers copy it
under the same lock (:func:`pool_lock`).
"""

import collections
import os
import sys
import threading
import time
import weakref
from typing import NamedTuple

from ..policy.observers import PoolObserver
from ..plugin.registry import resolve_pool
from ..validate import as_int

ALLOC = "alloc"
FREE = "free"                   # a user's free: requested, pending until its GPU work ends
FREE_COMPLETED = "free_completed"   # that free's GPU work ended: its memory is reusable
SEGMENT_ALLOC = "segment_alloc"
SEGMENT_FREE = "segment_free"
SEGMENT_MAP = "segment_map"         # pages mapped, joining the mapped segments they touch
SEGMENT_UNMAP = "segment_unmap"     # pages unmapped, perhaps cutting a mapped segment in two
MOVE = "move"
OOM = "oom"
RECLAIM = "reclaim"             # device memory freed, the bytes kept in host memory
BRING_BACK = "bring_back"       # back on the device (old_address: where it was)
FREE_RECLAIMED = "free_reclaimed"   # a reclaimed block freed: no device memory changes
DEFAULT_MAX_ENTRIES = 100_000
MAX_FRAMES = 64                   # deepest stack kept per event
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_histories = weakref.WeakKeyDictionary()   # Pool -> History (mutated under the pool's lock)


class TraceEntry(NamedTuple):
    """One recorded event. Sizes and addresses in bytes.

    ``size``: bytes requested (alloc, free, move, oom) or the segment's size
    (segment events). ``allocated_size``: bytes the block holds (a multiple
    of 512), the segment's size for segment events, 0 for oom. ``address``:
    the block's (its new one for a move), the segment's, 0 for oom.
    ``old_address``: a move's source, else 0. ``device_free``: the device's
    free memory at an oom, else 0. ``allocated``, ``requested``,
    ``reserved``: the pool's bytes in live blocks, their requested sizes, and
    its segments, after the event. ``frames``: ((filename, line, function),
    ...) innermost first, or () without stacks.
    """
    action: str
    address: int
    size: int
    allocated_size: int
    time_ns: int
    thread_id: int
    old_address: int
    device_free: int
    allocated: int
    requested: int
    reserved: int
    frames: tuple


def python_frames():
    """The calling Python stack outside numba_alloc, innermost first, at most
    MAX_FRAMES deep, as (filename, line, function) tuples."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(frames)


class History(PoolObserver):
    """The recorder :func:`record_history` attaches. ``entries`` (a deque of
    the newest ``max_entries`` :class:`TraceEntry`), ``recorded`` (events
    ever recorded, so ``recorded - len(entries)`` were dropped),
    ``block_frames`` and ``segment_frames`` (address -> frames of the live
    blocks and segments allocated while stacks were on)."""

    def __init__(self, max_entries, stacks, allocated, requested, reserved):
        self.entries = collections.deque(maxlen=max_entries)
        self.stacks = stacks
        self.recorded = 0
        self.block_frames = {}
        self.segment_frames = {}
        self._allocated, self._requested, self._reserved = allocated, requested, reserved

    def resize(self, max_entries):
        """Keep the newest ``max_entries`` entries from now on."""
        if max_entries != self.entries.maxlen:
            self.entries = collections.deque(self.entries, maxlen=max_entries)

    def _record(self, action, address, size, allocated_size, old_address=0, device_free=0):
        frames = python_frames() if self.stacks else ()
        self.entries.append(TraceEntry(
            action, address, size, allocated_size, time.time_ns(), threading.get_ident(),
            old_address, device_free, self._allocated, self._requested, self._reserved, frames))
        self.recorded += 1
        return frames

    def on_malloc(self, pool, block):
        self._allocated += block.allocated_size
        self._requested += block.size
        frames = self._record(ALLOC, block.address, block.size, block.allocated_size)
        if frames:
            self.block_frames[block.address] = frames

    def on_free_reclaimed(self, pool, block):
        self._record(FREE_RECLAIMED, block.address, block.size, block.allocated_size)

    def on_free(self, pool, block):
        self._allocated -= block.allocated_size
        self._requested -= block.size
        self.block_frames.pop(block.address, None)
        self._record(FREE, block.address, block.size, block.allocated_size)

    def on_free_completed(self, pool, address, size, allocated_size):
        self._record(FREE_COMPLETED, address, size, allocated_size)

    def on_reclaim(self, pool, block):
        self._allocated -= block.allocated_size
        self._requested -= block.size
        self._record(RECLAIM, block.address, block.size, block.allocated_size)

    def on_bring_back(self, pool, block, old_address):
        self._allocated += block.allocated_size
        self._requested += block.size
        frames = self.block_frames.pop(old_address, None)
        if frames:
            self.block_frames[block.address] = frames
        self._record(BRING_BACK, block.address, block.size, block.allocated_size,
                     old_address=old_address)

    def on_segment_alloc(self, pool, segment):
        self._reserved += segment.size
        frames = self._record(SEGMENT_MAP if segment.mapped else SEGMENT_ALLOC,
                              segment.address, segment.size, segment.size)
        if frames:
            self.segment_frames[segment.address] = frames

    def on_segment_free(self, pool, segment):
        self._reserved -= segment.size
        self.segment_frames.pop(segment.address, None)
        self._record(SEGMENT_UNMAP if segment.mapped else SEGMENT_FREE,
                     segment.address, segment.size, segment.size)

    def on_out_of_memory(self, pool, nbytes):
        self._record(OOM, 0, nbytes, 0, device_free=pool.backend.memory_info()[0])

    def on_move(self, pool, block, old_address):
        frames = self.block_frames.pop(old_address, None)
        if frames:
            self.block_frames[block.address] = frames
        self._record(MOVE, block.address, block.size, block.allocated_size,
                     old_address=old_address)


def pool_lock(pool):
    """The pool's re-entrant lock: holding it, a reader sees the pool and its
    history at one instant (the observers run under it)."""
    return pool.lock


def _live_totals(pool):
    """(allocated, requested, reserved) bytes of the pool now."""
    segments = pool.snapshot()["segments"]
    live = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    return (sum(b["size"] for b in live), sum(b["requested_size"] for b in live),
            sum(s["total_size"] for s in segments))


_ENABLED = {True: "all", "all": "all", "state": "state", False: None, None: None}
_CONTEXTS = (None, "state", "alloc", "all")
_STACKS = {True: True, "python": True, "all": True, False: False}


def _choice(argument, value, choices, allowed):
    """``choices[value]``; TypeError or ValueError naming ``argument`` and
    what is ``allowed`` when ``value`` is not a key."""
    if not isinstance(value, (bool, str, type(None))):
        raise TypeError(f"{argument} must be {allowed}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{argument} must be {allowed}, got {value!r}")
    return choices[value]


def checked_max_entries(max_entries) -> int:
    """``max_entries`` of :func:`record_history` as an int from 1 to
    sys.maxsize; TypeError or ValueError naming it."""
    max_entries = as_int(max_entries, "max_entries", "an int >= 1")
    if not 1 <= max_entries <= sys.maxsize:     # a deque holds at most sys.maxsize
        raise ValueError(f"max_entries must be an int from 1 to {sys.maxsize}, "
                         f"got {max_entries!r}")
    return max_entries


def record_history(enabled="all", *, context="all", stacks=False,
                   max_entries=DEFAULT_MAX_ENTRIES, device=None) -> None:
    """Start or stop recording a pool's history; the arguments are those of
    ``torch.cuda.memory._record_memory_history`` (keywords after the first).

    ``enabled``: "all" or True records every event (when already recording,
    the entries are kept and the new ``max_entries`` and ``stacks`` apply);
    "state" records no events, only where each live block was allocated
    (with stacks on, for snapshots); None or False stops recording and
    discards the history (dump it first). ``context``: None records no
    stacks; "state", "alloc" and "all" leave it to ``stacks`` (which records
    them for every event). ``stacks``: "python", "all" or True records the
    Python stack of each event (numba_alloc has no C++ frames to add; tens
    of microseconds per event), False none. ``max_entries``: how many of
    the newest events the ring keeps (an int from 1 to sys.maxsize).
    ``device``: a Pool, a GPU number, a TensorFlow name such as "GPU:0", or
    None (the current GPU). Raises TypeError or ValueError naming a bad argument.
    """
    mode = _choice("enabled", enabled, _ENABLED, '"all", "state", None, True or False')
    context = _choice("context", context, {c: c for c in _CONTEXTS},
                      'None, "state", "alloc" or "all"')
    stacks = _choice("stacks", stacks, _STACKS, '"python", "all", True or False')
    stacks = stacks and context is not None
    max_entries = checked_max_entries(max_entries)
    ring = max_entries if mode == "all" else 0
    with resolve_pool(device) as pool, pool_lock(pool):
        history = _histories.get(pool)
        if mode is None:
            if history is not None:
                pool.remove_observer(history)
                del _histories[pool]
        elif history is None:
            history = History(ring, stacks, *_live_totals(pool))
            _histories[pool] = history
            pool.add_observer(history)
        else:
            history.resize(ring)
            history.stacks = stacks


def history_of(pool):
    """The pool's :class:`History`, or None when it is not recording. Read it
    under :func:`pool_lock`."""
    return _histories.get(pool)


def recorded_events(device=None) -> "list[TraceEntry]":
    """A copy of the recorded :class:`TraceEntry` list, oldest first (empty
    while recording with enabled="state"). ``device`` as for
    :func:`record_history`. Raises RuntimeError when the pool is not
    recording."""
    with resolve_pool(device) as pool, pool_lock(pool):
        return list(require_history(pool).entries)


def require_history(pool):
    """The pool's History; RuntimeError when it is not recording."""
    history = _histories.get(pool)
    if history is None:
        raise RuntimeError(f"{pool!r} records no history: call "
                           "numba_alloc.record_history(device=...) first")
    return history
