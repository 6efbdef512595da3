"""RMM CSV allocation logs: reading RMM's (old and new), writing ours."""

import io

import pytest

import numba_alloc
from numba_alloc.history import ALLOC, FREE, MOVE, OOM, TraceEntry
from numba_alloc.trace import (ALLOCATE, ALLOCATE_FAILURE, BUNDLED_TRACE, DEALLOCATE,
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


def test_write_then_read_gives_the_events_back(tmp_path):
    events = read_rmm_log(io.StringIO(NEW_RMM))
    path = tmp_path / "log.csv"
    write_rmm_log(events, path)
    text = path.read_text()
    assert text.splitlines()[0] == "Thread,Time,Action,Pointer,Size,Stream"
    assert text.splitlines()[4] == ("140573312345856,1634567890.345679,allocate failure,0x0,"
                                    "1099511627776,0x0")
    assert read_rmm_log(path) == events


def _entry(action, address, size=100, old=0, time_ns=1_500_000_000_000):
    return TraceEntry(action, address, size, 512, time_ns, 7, old, 0, 0, 0, 0, ())


def test_history_becomes_the_log_of_requests_moves_left_out():
    events = events_from_history([
        _entry(ALLOC, 0x1000), _entry(ALLOC, 0x2000),
        _entry(MOVE, 0x800, old=0x1000), _entry(MOVE, 0x400, old=0x800),   # moved twice
        _entry(FREE, 0x400),                                                # freed where it is
        _entry(OOM, 0, size=1 << 40), _entry(FREE, 0x2000)])
    assert [(e.action, e.pointer, e.size) for e in events] == [
        (ALLOCATE, 0x1000, 100), (ALLOCATE, 0x2000, 100), (DEALLOCATE, 0x1000, 100),
        (ALLOCATE_FAILURE, 0, 1 << 40), (DEALLOCATE, 0x2000, 100)]
    assert events[0].time == 1500.0 and events[0].thread == 7


def test_live_pointers_in_the_log_stay_unique_when_moved_blocks_addresses_are_reused():
    events = events_from_history([
        _entry(ALLOC, 0x1000, size=1), _entry(ALLOC, 0x2000, size=2),
        _entry(MOVE, 0x3000, old=0x1000),          # block 1 leaves 0x1000
        _entry(MOVE, 0x1000, old=0x2000),          # block 2 takes 0x1000, leaves 0x2000
        _entry(ALLOC, 0x2000, size=3),             # block 3 where block 2 is logged
        _entry(FREE, 0x3000, size=1), _entry(FREE, 0x1000, size=2), _entry(FREE, 0x2000, size=3)])
    allocations = {e.size: e.pointer for e in events if e.action == ALLOCATE}
    frees = {e.size: e.pointer for e in events if e.action == DEALLOCATE}
    assert allocations == frees                    # each free names its allocation's pointer
    assert len(set(allocations.values())) == 3     # all three were live at once
    assert allocations[3] == 0x2000


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
