"""Replaying RMM CSV logs through the pool, and the replay command."""

import gzip
import io
import re
import subprocess
import sys

import pytest

import numba_alloc
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.observe.trace import ALLOCATE, ALLOCATE_FAILURE, DEALLOCATE, TraceEvent, read_rmm_log

from workload import MiB, make_pool, mixed

MESSY = """Thread,Time,Action,Pointer,Size,Stream
1,10:00:00.000001,free,0x7f0000099000,4096,0x0
1,10:00:00.000002,allocate,0x7f0000100000,1048576,0x0
1,10:00:00.000003,allocate,0x7f0000200000,3145728,0x0
1,10:00:00.000004,allocate failure,(nil),1099511627776,0x0
1,10:00:00.000005,allocate,0x7f0000100000,2097152,0x0
1,10:00:00.000006,allocate,0x7f0000300000,68719476736,0x0
1,10:00:00.000007,free,0x7f0000300000,68719476736,0x0
1,10:00:00.000008,free,0x7f0000200000,3145728,0x0
1,10:00:00.000009,free,0x7f0000100000,2097152,0x0
"""


def test_messy_logs_are_counted_not_fatal():
    _, pool = make_pool(capacity=64 * MiB)
    report = numba_alloc.replay_trace(read_rmm_log(io.StringIO(MESSY)), pool)
    assert (report.events, report.allocations, report.frees) == (9, 3, 2)
    assert report.unknown_frees == 1          # 0x...99000 was never allocated in the log
    assert report.reused_addresses == 1       # 0x...100000 allocated again while live
    assert report.recorded_failures == 1
    assert report.failed_requests == 1        # 64 GiB cannot fit in 64 MiB; its free is skipped
    assert report.peak_live_bytes == 5 * MiB  # 3 MiB + 2 MiB after the reused address's free
    assert report.peak_allocated == 5 * MiB
    assert report.peak_reserved == 20 * MiB     # a small segment, and 18 MiB for six 3 MiB blocks
    assert report.host_us_per_op > 0
    assert compat.memory_allocated(pool) == 0       # the replay leaves nothing allocated


FIRST_USE = """
import io, sys, time, types
import numba_alloc
from numba_alloc.cli import replay

at_first_timed_call = []
def clock():
    if not at_first_timed_call:
        at_first_timed_call.append("numba_alloc.observe.out_of_memory" in sys.modules)
    return time.perf_counter_ns()

replay.time = types.SimpleNamespace(perf_counter_ns=clock)
pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(64 << 20))
report = numba_alloc.replay_trace(io.StringIO(sys.stdin.read()), pool)
assert report.failed_requests == 1
print(at_first_timed_call[0])
"""


