"""RMM CSV allocation logs: reading RMM's (old and new), writing ours."""

import gzip
import io
import os
import re

import pytest

import numba_alloc
from numba_alloc.observe.history import ALLOC, FREE, MOVE, OOM, TraceEntry
from numba_alloc.observe.trace import (ALLOCATE, ALLOCATE_FAILURE, BUNDLED_TRACE, DEALLOCATE,
                               TraceEvent, events_from_history, read_rmm_log, write_rmm_log)

from workload import make_pool

NEW_RMM = """Thread,Time,Action,Pointer,Size,Stream
140573312345856,1634567890.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020
140573312345856,1634567890.234567,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,1634567890.345678,deallocate,0x7f8a40000000,1024,0x7f8a38001020
140573312345856,1634567890.345679,allocate failure,(nil),1099511627776,0x0
"""
OLD_RMM = """Thread,Time,Action,Pointer,Size,Stream
139968385726208,10:34:12.123456,allocate,0x7f4b0a000000,256,0x0
139968385726208,10:34:12:223456,free,0x7f4b0a000000,256,0x0

139968385726209,23:59:59.5,allocate,140000000000,512,0
"""


def test_reads_current_rmm_logs():
    events = read_rmm_log(io.StringIO(NEW_RMM))
    assert events[0] == TraceEvent(140573312345856, 1634567890.123456, ALLOCATE,
                                   0x7f8a40000000, 1024, 0x7f8a38001020)
    assert [e.action for e in events] == [ALLOCATE, ALLOCATE, DEALLOCATE, ALLOCATE_FAILURE]
    assert (events[3].pointer, events[3].size, events[3].stream) == (0, 1 << 40, 0)


def test_reads_older_logs_with_clock_times_and_free():
    events = read_rmm_log(io.StringIO(OLD_RMM))
    assert [e.action for e in events] == [ALLOCATE, DEALLOCATE, ALLOCATE]
    assert events[0].time == pytest.approx(10 * 3600 + 34 * 60 + 12.123456)
    assert events[1].time == pytest.approx(10 * 3600 + 34 * 60 + 12.223456)
    assert events[2].time == pytest.approx(86399.5)
    assert events[2].pointer == 140000000000


def test_reads_logs_without_thread_time_or_stream_columns():
    (event,) = read_rmm_log(io.StringIO("Action,Size,Pointer\nallocate,64,0x40\n"))
    assert event == TraceEvent(0, 0.0, ALLOCATE, 0x40, 64, 0)


@pytest.mark.parametrize("text, match", [
    ("Thread,Time,What\n1,2,3\n", "not an RMM allocation log"),
    ("Thread,Time,Action,Pointer,Size,Stream\n1,0.5,allocate,0x10,12x,0x0\n", "line 2: Size '12x'"),
    ("Thread,Time,Action,Pointer,Size,Stream\n1,0.5,reallocate,0x10,12,0x0\n",
     "line 2: Action 'reallocate'"),
    ("Thread,Time,Action,Pointer,Size,Stream\n1,0.5,allocate,0x10,8,0x0\n1,noon,free,0x10,8,0x0\n",
     "line 3: Time 'noon'"),
    ("Thread,Time,Action,Pointer,Size,Stream\n1,0.5,allocate,0x10\n", "line 2: 4 fields"),
])
def test_unreadable_logs_name_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        read_rmm_log(io.StringIO(text))


GOOD_LINE = "1,0.5,allocate,0x10,8,0x0"
HEADER_LINE = "Thread,Time,Action,Pointer,Size,Stream"


