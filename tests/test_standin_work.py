"""The driver stand-in's queue of GPU work (tests/standin/work.py): a piece
of work runs whole, as a kernel does on a GPU, even when the garbage
collector runs a finalizer that waits for the device meanwhile (numba-cuda's
deallocations call cuMemFree, which waits for everything)."""

import gc
import weakref

import pytest
from standin.work import LEGACY, PER_THREAD, Queue, WorkFailed


class _Cycle:
    """Cyclic garbage whose finalizer is ``on_collect`` (as a Numba device
    array dropped in a reference cycle: its memory freed when collected)."""

    def __init__(self, on_collect):
        self.me = self
        weakref.finalize(self, on_collect)


@pytest.fixture
def queue_and_errors():
    errors = []
    queue = Queue(lambda call, message: errors.append((call, message)))
    return queue, queue.stream(0, context=1), errors


def test_a_collection_while_work_runs_does_not_run_later_work_inside_it(queue_and_errors):
    queue, stream, errors = queue_and_errors
    order = []
    freed = []

    def free_after_waiting():       # cuMemFree: waits for the device, then frees
        queue.synchronize_all()
        freed.append(list(order))

    def first():
        kept = [[] for _ in range(1000)]    # allocations: the collector would run now
        order.append("first")
        return kept

    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        gc.set_threshold(100, 10, 10)
        _Cycle(free_after_waiting)          # young garbage, not collected yet
        queue.enqueue(stream, first, "first")
        last = queue.enqueue(stream, lambda: order.append("second"), "second")
        gc.enable()
        queue.finish(last)
        gc.collect()
    finally:
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()
    assert order == ["first", "second"]
    assert freed and freed[0][0] == "first"
    assert errors == []


def test_a_wait_from_inside_a_piece_of_work_is_refused_and_recorded(queue_and_errors):
    queue, stream, errors = queue_and_errors
    order = []
    refused = []

    def first():
        try:
            queue.synchronize_all()
        except WorkFailed as e:
            refused.append(e.args[0].label)
        order.append("first")

    queue.enqueue(stream, first, "first")
    last = queue.enqueue(stream, lambda: order.append("second"), "second")
    queue.finish(last)
    assert order == ["first", "second"]
    assert refused == ["first"]
    assert len(errors) == 1 and "from inside <work #1 first" in errors[0][1]


def _on_another_thread(action, *, finish_first=None):
    """Run ``action()`` on a new thread; with ``finish_first`` (a
    threading.Event), the thread stays alive until it is set. Returns the
    thread and what ``action`` returned (once it returned)."""
    import threading
    done, out = threading.Event(), []

    def body():
        out.append(action())
        done.set()
        if finish_first is not None:
            finish_first.wait()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    done.wait()
    return thread, out[0]


@pytest.mark.parametrize("alive", [True, False])
def test_the_legacy_stream_waits_for_every_threads_per_thread_stream(queue_and_errors, alive):
    """Each thread's CU_STREAM_PER_THREAD is a blocking stream of its own:
    an event recorded on the legacy default stream, and a synchronous call,
    come after the work another thread queued there (that thread still
    running, or gone), as CUDA's stream synchronization behavior says; the
    per-thread streams of two threads do not order with each other."""
    import threading
    queue, legacy, errors = queue_and_errors
    order = []
    release = threading.Event() if alive else None
    thread, work = _on_another_thread(
        lambda: queue.enqueue(queue.stream(PER_THREAD, context=1),
                              lambda: order.append("A's kernel"), "A's kernel"),
        finish_first=release)
    if not alive:
        thread.join()
    mine = queue.stream(PER_THREAD, context=1)
    assert mine.handle != work.stream
    assert work not in queue.enqueue(mine, lambda: order.append("mine"), "mine").deps
    event = queue.create_event(0, context=1)
    queue.record(queue.events[event], legacy)
    assert work in queue.events[event].recorded.deps
    queue.finish(queue.events[event].recorded)
    try:
        assert sorted(order) == ["A's kernel", "mine"] and work.done
        # a synchronous call (legacy semantics) after another thread's work
        late = _on_another_thread(
            lambda: queue.enqueue(queue.stream(PER_THREAD, context=1),
                                  lambda: order.append("B's kernel"), "B's kernel"))[1]
        queue.before_synchronous_call(legacy)
        assert late.done and order[2:] == ["B's kernel"]
    finally:
        if alive:
            release.set()
            thread.join()
    assert errors == []


