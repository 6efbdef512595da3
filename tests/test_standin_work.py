"""The driver stand-in's queue of GPU work (tests/standin/work.py): a piece
of work runs whole, as a kernel does on a GPU, even when the garbage
collector runs a finalizer that waits for the device meanwhile (numba-cuda's
deallocations call cuMemFree, which waits for everything)."""

import gc
import weakref

import pytest
from standin.work import Queue, WorkFailed


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