@pytest.mark.parametrize("bad_line, match", [
    ("1,0.5,allocate,0x10,-8,0x0", "Size '-8' is not a whole number of bytes"),
    ("1,0.5,allocate,0x10,1.5,0x0", "Size '1.5'"),
    ("1,0.5,allocate,0x10,1e3,0x0", "Size '1e3'"),
    ("1,0.5,allocate,0x10,+8,0x0", "Size '\\+8'"),
    ("1,0.5,allocate,0x10,1_000,0x0", "Size '1_000'"),
    ("1,0.5,allocate,0x10,\u0663,0x0", "Size"),                       # an Arabic-Indic 3
    ("1,0.5,allocate,0x10,,0x0", "Size ''"),
    (f"1,0.5,allocate,0x10,{1 << 64},0x0", "Size '18446744073709551616'"),
    ("1,0.5,allocate,-0x10,8,0x0", "Pointer '-0x10'"),
    ("1,0.5,allocate,0xZZ,8,0x0", "Pointer '0xZZ'"),
    ("1,0.5,allocate,0x10000000000000000,8,0x0", "Pointer"),
    ("-1,0.5,allocate,0x10,8,0x0", "Thread '-1'"),
    ("1,0.5,allocate,0x10,8,stream", "Stream 'stream'"),
    ("1,nan,allocate,0x10,8,0x0", "Time 'nan'"),
    ("1,inf,allocate,0x10,8,0x0", "Time 'inf'"),
    ("1,1e999,allocate,0x10,8,0x0", "Time '1e999'"),
    ("1,-1.5,allocate,0x10,8,0x0", "Time '-1.5'"),
    ("1,25:00:00.5,allocate,0x10,8,0x0", "Time '25:00:00.5'"),
    ("1,10:61:00.5,allocate,0x10,8,0x0", "Time '10:61:00.5'"),
    ("1,0.5,allocated,0x10,8,0x0", "Action 'allocated' is not one of"),
    ("1,0.5,,0x10,8,0x0", "Action ''"),
    ("1,0.5,allocate,0x10,8,0x0,extra", "7 fields, the header has 6"),
    ("1,0.5,allocate,0x10,8", "5 fields, the header has 6"),
    ("1,0.5,allocate failure,0x10,8,0x0", "an allocate failure has a null Pointer"),
    ("1,0.5,allocate,(nil),8,0x0", "an allocate at a null Pointer must have Size 0"),
    ("1,0.5,allocate,0x10,8\x00,0x0", "Size"),
    ('1,0.5,allocate,"0x10,8,0x0', "unexpected end of data"),
    ("1,0.5,allocate,0x10," + "9" * 200_000 + ",0x0", "field larger than field limit"),
])
def test_every_malformed_line_is_refused_naming_the_file_and_line(bad_line, match, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([HEADER_LINE, GOOD_LINE, "", bad_line, GOOD_LINE]) + "\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}, line 4: {match}"):
        read_rmm_log(path)


@pytest.mark.parametrize("content, match", [
    (b"Thread,Time,Action,Pointer,Size,Stream\n1,0.5,allocate,0x10,8,0x0\n1,0.5,\xff\n",
     "line 3: not UTF-8 text"),
    (b"Thread,Action,Pointer,Size,Action\n", "line 1: the header names Action twice"),
    (b"", "is not an RMM allocation log"),
])
def test_files_that_are_not_logs_are_refused_naming_the_file(content, match, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}.*{match}"):
        read_rmm_log(path)


def test_reading_takes_a_byte_order_mark_and_windows_line_ends(tmp_path):
    path = tmp_path / "windows.csv"
    path.write_bytes(b"\xef\xbb\xbf" + f"{HEADER_LINE}\r\n{GOOD_LINE}\r\n".encode())
    assert read_rmm_log(path) == [TraceEvent(1, 0.5, ALLOCATE, 0x10, 8, 0)]


@pytest.mark.parametrize("source", [None, 42, 3.5])
def test_a_source_that_is_neither_a_path_nor_a_file_is_a_type_error(source):
    with pytest.raises(TypeError, match="source must be a path or an open text file"):
        read_rmm_log(source)


