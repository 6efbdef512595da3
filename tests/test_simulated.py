"""The simulated device as a model of a GPU: one queue of work run in order,
events and synchronization that wait for the work queued before them, also
when several threads drive the device."""

import random
import threading
import time

import numpy as np
import pytest

from numba_alloc import SimulatedDevice
from numba_alloc.policy.backend import DeviceOutOfMemory

MiB = 1 << 20
WAIT = 5.0          # seconds a test waits for something that must happen


def run_in_thread(call):
    """Start ``call`` in a daemon thread; returns (thread, list of what it raised)."""
    raised = []

    def target():
        try:
            call()
        except BaseException as e:     # reported by the test
            raised.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, raised


def blocking_work(device):
    """Launch work that waits for ``go``; returns (started, go, finished)."""
    started, go, finished = threading.Event(), threading.Event(), threading.Event()

    def work():
        started.set()
        assert go.wait(WAIT)
        finished.set()

    device.launch(work)
    return started, go, finished


def test_synchronize_waits_for_work_another_thread_is_running():
    device = SimulatedDevice(MiB)
    started, go, finished = blocking_work(device)
    runner, runner_raised = run_in_thread(device.complete)
    assert started.wait(WAIT)
    syncer, syncer_raised = run_in_thread(device.synchronize)
    syncer.join(0.3)
    assert syncer.is_alive(), "synchronize returned while queued work was still running"
    assert device.pending_work == 1          # running, not finished
    go.set()
    syncer.join(WAIT)
    runner.join(WAIT)
    assert finished.is_set() and not syncer.is_alive() and not runner.is_alive()
    assert runner_raised == syncer_raised == []
    assert device.pending_work == 0


def test_events_and_later_work_wait_for_a_piece_another_thread_is_running():
    device = SimulatedDevice(MiB)
    first = device.event()
    started, go, _ = blocking_work(device)
    first.record()
    ran = []
    device.launch(lambda: ran.append("second"))
    second = device.event()
    second.record()
    runner, _ = run_in_thread(lambda: device.complete(1))
    assert started.wait(WAIT)
    other, _ = run_in_thread(lambda: device.complete(1))
    other.join(0.3)
    # the device runs one piece at a time: the second waits for the first
    assert ran == [] and not first.query() and not second.query()
    go.set()
    runner.join(WAIT)
    other.join(WAIT)
    assert ran == ["second"] and first.query() and second.query()


def test_work_runs_in_queue_order_one_at_a_time_and_completion_never_goes_back():
    device = SimulatedDevice(MiB)
    order, overlaps, lock = [], [], threading.Lock()
    running = [0]
    events = []
    launched = threading.Event()

    def work(number):
        def run():
            with lock:
                running[0] += 1
                if running[0] > 1:
                    overlaps.append(number)
            time.sleep(random.choice((0, 0, 0.0005)))   # let other threads in
            order.append(number)
            with lock:
                running[0] -= 1
        return run

    def launcher():
        for number in range(400):
            device.launch(work(number))
            event = device.event()
            event.record()
            events.append((number, event))
        launched.set()

    regressions = []

    def watcher():
        done = set()
        while not (launched.is_set() and device.pending_work == 0):
            for number, event in list(events):
                if event.query():
                    if number not in order:
                        regressions.append(f"event after work {number} completed before it ran")
                    done.add(number)
                elif number in done:
                    regressions.append(f"event after work {number} went back to pending")

    def completer(seed):
        rng = random.Random(seed)
        while not (launched.is_set() and device.pending_work == 0):
            if rng.random() < 0.5:
                device.complete(rng.randrange(1, 4))
            else:
                device.synchronize()

    threads = [run_in_thread(launcher), run_in_thread(watcher)]
    threads += [run_in_thread(lambda s=s: completer(s)) for s in range(3)]
    for thread, raised in threads:
        thread.join(60)
        assert not thread.is_alive() and raised == []
    assert order == list(range(400))
    assert overlaps == [] and regressions == []
    assert all(event.query() for _, event in events)


def test_work_that_raises_still_completes_and_the_device_goes_on():
    device = SimulatedDevice(MiB)

    def fail():
        raise ZeroDivisionError("in device work")

    device.launch(fail)
    event = device.event()
    event.record()
    ran = []
    device.launch(lambda: ran.append(1))
    with pytest.raises(ZeroDivisionError):
        device.complete(1)
    assert event.query() and device.pending_work == 1
    device.synchronize()
    assert ran == [1] and device.pending_work == 0


