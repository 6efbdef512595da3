"""Snapshots in the format of PyTorch's ``torch.cuda.memory._snapshot()``,
which pytorch.org/memory_viz and ``torch.cuda._memory_viz`` open.

A snapshot is a dict:

* ``segments``: the pool's segments as :meth:`Pool.snapshot` gives them
  (device, address, total_size, allocated_size, active_size,
  requested_size, stream, segment_type, is_expandable: a run of mapped
  pages, blocks), plus ``segment_pool_id`` (0, 0) and ``frames`` (the
  stack that reserved the segment, when history records stacks); each block has address, size,
  requested_size, state ('active_allocated', 'active_pending_free' or
  'inactive'), pinned and ``frames`` (the stack that allocated it).
* ``device_traces``: one list per device number up to the pool's, the pool's
  recorded history (empty when none) as PyTorch's trace entries: 'alloc',
  'free_requested' (at the free) and 'free_completed' (once the free's GPU
  work has ended and the pool made its memory reusable, as PyTorch's
  free_block; a free with no work pending completes at the pool's next look
  at its pending frees: a request, a read, a snapshot; a move or a reclaim
  writes both at once), 'segment_alloc',
  'segment_free', 'segment_map' and 'segment_unmap' (pages of
  expandable_segments, as PyTorch's: a map joins the segments it touches,
  an unmap cuts its segment) and 'oom', each with addr (not for oom), size
  (requested bytes for blocks), stream 0, time_us, frames, and device_free
  for oom. A defragmentation move is the block's free at its old address
  and its allocation at the new one.
* ``stats``: :meth:`Pool.memory_stats` (our addition; viewers ignore it).
* ``device_heaps``: each open DeviceHeap's address and stats (ours too),
  which the memory summary lists; ``nrt_heap``: the heap serving NRT
  (nrt_heap_size), alike, or None.
"""

import os
import pickle

from .display import Snapshot
from .snapshot_check import check_snapshot
from .history import (ALLOC, BRING_BACK, FREE, FREE_COMPLETED, MOVE, OOM, RECLAIM,
                      SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, history_of,
                      pool_lock)
from ..plugin.registry import resolve_pool

PICKLE_PROTOCOL = 4   # memory_viz's unpickler reads protocols 2 to 4


def _frames(frames):
    return [{"filename": f, "line": line, "name": name} for f, line, name in frames]


def trace_entries(entries):
    """PyTorch trace entries (dicts) for :class:`~numba_alloc.observe.history.TraceEntry` s."""
    out = []
    for e in entries:
        common = {"stream": 0, "time_us": e.time_ns // 1000, "frames": _frames(e.frames)}
        if e.action in (ALLOC, BRING_BACK):     # back from host memory: allocated again
            out.append({"action": "alloc", "addr": e.address, "size": e.size, **common})
        elif e.action in (FREE, FREE_COMPLETED):
            action = "free_requested" if e.action == FREE else "free_completed"
            out.append({"action": action, "addr": e.address, "size": e.size, **common})
        elif e.action in (MOVE, RECLAIM):     # to host memory: its device bytes freed
            address = e.old_address if e.action == MOVE else e.address
            for action in ("free_requested", "free_completed"):
                out.append({"action": action, "addr": address, "size": e.size, **common})
            if e.action == MOVE:
                out.append({"action": "alloc", "addr": e.address, "size": e.size, **common})
        elif e.action in (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP):
            out.append({"action": e.action, "addr": e.address, "size": e.size, **common})
        elif e.action == OOM:
            out.append({"action": "oom", "size": e.size, "device_free": e.device_free, **common})
    return out


def snapshot(device=None) -> Snapshot:
    """The pool's segments, blocks, recorded history and stats, taken at one
    instant, in PyTorch's snapshot format (see the module docstring), as a
    :class:`~numba_alloc.observe.display.Snapshot` (a dict Jupyter shows as a table
    and a picture).
    ``device``: a Pool, a GPU number, a TensorFlow name such as "GPU:0", or
    None (the current GPU)."""
    with resolve_pool(device) as pool, pool_lock(pool):
        snap = pool.snapshot()
        history = history_of(pool)
        entries = list(history.entries) if history else []
        block_frames = dict(history.block_frames) if history else {}
        segment_frames = dict(history.segment_frames) if history else {}
        device_id = pool.backend.device_id
    for segment in snap["segments"]:
        segment["segment_pool_id"] = (0, 0)
        segment["frames"] = _frames(segment_frames.get(segment["address"], ()))
        for block in segment["blocks"]:
            live = block["state"] == "active_allocated"
            block["frames"] = _frames(block_frames.get(block["address"], ()) if live else ())
    traces = [[] for _ in range(device_id + 1)]
    traces[device_id] = trace_entries(entries)
    return Snapshot(segments=snap["segments"], device_traces=traces, stats=snap["stats"],
                    device_heaps=snap["device_heaps"], nrt_heap=snap["nrt_heap"])


def dump_snapshot(path, device=None) -> None:
    """Write :func:`snapshot` as a pickle to ``path`` (str or path-like), as
    ``torch.cuda.memory._dump_snapshot`` does: open it at
    pytorch.org/memory_viz. ``device`` as for :func:`snapshot`. TypeError
    for a ``path`` of another kind (an int would be taken as a file descriptor)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path must be a str or path-like, got {path!r}")
    write_snapshot(snapshot(device), path)


def write_snapshot(snap, path):
    """Write a snapshot (a :func:`snapshot`, perhaps read in another
    process) as the pickle :func:`dump_snapshot` writes to ``path``."""
    data = dict(snap)       # a Snapshot would pickle as a call the viewer cannot read
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=PICKLE_PROTOCOL)


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings, numbers, bools and None
    only: loading a file that names any class or function is refused, so
    a snapshot from elsewhere runs no code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}: a snapshot is plain data")


def load_snapshot(path) -> dict:
    """The snapshot :func:`dump_snapshot` wrote to ``path`` (or any pickle of
    plain data with its ``segments`` and ``stats`` that a pool could have
    written: :func:`~numba_alloc.observe.snapshot_check.check_snapshot`),
    read without running code, in time linear in the file's size. Raises
    OSError when the file cannot be read and ValueError, naming the file
    and what is wrong, when it is not such a snapshot."""
    with open(path, "rb") as f:
        try:
            data = _PlainData(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
                KeyError, AttributeError) as error:
            raise ValueError(f"{os.fsdecode(path)}: not a snapshot pickle ({error})") from None
    if not isinstance(data, dict) or not {"segments", "stats"} <= set(data):
        raise ValueError(f"{os.fsdecode(path)}: not a numba_alloc snapshot (a dict with "
                         "segments and stats, as dump_snapshot writes)")
    try:
        check_snapshot(data)
    except ValueError as error:
        raise ValueError(f"{os.fsdecode(path)}: not a numba_alloc snapshot: {error}") from None
    return data