def test_a_threads_per_thread_stream_is_one_per_context(queue_and_errors):
    queue, _, _ = queue_and_errors
    first, again = queue.stream(PER_THREAD, context=1), queue.stream(PER_THREAD, context=1)
    other = queue.stream(PER_THREAD, context=2)
    assert first is again and other is not first and other.handle != first.handle


def test_in_per_thread_mode_handle_0_is_the_calling_threads_per_thread_stream():
    """Queue(per_thread_default=True), a program run with
    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1: handle 0 is the calling
    thread's CU_STREAM_PER_THREAD, ordered after the legacy stream's earlier
    work (and the legacy stream's later work after it), not after another
    thread's; a synchronous call waits for its own thread's stream and the
    legacy stream's work only."""
    errors, order = [], []
    queue = Queue(lambda call, message: errors.append((call, message)), per_thread_default=True)
    legacy = queue.stream(LEGACY, context=1)
    mine = queue.stream(0, context=1)
    assert mine is queue.stream(PER_THREAD, context=1) and mine is not legacy
    first = queue.enqueue(legacy, lambda: order.append("legacy"), "legacy")
    _, theirs = _on_another_thread(
        lambda: (queue.stream(0, context=1),
                 queue.enqueue(queue.stream(0, context=1), lambda: order.append("A"), "A")))
    assert theirs[0] is not mine and theirs[1].deps == [first]
    own = queue.enqueue(mine, lambda: order.append("mine"), "mine")
    assert own.deps == [first]                       # not A's work
    queue.before_synchronous_call(mine)
    assert sorted(order) == ["legacy", "mine"] and not theirs[1].done
    later = queue.enqueue(legacy, lambda: order.append("legacy again"), "legacy again")
    queue.finish(later)
    assert order[2:] == ["A", "legacy again"] and errors == []


def test_each_context_has_its_own_legacy_stream_ordering_its_blocking_streams_only(
        queue_and_errors):
    """CUDA's legacy default stream "synchronizes with all other streams in
    the same CUcontext except for non-blocking streams": an event recorded
    on context 1's follows the work of context 1's streams and of every
    thread's per-thread stream in context 1, none of context 2's; context
    2's blocking streams do not follow it; a synchronous call in context 2
    runs context 2's work only."""
    queue, legacy, errors = queue_and_errors
    order = []

    def queued(stream, label):
        return queue.enqueue(stream, lambda: order.append(label), label)

    other_legacy = queue.stream(LEGACY, context=2)
    assert other_legacy is not legacy and queue.stream(0, context=2) is other_legacy
    mine = queue.streams[queue.create_stream(0, context=1)]
    theirs = queue.streams[queue.create_stream(0, context=2)]
    on_mine, on_theirs = queued(mine, "1's stream"), queued(theirs, "2's stream")
    _, (thread_1, thread_2) = _on_another_thread(
        lambda: (queued(queue.stream(PER_THREAD, context=1), "1's per-thread"),
                 queued(queue.stream(PER_THREAD, context=2), "2's per-thread")))
    event = queue.events[queue.create_event(0, context=1)]
    queue.record(event, legacy)
    assert sorted(event.recorded.deps, key=id) == sorted([on_mine, thread_1], key=id)
    later = queued(theirs, "2's stream again")
    assert later.deps == [on_theirs]                 # not context 1's legacy stream
    queue.finish(event.recorded)
    assert sorted(order) == ["1's per-thread", "1's stream"]
    queue.before_synchronous_call(other_legacy)
    assert sorted(order[2:]) == ["2's per-thread", "2's stream", "2's stream again"]
    assert on_theirs.context == 2 and thread_2.done and errors == []