def test_the_host_time_does_not_count_the_first_use_of_the_pools_code():
    """In a fresh process, the first timed call finds the out-of-memory
    error's modules imported (the warm-up replay imported them): counted,
    importing them and Numba's compiling (before the core was built ahead
    of time) made the bundled trace's figure 35-100 us per operation,
    against 2-3 us warm."""
    out = subprocess.run([sys.executable, "-c", FIRST_USE], input=MESSY,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "True\n"


class NotSimulated(numba_alloc.Backend):
    """A backend that is not a SimulatedDevice (as a GPU's), over one."""

    def __init__(self, capacity):
        self.device = SimulatedDevice(capacity)
        self.name, self.device_id = "other", 0

    def allocate(self, nbytes):
        return self.device.allocate(nbytes)

    def release(self, address):
        self.device.release(address)

    def memory_info(self):
        return self.device.memory_info()

    def event(self):
        return self.device.event()

    def synchronize(self):
        self.device.synchronize()

    def copy(self, batches, first):
        self.device.copy(batches, first)

    def move_counters(self):
        return self.device.move_counters()


@pytest.mark.parametrize("backend, holds_data", [
    (SimulatedDevice, True), (lambda capacity: SimulatedDevice(capacity, holds_data=False), False),
    (NotSimulated, False)])
def test_the_warm_up_pool_has_the_replayed_pools_policy_and_holds_data_only_when_it_does(
        backend, holds_data, monkeypatch):
    """The warm-up loads what the timed replay runs (the NumPy copies of a
    simulated device that holds data); on any other device its blocks
    move without host memory."""
    from numba_alloc.cli import replay
    made = []
    monkeypatch.setattr(replay, "Pool", lambda device, **settings: made.append(
        (device, settings)) or Pool(device, **settings))
    pool = Pool(backend(64 * MiB), defrag=True, max_split_size_mb=32)
    numba_alloc.replay_trace(read_rmm_log(io.StringIO(MESSY)), pool)
    (device, settings), = made
    assert isinstance(device, SimulatedDevice) and device.capacity == 64 * MiB
    assert device.holds_data is holds_data
    assert settings["defrag"] is True and settings["max_split_size_mb"] == 32


def test_a_trace_can_be_an_open_file_or_any_sequence_of_events():
    _, pool = make_pool(capacity=64 * MiB)
    from_file = numba_alloc.replay_trace(io.StringIO(MESSY), pool)
    from_tuple = numba_alloc.replay_trace(tuple(read_rmm_log(io.StringIO(MESSY))), pool)
    assert (from_file.events, from_file.frees) == (from_tuple.events, from_tuple.frees) == (9, 2)
    assert compat.memory_allocated(pool) == 0


def test_peak_and_fragmentation_of_a_known_trace():
    events = [TraceEvent(0, 0.0, ALLOCATE, 0x100 * i, 4 * MiB, 0) for i in range(1, 5)]
    events += [TraceEvent(0, 0.0, DEALLOCATE, 0x100 * i, 4 * MiB, 0) for i in (1, 3)]
    _, pool = make_pool()
    report = numba_alloc.replay_trace(events, pool)
    # 4 x 4 MiB in one 20 MiB segment; freeing the 1st and 3rd leaves free
    # blocks of 4, 4 and 4 MiB: largest 4 of 12
    assert report.peak_reserved == 20 * MiB and report.peak_live_bytes == 16 * MiB
    assert report.fragmentation == pytest.approx(1 - 4 / 12)
    assert (report.unknown_frees, report.reused_addresses, report.failed_requests) == (0, 0, 0)


def test_the_report_reads_as_text():
    _, pool = make_pool(capacity=64 * MiB)
    text = numba_alloc.replay_trace(read_rmm_log(io.StringIO(MESSY)), pool).format()
    assert "9 events" in text
    assert "allocations 3, frees 2, failed requests 1" in text
    assert "recorded failures 1, unknown frees 1, reused addresses 1" in text
    assert "peak reserved 20.00 MiB" in text and "us per operation" in text


def test_a_recorded_history_replays_to_the_same_peaks():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    live = mixed(pool, device, steps=400, seed=2)
    peak_live = max(e.requested for e in numba_alloc.recorded_events(pool))
    log = io.StringIO()
    numba_alloc.dump_trace(log, device=pool)
    log.seek(0)
    _, fresh = make_pool()
    report = numba_alloc.replay_trace(read_rmm_log(log), fresh)
    assert (report.unknown_frees, report.reused_addresses, report.failed_requests) == (0, 0, 0)
    assert report.allocations == sum(e.action == "alloc" for e in numba_alloc.recorded_events(pool))
    assert report.peak_live_bytes == peak_live
    assert report.peak_allocated >= report.peak_live_bytes
    assert len(live) == report.allocations - report.frees


@pytest.mark.skipif(not hasattr(Pool, "defragment"), reason="defragmentation not built yet")
def test_a_history_with_defragmentation_moves_replays_cleanly():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    live = mixed(pool, device, steps=300, seed=8)
    pool.synchronize()
    numba_alloc.defragment(pool)
    live += mixed(pool, device, steps=200, seed=9)
    for block in live:
        if block.state == "allocated":
            pool.free(block)
    log = io.StringIO()
    numba_alloc.dump_trace(log, device=pool)
    log.seek(0)
    report = numba_alloc.replay_trace(read_rmm_log(log), make_pool()[1])
    assert (report.unknown_frees, report.reused_addresses) == (0, 0)
    assert report.allocations == report.frees


def test_the_bundled_trace_replays_with_its_oddities_counted():
    report = numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, Pool(SimulatedDevice("1GiB")))
    assert report.recorded_failures == 1
    assert report.unknown_frees == 4          # two batches prefetched before logging began
    assert report.reused_addresses == 1       # one deallocate line lost
    assert report.failed_requests == 0
    assert 500 * MiB < report.peak_live_bytes <= report.peak_allocated <= report.peak_reserved
    assert report.peak_reserved < 1024 * MiB


def test_replay_refuses_what_is_not_a_log(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="not an RMM allocation log"):
        numba_alloc.replay_trace(str(path), make_pool()[1])


def current_stats(pool):
    """The pool's current values that a replay must leave as they were (its
    cache, reserved segments and their free splits, aside)."""
    stats = pool.memory_stats()
    return {key: value for key, value in stats.items() if key.endswith(".current") and
            key.split(".")[0] in ("allocation", "allocated_bytes", "active", "active_bytes",
                                  "requested_bytes")}