def test_a_file_opened_in_binary_mode_is_refused(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text(NEW_RMM)
    with open(path, "rb") as f, pytest.raises(ValueError, match="line 1: .*text mode"):
        read_rmm_log(f)


def test_write_then_read_gives_the_events_back(tmp_path):
    events = read_rmm_log(io.StringIO(NEW_RMM))
    path = tmp_path / "log.csv"
    write_rmm_log(events, path)
    text = path.read_text()
    assert text.splitlines()[0] == "Thread,Time,Action,Pointer,Size,Stream"
    assert text.splitlines()[4] == ("140573312345856,1634567890.345679,allocate failure,0x0,"
                                    "1099511627776,0x0")
    assert read_rmm_log(path) == events


@pytest.mark.parametrize("name", ["log.csv.gz", "log.csv"])
def test_a_gzip_compressed_log_reads_as_the_plain_one_whatever_its_name(name, tmp_path):
    path = tmp_path / name
    path.write_bytes(gzip.compress(NEW_RMM.encode()))
    assert read_rmm_log(path) == read_rmm_log(io.StringIO(NEW_RMM))
    assert len(read_rmm_log(path)) == 4


def test_a_gzip_log_cut_short_or_corrupt_is_refused_naming_the_file_and_line(tmp_path):
    header, line = NEW_RMM.splitlines()[:2]
    packed = gzip.compress("\n".join([header] + [line] * 5000).encode())
    path = tmp_path / "log.csv.gz"
    path.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}, line [0-9]+: the "
                                         "gzip-compressed file is cut short or corrupt"):
        read_rmm_log(path)
    path.write_bytes(packed[:40] + bytes(b ^ 0xFF for b in packed[40:80]) + packed[80:])
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}, line 1: the "
                                         "gzip-compressed file is cut short or corrupt"):
        read_rmm_log(path)


def _entry(action, address, size=100, old=0, time_ns=1_500_000_000_000):
    return TraceEntry(action, address, size, 512, time_ns, 7, old, 0, 0, 0, 0, ())


def test_history_becomes_the_log_of_requests_and_moves():
    events = events_from_history([
        _entry(ALLOC, 0x1000), _entry(ALLOC, 0x2000),
        _entry(MOVE, 0x800, old=0x1000, time_ns=2_000_000_000_000),
        _entry(MOVE, 0x400, old=0x800),                                     # moved twice
        _entry(FREE, 0x400),                                                # freed where it is
        _entry(OOM, 0, size=1 << 40), _entry(FREE, 0x2000)])
    assert [(e.action, e.pointer, e.size) for e in events] == [
        (ALLOCATE, 0x1000, 100), (ALLOCATE, 0x2000, 100),
        (DEALLOCATE, 0x1000, 100), (ALLOCATE, 0x800, 100),                  # the first move
        (DEALLOCATE, 0x800, 100), (ALLOCATE, 0x400, 100),                   # the second
        (DEALLOCATE, 0x400, 100), (ALLOCATE_FAILURE, 0, 1 << 40), (DEALLOCATE, 0x2000, 100)]
    assert events[0].time == 1500.0 and events[0].thread == 7
    assert events[2].time == events[3].time == 2000.0                      # at the move


def live_pointer_errors(events):
    """Where ``events`` (a log that begins with nothing live) allocate a
    pointer that is live, or free one that is not live at that size; and
    the pointers live at the end, with their sizes."""
    live, errors = {}, []
    for number, e in enumerate(events):
        if e.action == ALLOCATE:
            if e.pointer in live:
                errors.append(f"event {number}: allocate at live {e.pointer:#x}")
            live[e.pointer] = e.size
        elif e.action == DEALLOCATE:
            if live.pop(e.pointer, None) != e.size:
                errors.append(f"event {number}: deallocate of {e.pointer:#x}, not live "
                              f"at {e.size} bytes")
    return errors, live


def test_live_pointers_in_the_log_stay_unique_when_moved_blocks_addresses_are_reused():
    events = events_from_history([
        _entry(ALLOC, 0x1000, size=1), _entry(ALLOC, 0x2000, size=2),
        _entry(MOVE, 0x3000, old=0x1000, size=1),  # block 1 leaves 0x1000
        _entry(MOVE, 0x1000, old=0x2000, size=2),  # block 2 takes 0x1000, leaves 0x2000
        _entry(ALLOC, 0x2000, size=3),             # block 3 where block 2 was
        _entry(FREE, 0x3000, size=1), _entry(FREE, 0x1000, size=2), _entry(FREE, 0x2000, size=3)])
    assert live_pointer_errors(events) == ([], {})


