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
import gzip
import math
import operator
import os
import re
import zlib
from pathlib import Path
from typing import NamedTuple

from .history import ALLOC, BRING_BACK, FREE, MOVE, OOM, RECLAIM, pool_lock, require_history
from ..plugin.registry import resolve_pool
from ..validate import as_int

ALLOCATE = "allocate"
DEALLOCATE = "deallocate"
ALLOCATE_FAILURE = "allocate failure"
HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
BUNDLED_TRACE = Path(__file__).parents[1] / "data" / "training_loop.csv"
_ACTIONS = {"allocate": ALLOCATE, "deallocate": DEALLOCATE, "free": DEALLOCATE,
            "allocate failure": ALLOCATE_FAILURE}
_REQUIRED = ("Action", "Pointer", "Size")
_NULL = ("(nil)", "nullptr", "null")   # how loggers print a null pointer
_LIMIT = 1 << 64                       # pointers, sizes, threads and streams are 64-bit
_LONGEST_NUMBER = 40                   # characters; no 64-bit value needs more
_LONGEST_LINE = 1 << 20                # bytes; a log line is under 200
_GZIP_MAGIC = b"\x1f\x8b"              # the first bytes of a gzip file
_WHOLE = re.compile(r"0[xX][0-9a-fA-F]+|[0-9]+")
_SECONDS = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2}):([0-9]{2})(?:[.:]([0-9]{1,9}))?")
_ALLOWED = {
    "Thread": "a thread id: a whole number below 2**64 (decimal or 0x hex)",
    "Pointer": "an address below 2**64 (0x hex or decimal) or (nil)",
    "Size": "a whole number of bytes, 0 to 2**64 - 1 (decimal or 0x hex)",
    "Stream": "a stream handle below 2**64 (0x hex or decimal) or (nil)",
}


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