@pytest.mark.parametrize("wait", ["synchronize", "complete", "copy"])
def test_work_cannot_wait_for_the_device_it_runs_on(wait):
    device = SimulatedDevice(4 * MiB)
    calls = {"synchronize": device.synchronize, "complete": device.complete,
             "copy": lambda: device.copy([], 0)}
    device.launch(calls[wait])
    event = device.event()
    event.record()
    finished, raised = run_in_thread(device.synchronize)
    finished.join(WAIT)
    assert not finished.is_alive(), "the device deadlocked"
    assert len(raised) == 1 and isinstance(raised[0], RuntimeError)
    assert "cannot wait for the device" in str(raised[0])
    assert event.query()


def test_copy_runs_after_the_work_queued_before_it():
    device = SimulatedDevice(8 * MiB)
    src, dst = device.allocate(2 * MiB), device.allocate(2 * MiB)
    device.launch(lambda: device.write(src, np.full(4096, 7, np.uint8)))
    table = np.array([[0, 512, 4096]], dtype=np.int64)
    device.copy([((dst, 2 * MiB), (src, 2 * MiB), table)], 1)
    assert device.pending_work == 0
    assert (device.read(dst + 512, 4096) == 7).all()
    assert device.move_counters() == (1, 4096, 1)


def test_a_failed_copy_raises_in_the_caller_and_counts_what_was_done(monkeypatch):
    device = SimulatedDevice(8 * MiB)
    device.kernel_limit = 1 << 20           # the kernel's path, which fails here
    src, dst = device.allocate(2 * MiB), device.allocate(2 * MiB)

    def broken(*args):
        raise RuntimeError("launch failed")

    monkeypatch.setattr("numba_alloc.device.kernels.simulated_copy", broken)
    table = np.array([[0, 512, 16]], dtype=np.int64)
    with pytest.raises(RuntimeError, match="launch failed"):
        device.copy([((dst, 2 * MiB), (src, 2 * MiB), table)], 1)
    assert device.pending_work == 0 and device.move_counters() == (0, 0, 0)


def test_memory_info_stays_consistent_under_threads():
    device = SimulatedDevice(64 * MiB)
    stop = threading.Event()

    def churn():
        rng = random.Random(1)
        live = []
        while not stop.is_set():
            if live and rng.random() < 0.5:
                device.release(live.pop())
            else:
                try:
                    live.append(device.allocate(rng.choice((1, 3)) * MiB))
                except DeviceOutOfMemory:       # full: the walk turns back
                    device.release(live.pop())
        for address in live:
            device.release(address)

    thread, raised = run_in_thread(churn)
    for _ in range(2000):
        free, total = device.memory_info()
        assert total == 64 * MiB and 0 <= free <= total
    stop.set()
    thread.join(WAIT)
    assert raised == [] and device.memory_info() == (64 * MiB, 64 * MiB)


@pytest.mark.parametrize("call, error, match", [
    (lambda d: d.launch(42), TypeError, "work must be a callable"),
    (lambda d: d.complete(-1), ValueError, "count must be"),
    (lambda d: d.complete(1.5), TypeError, "count must be"),
    (lambda d: d.complete(True), TypeError, "count must be"),
    (lambda d: d.allocate(0), ValueError, "nbytes must be"),
    (lambda d: d.allocate(2.0), TypeError, "nbytes must be"),
    (lambda d: d.release(0x1234), ValueError, "0x1234 is not a live segment"),
    (lambda d: d.read(d.allocate(MiB), -1), ValueError, "nbytes must be"),
])
def test_bad_arguments_are_refused_with_a_clear_error(call, error, match):
    device = SimulatedDevice(4 * MiB)
    with pytest.raises(error, match=match):
        call(device)
    assert device.pending_work == 0


@pytest.mark.parametrize("device_id, error", [
    (-1, ValueError), ("0", TypeError), (1.0, TypeError), (None, TypeError), (True, TypeError)])
def test_a_bad_device_id_is_refused(device_id, error):
    """device_id is a GPU number: snapshots index by it (-1 raised IndexError there)."""
    with pytest.raises(error, match="device_id must be an int >= 0"):
        SimulatedDevice(4 * MiB, device_id=device_id)
    assert SimulatedDevice(4 * MiB, device_id=np.int64(3)).device_id == 3