def dumped(pool):
    """The pool's history written by dump_trace and read back."""
    log = io.StringIO()
    numba_alloc.dump_trace(log, device=pool)
    log.seek(0)
    return read_rmm_log(log)


def test_a_block_moved_onto_a_pointer_freed_earlier_keeps_the_log_replayable():
    device, pool = make_pool(defrag=True)
    numba_alloc.record_history(device=pool)
    a, c = pool.malloc(1024), pool.malloc(1024)
    old_c = c.address
    pool.free(a)
    pool.synchronize()
    pool.defragment()
    assert c.address == a.address              # c moved to where a was
    d = pool.malloc(1024)
    assert d.address == old_c                  # d took c's old pointer while c lives
    events = dumped(pool)
    assert live_pointer_errors(events) == ([], {c.address: 1024, d.address: 1024})
    assert [(e.action, e.pointer) for e in events] == [
        (ALLOCATE, a.address), (ALLOCATE, old_c), (DEALLOCATE, a.address),
        (DEALLOCATE, old_c), (ALLOCATE, c.address),                         # the move
        (ALLOCATE, d.address)]
    report = numba_alloc.replay_trace(events, make_pool()[1])
    assert (report.unknown_frees, report.reused_addresses, report.failed_requests) == (0, 0, 0)


def test_dump_trace_writes_the_recorded_history(tmp_path):
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    a, b = pool.malloc(100), pool.malloc(200)
    pool.free(a)
    with pytest.raises(numba_alloc.OutOfMemoryError):
        pool.malloc(device.capacity + 1)
    path = tmp_path / "ours.csv"
    assert numba_alloc.dump_trace(path, device=pool) == 4
    events = read_rmm_log(path)
    assert [(e.action, e.pointer, e.size) for e in events] == [
        (ALLOCATE, a.address, 100), (ALLOCATE, b.address, 200), (DEALLOCATE, a.address, 100),
        (ALLOCATE_FAILURE, 0, device.capacity + 1)]


def test_dump_trace_needs_a_recorded_history(tmp_path):
    _, pool = make_pool()
    with pytest.raises(RuntimeError, match="record_history"):
        numba_alloc.dump_trace(tmp_path / "x.csv", device=pool)


def test_the_bundled_trace_is_a_small_messy_training_loop():
    assert BUNDLED_TRACE.stat().st_size < 500_000
    events = read_rmm_log(BUNDLED_TRACE)
    assert len(events) > 4000
    actions = [e.action for e in events]
    assert actions.count(ALLOCATE_FAILURE) == 1
    assert len({e.thread for e in events}) == 2                   # main and data loader
    times = [e.time for e in events]
    assert times == sorted(times) and 0.2 < times[-1] - times[0] < 60


def test_bad_events_leave_the_destination_as_it_was(tmp_path):
    """The events are checked before the file is opened: a bad one used to
    raise AttributeError after the file was truncated to the header."""
    path = tmp_path / "precious.csv"
    path.write_text("kept\n")
    good = read_rmm_log(io.StringIO(NEW_RMM))
    for bad, error in (([1], TypeError), (good + [good[0]._replace(size=-1)], ValueError),
                       (None, TypeError)):
        with pytest.raises(error, match=r"events"):
            write_rmm_log(bad, path)
        assert path.read_text() == "kept\n"
    with pytest.raises(TypeError, match="destination must be a path or an open text file"):
        write_rmm_log(good, 3)
    write_rmm_log(good, os.fsencode(path))
    assert read_rmm_log(path) == good


def test_dump_trace_of_a_request_beyond_64_bits_reads_back(tmp_path):
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    with pytest.raises(numba_alloc.OutOfMemoryError):
        pool.malloc(1 << 70)
    path = tmp_path / "ours.csv"
    assert numba_alloc.dump_trace(path, device=pool) == 1
    assert [(e.action, e.size) for e in read_rmm_log(path)] == [(ALLOCATE_FAILURE, (1 << 64) - 1)]