def pool_with_live_blocks():
    """A pool holding a few blocks of its own before a replay."""
    _, pool = make_pool(capacity=64 * MiB)
    held = [pool.malloc(n) for n in (1000, 3 * MiB, 70_000)]
    return pool, held


GOOD = [TraceEvent(0, 0.0, ALLOCATE, 0x100 * i, 300 * i, 0) for i in range(1, 6)]


@pytest.mark.parametrize("bad, match", [
    (TraceEvent(0, 0.0, ALLOCATE, 0x9000, -5, 0), r"trace\[3\]\.size must be in \[0, 2\*\*64\)"),
    (TraceEvent(0, 0.0, ALLOCATE, 0x9000, 2.5, 0), r"trace\[3\]\.size must be an int"),
    (TraceEvent(0, 0.0, "alloc", 0x9000, 8, 0), r"trace\[3\]\.action must be one of"),
    (TraceEvent(0, float("nan"), ALLOCATE, 0x9000, 8, 0), r"trace\[3\]\.time must be"),
    (TraceEvent(0, 0.0, ALLOCATE, -1, 8, 0), r"trace\[3\]\.pointer must be in"),
    (TraceEvent(0, 0.0, ALLOCATE_FAILURE, 0x10, 8, 0), r"trace\[3\]: an allocate failure"),
    ((0, 0.0, ALLOCATE, 0x9000, 8, 0), r"trace\[3\] must be a TraceEvent"),
])
def test_a_malformed_event_is_refused_naming_it_before_anything_is_allocated(bad, match):
    pool, held = pool_with_live_blocks()
    before, allocations = current_stats(pool), compat.get_num_allocs(pool)
    with pytest.raises((TypeError, ValueError), match=match):
        numba_alloc.replay_trace(GOOD[:3] + [bad] + GOOD[3:], pool)
    assert current_stats(pool) == before and compat.get_num_allocs(pool) == allocations
    assert all(block.state == "allocated" for block in held)


@pytest.mark.parametrize("trace", [42, None])
def test_a_trace_of_another_kind_is_a_type_error(trace):
    with pytest.raises(TypeError, match="trace must be a sequence of TraceEvent"):
        numba_alloc.replay_trace(trace, make_pool()[1])


def test_a_malformed_file_is_refused_naming_its_line_before_anything_is_allocated(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(MESSY.replace("2097152", "-2097152"))
    pool, _ = pool_with_live_blocks()
    allocations = compat.get_num_allocs(pool)
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}, line 6: Size '-2097152'"):
        numba_alloc.replay_trace(path, pool)
    assert compat.get_num_allocs(pool) == allocations


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "numba_alloc.cli", *args],
                          capture_output=True, text=True)


def test_replay_command_on_the_simulated_device(tmp_path):
    path = tmp_path / "messy.csv"
    path.write_text(MESSY)
    out = run_cli("replay", str(path), "--capacity", "64MiB", "--defrag")
    assert out.returncode == 0, out.stderr
    assert "on simulated device 0: 9 events" in out.stdout
    assert "failed requests 1" in out.stdout
    assert "numba_alloc memory summary" in out.stdout


def test_replay_command_reads_a_gzip_compressed_log(tmp_path):
    plain, packed = tmp_path / "messy.csv", tmp_path / "messy.csv.gz"
    plain.write_text(MESSY)
    packed.write_bytes(gzip.compress(MESSY.encode()))
    outs = [run_cli("replay", str(path), "--capacity", "64MiB") for path in (plain, packed)]
    assert outs[1].returncode == 0, outs[1].stderr
    report = [out.stdout.split("\n", 1)[1].split("host time")[0] for out in outs]
    assert "9 events" in outs[1].stdout and report[0] == report[1]


def test_replay_and_demo_default_to_the_bundled_trace():
    for args in (("replay",), ("demo", "--trace", "--simulated")):
        out = run_cli(*args)
        assert out.returncode == 0, out.stderr
        assert "training_loop.csv" in out.stdout
        assert "recorded failures 1, unknown frees 4, reused addresses 1" in out.stdout


def test_replay_command_rejects_a_bad_setting():
    out = run_cli("replay", "--conf", "max_split_size_mb:3")
    assert out.returncode != 0 and "max_split_size_mb" in out.stderr


# -- on a GPU -------------------------------------------------------------------

from gpu_marks import needs_gpu


@needs_gpu
def test_replay_command_on_the_gpu():
    out = run_cli("replay", "--device")
    assert out.returncode == 0, out.stderr
    assert "on cuda device 0: " in out.stdout
    assert "failed requests 0" in out.stdout