def _shown(text):
    """``text`` quoted for an error message, cut short when long."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _parse_whole(text, column, where):
    """A Thread, Pointer, Size or Stream field as an int in [0, 2**64)."""
    stripped = text.strip()
    if column in ("Pointer", "Stream") and stripped.lower() in _NULL:
        return 0
    if len(stripped) <= _LONGEST_NUMBER and _WHOLE.fullmatch(stripped):
        value = int(stripped, 16) if stripped[:2] in ("0x", "0X") else int(stripped)
        if value < _LIMIT:
            return value
    raise ValueError(f"{where}: {column} {_shown(text)} is not {_ALLOWED[column]}")


def _parse_time(text, where):
    """A Time field as seconds: since the epoch, or since midnight for a clock time."""
    stripped = text.strip()
    clock = _CLOCK.fullmatch(stripped)
    if clock:
        h, m, s, fraction = clock.groups()
        if int(h) < 24 and int(m) < 60 and int(s) <= 60:
            return (int(h) * 3600 + int(m) * 60 + int(s)
                    + (int(fraction) / 10 ** len(fraction) if fraction else 0))
    elif len(stripped) <= _LONGEST_NUMBER and _SECONDS.fullmatch(stripped):
        seconds = float(stripped)
        if math.isfinite(seconds):
            return seconds
    raise ValueError(f"{where}: Time {_shown(text)} is neither seconds (a number >= 0) "
                     "nor a clock time HH:MM:SS.ffffff")


def _contradiction(action, pointer, size):
    """What makes a line with these values impossible, or None."""
    if action == ALLOCATE_FAILURE and pointer:
        return f"an allocate failure has a null Pointer, got {pointer:#x}"
    if action == ALLOCATE and not pointer and size:
        return f"an allocate at a null Pointer must have Size 0, got {size}"
    return None


def read_rmm_log(source) -> "list[TraceEvent]":
    """The :class:`TraceEvent` s of an RMM CSV log, in file order.
    ``source``: a path (the file is read as UTF-8, decompressed first when
    it is gzip-compressed, whatever its name: ``log.csv.gz``) or an open
    text file.
    Thread, Time and Stream may be missing (read as 0). Raises ValueError,
    naming the file and line, for a file that is not such a log or any line
    that is not a well-formed event (see docs/observability.md); TypeError for a
    ``source`` of another kind. A deallocate of a pointer the log never
    allocated is read: a log may begin while blocks are live."""
    if isinstance(source, (str, bytes, os.PathLike)):
        name = os.fsdecode(source)
        with open(source, "rb") as f:
            if f.peek(len(_GZIP_MAGIC))[:len(_GZIP_MAGIC)] != _GZIP_MAGIC:
                return _read(_bounded_lines(f, name), name)
            with gzip.GzipFile(fileobj=f, mode="rb") as unpacked:
                return _read(_bounded_lines(unpacked, name), name)
    if not hasattr(source, "__iter__"):
        raise TypeError(f"source must be a path or an open text file, got {source!r}")
    return _read(source, str(getattr(source, "name", "trace")))


def _bounded_lines(f, name):
    """The lines of the binary file ``f`` as UTF-8 text (a byte-order mark
    first is dropped), read one at a time. ValueError naming the line for
    one that is not UTF-8 or is longer than _LONGEST_LINE bytes: a file
    that is not a log, such as /dev/zero, is refused without being read
    whole. A gzip stream cut short or corrupt: ValueError naming the line
    it breaks off in."""
    number = offset = 0
    while True:
        try:
            line = f.readline(_LONGEST_LINE + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ValueError(f"{name}, line {number + 1}: the gzip-compressed file is cut short "
                             f"or corrupt ({e})") from None
        if not line:
            return
        number += 1
        if len(line) > _LONGEST_LINE:
            raise ValueError(f"{name}, line {number}: over {_LONGEST_LINE} bytes, "
                             "not a line of an RMM log")
        try:
            yield line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}, line {number}: not UTF-8 text ({e.reason} at byte "
                             f"{offset + e.start})") from None
        offset += len(line)


def _read(lines, name):
    rows = csv.reader(lines, strict=True)
    header = [column.strip() for column in _next_row(rows, name) or []]
    if header:
        header[0] = header[0].lstrip("\ufeff")
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise ValueError(f"{name} is not an RMM allocation log: its header must be "
                         f"{','.join(HEADER)}, got {_shown(','.join(header))}")
    twice = [c for c in HEADER if header.count(c) > 1]
    if twice:
        raise ValueError(f"{name}, line 1: the header names {twice[0]} twice")
    col = {c: header.index(c) for c in HEADER if c in header}
    events = []
    while True:
        number = rows.line_num + 1
        row = _next_row(rows, name)
        if row is None:
            return events
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        where = f"{name}, line {number}"
        if len(row) != len(header):
            raise ValueError(f"{where}: {len(row)} fields, the header has {len(header)}")
        action = _ACTIONS.get(row[col["Action"]].strip().lower())
        if action is None:
            raise ValueError(f"{where}: Action {_shown(row[col['Action']])} is not one of "
                             f"{', '.join(sorted(_ACTIONS))}")
        event = TraceEvent(
            thread=_parse_whole(row[col["Thread"]], "Thread", where) if "Thread" in col else 0,
            time=_parse_time(row[col["Time"]], where) if "Time" in col else 0.0,
            action=action,
            pointer=_parse_whole(row[col["Pointer"]], "Pointer", where),
            size=_parse_whole(row[col["Size"]], "Size", where),
            stream=_parse_whole(row[col["Stream"]], "Stream", where) if "Stream" in col else 0)
        problem = _contradiction(event.action, event.pointer, event.size)
        if problem:
            raise ValueError(f"{where}: {problem}")
        events.append(event)


def _next_row(rows, name):
    """The next row of the csv reader ``rows``, or None at the end; a line
    the csv module cannot split (a field over its size limit, a stray
    quote, bytes for text) raises ValueError naming it."""
    number = rows.line_num + 1
    try:
        return next(rows, None)
    except csv.Error as e:
        raise ValueError(f"{name}, line {number}: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}, line {number}: not text in the file's encoding "
                         f"({e.reason})") from None


def check_events(events, argument="events"):
    """``events`` as a list, each checked to be a :class:`TraceEvent` with
    the values a log line can hold (the rules of :func:`read_rmm_log`).
    Raises TypeError or ValueError naming the first bad one, as
    ``argument[index]``."""
    if isinstance(events, (str, bytes)) or not hasattr(events, "__iter__"):
        raise TypeError(f"{argument} must be a sequence of TraceEvent, got {events!r}")
    checked = list(events)
    for index, event in enumerate(checked):
        where = f"{argument}[{index}]"
        if not isinstance(event, TraceEvent):
            raise TypeError(f"{where} must be a TraceEvent, got {event!r}")
        for field in ("thread", "pointer", "size", "stream"):
            value = as_int(getattr(event, field), f"{where}.{field}")
            if not 0 <= value < _LIMIT:
                raise ValueError(f"{where}.{field} must be in [0, 2**64), got {value}")
        if (isinstance(event.time, bool) or not isinstance(event.time, (int, float))
                or not math.isfinite(event.time) or event.time < 0):
            raise ValueError(f"{where}.time must be a finite number of seconds >= 0, "
                             f"got {event.time!r}")
        if event.action not in (ALLOCATE, DEALLOCATE, ALLOCATE_FAILURE):
            raise ValueError(f"{where}.action must be one of {ALLOCATE!r}, {DEALLOCATE!r}, "
                             f"{ALLOCATE_FAILURE!r}, got {event.action!r}")
        problem = _contradiction(event.action, operator.index(event.pointer),
                                 operator.index(event.size))
        if problem:
            raise ValueError(f"{where}: {problem}")
    return checked


def write_rmm_log(events, destination) -> None:
    """Write :class:`TraceEvent` s as an RMM CSV log (times in seconds,
    pointers and streams in hex) to ``destination``, a path or an open text
    file. The events are checked first, each a :class:`TraceEvent` with the
    values a log line can hold (the rules of :func:`read_rmm_log`), so that
    a bad one raises TypeError or ValueError naming it (``events[i]``)
    before the file is opened (or truncated); TypeError for a
    ``destination`` of another kind."""
    events = check_events(events)
    if isinstance(destination, (str, bytes, os.PathLike)):
        with open(destination, "w", newline="") as f:
            _write(events, f)
    elif hasattr(destination, "write"):
        _write(events, destination)
    else:
        raise TypeError(f"destination must be a path or an open text file, got {destination!r}")


def _write(events, f):
    out = csv.writer(f, lineterminator="\n")
    out.writerow(HEADER)
    for e in events:
        out.writerow((e.thread, f"{e.time:.6f}", e.action, f"{e.pointer:#x}", e.size,
                      f"{e.stream:#x}"))


def events_from_history(entries):
    """The :class:`TraceEvent` s of recorded
    :class:`~numba_alloc.observe.history.TraceEntry` s: a move becomes two (see the
    module docstring), a reclaim to host memory a free and a bring-back an
    allocation; segment events, and frees of reclaimed blocks (no device
    memory), are left out."""
    events = []
    for e in entries:
        seconds = e.time_ns / 1e9
        if e.action in (ALLOC, BRING_BACK):
            events.append(TraceEvent(e.thread_id, seconds, ALLOCATE, e.address, e.size, 0))
        elif e.action in (FREE, RECLAIM):
            events.append(TraceEvent(e.thread_id, seconds, DEALLOCATE, e.address, e.size, 0))
        elif e.action == MOVE:
            events.append(TraceEvent(e.thread_id, seconds, DEALLOCATE, e.old_address, e.size, 0))
            events.append(TraceEvent(e.thread_id, seconds, ALLOCATE, e.address, e.size, 0))
        elif e.action == OOM:     # a request of 2**64 bytes or more: the most a log holds
            events.append(TraceEvent(e.thread_id, seconds, ALLOCATE_FAILURE, 0,
                                     min(e.size, _LIMIT - 1), 0))
    return events


def dump_trace(path, device=None) -> int:
    """Write a pool's recorded history as an RMM CSV log to ``path`` (a
    path or an open text file); return the number of events written.
    ``device``: a Pool, a GPU number, or None (the current GPU). Raises
    RuntimeError when the pool records no history."""
    with resolve_pool(device) as pool, pool_lock(pool):
        entries = list(require_history(pool).entries)
    events = events_from_history(entries)
    write_rmm_log(events, path)
    return len(events)
