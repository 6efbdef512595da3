"""Allocation traces in RMM's CSV log format (what RMM's
logging_resource_adaptor writes and its replay benchmark reads).

The header is ``Thread,Time,Action,Pointer,Size,Stream``. Actions:
``allocate``, ``deallocate`` (older RMM logs say ``free``) and ``allocate
failure`` (a request the allocator could not meet; its pointer is null).
Time: seconds since the epoch (``1634567890.123456``), or, in older logs,
the clock time ``HH:MM:SS.ffffff`` (or ``HH:MM:SS:ffffff``), read as
seconds since midnight. Pointer and Stream: hex (``0x7f8a40000000``),
decimal, or ``(nil)``. Size: bytes.

:func:`dump_trace` writes a pool's recorded history in this format: its
allocations, frees and out-of-memory errors (as ``allocate failure``).
Segment events are the allocator's own and are left out. The format has no
action for a defragmentation move, so a move is written as what it does: a
``deallocate`` of the block at its old address followed by an ``allocate``
at its new one, same size, both at the time of the move. Every line then
names a block where it was at that moment: no two live allocations share a
pointer, each free names the pointer of the block's latest allocate, and
the log replays cleanly (a replay counts each move as one free and one
allocation). A history that began while blocks were live, or whose oldest
entries the ring dropped, frees and moves blocks the log never allocated: a
replay counts those as unknown frees.
"""

import csv
import re
from pathlib import Path
from typing import NamedTuple

from .api import resolve_pool
from .history import ALLOC, FREE, MOVE, OOM, pool_lock, require_history

ALLOCATE = "allocate"
DEALLOCATE = "deallocate"
ALLOCATE_FAILURE = "allocate failure"
HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
BUNDLED_TRACE = Path(__file__).with_name("data") / "training_loop.csv"
_ACTIONS = {"allocate": ALLOCATE, "deallocate": DEALLOCATE, "free": DEALLOCATE,
            "allocate failure": ALLOCATE_FAILURE}
_REQUIRED = ("Action", "Pointer", "Size")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2})[.:](\d{1,9})$")
_NULL = ("(nil)", "nullptr", "null")   # how loggers print a null pointer


class TraceEvent(NamedTuple):
    """One line of a log: ``thread`` (an id), ``time`` (seconds),
    ``action`` (ALLOCATE, DEALLOCATE or ALLOCATE_FAILURE), ``pointer``,
    ``size`` (bytes) and ``stream`` (a handle, 0 for the default)."""
    thread: int
    time: float
    action: str
    pointer: int
    size: int
    stream: int


def _parse_int(text, column, where):
    text = text.strip()
    if column in ("Pointer", "Stream") and text.lower() in _NULL:
        return 0
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise ValueError(f"{where}: {column} {text!r} is not a number") from None


def _parse_time(text, where):
    text = text.strip()
    clock = _CLOCK.match(text)
    if clock:
        h, m, s, fraction = clock.groups()
        return int(h) * 3600 + int(m) * 60 + int(s) + int(fraction) / 10 ** len(fraction)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{where}: Time {text!r} is neither seconds nor HH:MM:SS.ffffff") from None


def read_rmm_log(source):
    """The :class:`TraceEvent` s of an RMM CSV log, in file order.
    ``source``: a path or an open text file. Thread, Time and Stream may be
    missing (read as 0). Raises ValueError, naming the line, for a file that
    is not such a log or a line that cannot be read."""
    if isinstance(source, (str, Path)):
        with open(source, newline="") as f:
            return _read(f, str(source))
    return _read(source, getattr(source, "name", "trace"))


def _read(f, name):
    rows = csv.reader(f)
    header = [column.strip() for column in next(rows, [])]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise ValueError(f"{name} is not an RMM allocation log: its header must be "
                         f"{','.join(HEADER)}, got {','.join(header)!r}")
    col = {c: header.index(c) for c in HEADER if c in header}
    events = []
    for number, row in enumerate(rows, start=2):
        if not row or not "".join(row).strip():
            continue
        where = f"{name}, line {number}"
        if len(row) < len(header):
            raise ValueError(f"{where}: {len(row)} fields, the header has {len(header)}")
        action = _ACTIONS.get(row[col["Action"]].strip().lower())
        if action is None:
            raise ValueError(f"{where}: Action {row[col['Action']]!r} is not one of "
                             f"{', '.join(sorted(_ACTIONS))}")
        events.append(TraceEvent(
            thread=_parse_int(row[col["Thread"]], "Thread", where) if "Thread" in col else 0,
            time=_parse_time(row[col["Time"]], where) if "Time" in col else 0.0,
            action=action,
            pointer=_parse_int(row[col["Pointer"]], "Pointer", where),
            size=_parse_int(row[col["Size"]], "Size", where),
            stream=_parse_int(row[col["Stream"]], "Stream", where) if "Stream" in col else 0))
    return events


def write_rmm_log(events, destination):
    """Write :class:`TraceEvent` s as an RMM CSV log (times in seconds,
    pointers and streams in hex) to ``destination``, a path or an open text
    file."""
    if isinstance(destination, (str, Path)):
        with open(destination, "w", newline="") as f:
            _write(events, f)
    else:
        _write(events, destination)


def _write(events, f):
    out = csv.writer(f, lineterminator="\n")
    out.writerow(HEADER)
    for e in events:
        out.writerow((e.thread, f"{e.time:.6f}", e.action, f"{e.pointer:#x}", e.size,
                      f"{e.stream:#x}"))


def events_from_history(entries):
    """The :class:`TraceEvent` s of recorded
    :class:`~numba_alloc.history.TraceEntry` s: a move becomes two (see the
    module docstring); segment events are left out."""
    events = []
    for e in entries:
        seconds = e.time_ns / 1e9
        if e.action == ALLOC:
            events.append(TraceEvent(e.thread_id, seconds, ALLOCATE, e.address, e.size, 0))
        elif e.action == FREE:
            events.append(TraceEvent(e.thread_id, seconds, DEALLOCATE, e.address, e.size, 0))
        elif e.action == MOVE:
            events.append(TraceEvent(e.thread_id, seconds, DEALLOCATE, e.old_address, e.size, 0))
            events.append(TraceEvent(e.thread_id, seconds, ALLOCATE, e.address, e.size, 0))
        elif e.action == OOM:
            events.append(TraceEvent(e.thread_id, seconds, ALLOCATE_FAILURE, 0, e.size, 0))
    return events


def dump_trace(path, device=None):
    """Write a pool's recorded history as an RMM CSV log to ``path`` (a
    path or an open text file); return the number of events written.
    ``device``: a Pool, a GPU number, or None (the current GPU). Raises
    RuntimeError when the pool records no history."""
    with resolve_pool(device) as pool, pool_lock(pool):
        entries = list(require_history(pool).entries)
    events = events_from_history(entries)
    write_rmm_log(events, path)
    return len(events)