def test_synchronizing_a_context_runs_its_work_and_no_other_contexts(queue_and_errors):
    """cuCtxSynchronize "Blocks until the current context has completed all
    preceding requested tasks": context 1's work runs (and what it waits
    for in context 2 through an event), context 2's other work stays
    queued; synchronize_all (the frees) runs everything."""
    queue, legacy, errors = queue_and_errors
    order = []
    theirs = queue.stream(LEGACY, context=2)
    first = queue.enqueue(theirs, lambda: order.append("2's first"), "2's first")
    event = queue.events[queue.create_event(0, context=2)]
    queue.record(event, theirs)
    queue.enqueue(theirs, lambda: order.append("2's second"), "2's second")
    queue.wait_event(legacy, event)
    queue.enqueue(legacy, lambda: order.append("1's"), "1's")
    queue.synchronize_context(1)
    assert order == ["2's first", "1's"] and first.done and len(queue.pending) == 1
    queue.synchronize_all()
    assert order[2:] == ["2's second"] and not queue.pending and errors == []


def test_the_binding_orders_each_contexts_work_apart():
    """Through the stand-in's driver calls, two devices: cuCtxSynchronize
    and a synchronous copy in device 0's context leave device 1's queued
    copy queued; an event of device 0's context recorded on a stream of
    device 1's is refused (CUDA: "event and stream must be on the same CUDA
    context"); device 0's reset leaves device 1's work queued and destroys
    device 0's events (a query is refused), device 1's cuCtxSynchronize
    runs device 1's work."""
    import numpy as np
    from standin import StandIn
    standin = StandIn(16 << 20, devices=2)
    b = standin.binding
    SUCCESS = b.CUresult.CUDA_SUCCESS

    def call(name, *args):
        status, *values = getattr(b, name)(*args)
        assert status == SUCCESS, (name, status)
        return values[0] if values else None

    ctx0, ctx1 = call("cuDevicePrimaryCtxRetain", 0), call("cuDevicePrimaryCtxRetain", 1)
    call("cuCtxPushCurrent", ctx1)
    on1 = call("cuMemAlloc", 4096)
    stream1 = call("cuStreamCreate", 0)
    call("cuMemsetD8Async", on1, 5, 4096, stream1)
    call("cuCtxPopCurrent")
    call("cuCtxPushCurrent", ctx0)
    on0 = call("cuMemAlloc", 4096)
    call("cuMemsetD8", on0, 7, 4096)
    call("cuCtxSynchronize")
    assert standin.pending == 1                     # device 1's memset
    host = np.zeros(4096, np.uint8)
    call("cuMemcpyDtoH", host.ctypes.data, on0, 4096)
    assert (host == 7).all() and standin.pending == 1
    event0 = call("cuEventCreate", 0)
    status, = b.cuEventRecord(event0, stream1)
    assert status == b.CUresult.CUDA_ERROR_INVALID_HANDLE
    assert [c for c, _ in standin.errors] == ["cuEventRecord"]
    call("cuCtxPopCurrent")
    call("cuDevicePrimaryCtxReset", 0)
    assert standin.pending == 1
    status, = b.cuEventQuery(event0)
    assert status == b.CUresult.CUDA_ERROR_INVALID_HANDLE
    call("cuCtxPushCurrent", ctx1)
    call("cuCtxSynchronize")
    assert standin.pending == 0
    call("cuMemcpyDtoH", host.ctypes.data, on1, 4096)
    assert (host == 5).all()
    assert [c for c, _ in standin.errors] == ["cuEventRecord", "cuEventQuery"]
