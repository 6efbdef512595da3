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