def test_host_copies_are_queued_behind_earlier_work_and_host_memory_is_capped():
    from numba_alloc.policy.backend import HostOutOfMemory
    device = SimulatedDevice(1 << 24)
    device.host_capacity = 3000
    address = device.allocate(4096)
    device.write(address, (np.arange(4096) % 251).astype(np.uint8))
    buffer = device.host_allocate(2048)
    assert device.host_used == 2048
    with pytest.raises(HostOutOfMemory):
        device.host_allocate(1000)          # 2048 + 1000 > 3000
    device.launch(lambda: device.write(address, np.full(4096, 7, np.uint8)))   # earlier work
    device.copy_to_host(address, buffer, 2048)
    done = device.event()
    done.record()
    assert not done.query() and not buffer.any()          # behind the launched work
    device.complete(2)
    assert done.query() and (buffer == 7).all()
    buffer[:] = np.arange(2048) % 5
    device.copy_from_host(buffer, address + 1024, 2048)
    device.synchronize()
    assert (device.read(address + 1024, 2048) == np.arange(2048) % 5).all()
    assert (device.read(address, 1024) == 7).all()
    device.host_release(buffer)
    assert device.host_used == 0
    with pytest.raises(ValueError, match="not inside"):
        device.copy_to_host(address + 4096 - 8, device.host_allocate(64), 64)


def test_host_memory_the_host_cannot_give_is_refused_and_not_counted():
    from numba_alloc.policy.backend import HostOutOfMemory
    device = SimulatedDevice(1 << 24)
    buffer = device.host_allocate(4096)
    with pytest.raises(HostOutOfMemory, match="simulated host"):
        device.host_allocate(1 << 62)           # NumPy cannot allocate 4 EiB
    assert device.host_used == 4096
    device.host_release(buffer)
    assert device.host_used == 0


def test_an_out_of_memory_message_on_the_simulated_device_names_no_driver_code():
    """Issue 37, defect 14: the message began with
    ``[<CUresult.CUDA_ERROR_OUT_OF_MEMORY: 2>]``, a driver code the simulated
    device has none of; on a GPU it stays as Numba's CudaAPIError shows it."""
    from numba_alloc import OutOfMemoryError, Pool
    pool = Pool(SimulatedDevice(64 * MiB))
    with pytest.raises(OutOfMemoryError) as info:
        pool.malloc(100 * MiB)
    error = info.value
    assert str(error) == error.msg and not str(error).startswith("[")
    assert "CUresult" not in str(error) and "simulated device 0" in str(error)
    on_gpu = OutOfMemoryError.from_report(error.report._replace(device_name="cuda"))
    assert str(on_gpu) == f"[{on_gpu.code}] {on_gpu.msg}"


def test_unmapping_a_released_segments_data_counts_as_the_devices_work():
    """The host pages that held a segment's data are the simulated memory's:
    giving them back at release is counted in device_ns, as the copies that
    mapped them are; a segment that never held data has none to give."""
    device = SimulatedDevice(64 * MiB)
    untouched, written = device.allocate(4 * MiB), device.allocate(4 * MiB)
    device.write(written, np.ones(4 * MiB, np.uint8))
    before = device.device_ns
    device.release(untouched)
    assert device.device_ns == before
    device.release(written)
    assert device.device_ns > before


def test_a_device_of_sizes_only_counts_what_a_pool_does_as_one_that_holds_data():
    """holds_data=False: the same segments, copies queued in order and
    counted, out of memory at the same capacity; its memory cannot be
    read, and copies move nothing."""
    from numba_alloc import Pool
    sizes = [6 * MiB, 2 * MiB, 6 * MiB, 3 * MiB, 6 * MiB, 4 * MiB, 2 * MiB]

    def fragment_and_compact(device):
        pool = Pool(device, defrag=True, growth=False)
        blocks = [pool.malloc(n) for n in sizes]
        for block in blocks[::2]:
            pool.free(block)
        report = pool.defragment()
        return ([block.address for block in blocks[1::2]], tuple(report),
                device.move_counters(), device.memory_info(), pool.memory_stats())

    held, sizes_only = SimulatedDevice(32 * MiB), SimulatedDevice(32 * MiB, holds_data=False)
    assert fragment_and_compact(held) == fragment_and_compact(sizes_only)
    assert sizes_only.move_counters()[1] > 0 and not sizes_only._buffers
    sizes_only = SimulatedDevice(32 * MiB, holds_data=False)
    address = sizes_only.allocate(MiB)
    for call in (lambda: sizes_only.read(address, 8), lambda: sizes_only.view(address, 8),
                 lambda: sizes_only.write(address, b"12345678")):
        with pytest.raises(RuntimeError, match="holds_data=False"):
            call()
    buffer = sizes_only.host_allocate(64)
    sizes_only.launch(None)
    sizes_only.copy_to_host(address, buffer, 64)
    assert sizes_only.pending_work == 2            # queued behind the launch
    sizes_only.synchronize()
    assert sizes_only.pending_work == 0
    with pytest.raises(ValueError, match="not inside"):
        sizes_only.copy_from_host(buffer, address + MiB - 8, 64)
    with pytest.raises(TypeError, match="holds_data must be True or False"):
        SimulatedDevice(MiB, holds_data=0)
