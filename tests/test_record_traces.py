"""benchmarks/record_torch_trace.py's recording functions, which
record_corpus.py records the corpus with: a recording starts as a GPU run
does, with the parameters and buffers copied to fresh storage in
``model.to("cuda")``'s order, and keeps no free of what was allocated
before it."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import record_torch_trace as recorder  # noqa: E402
from numba_alloc.observe.trace import ALLOCATE, DEALLOCATE, TraceEvent  # noqa: E402


def event(action, pointer, size):
    return TraceEvent(1, 0.0, action, pointer, size, 0)


def test_frees_of_storages_allocated_before_the_recording_are_left_out():
    events = [event(DEALLOCATE, 0x10, 8), event(ALLOCATE, 0x10, 16), event(DEALLOCATE, 0x20, 4),
              event(DEALLOCATE, 0x10, 16), event(DEALLOCATE, 0x10, 16)]
    assert recorder.recorded_only(events) == [events[1], events[3]]


def test_a_recording_begins_with_each_parameter_and_buffer_copied_once_in_to_cudas_order():
    """Module._apply's order: children first, each one's parameters then
    its buffers; the decoder's weight is the embedding's (tied), copied
    once."""
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10),
                                torch.nn.BatchNorm1d(10))
    model[1].weight = model[0].weight

    def run():
        recorder.to_fresh_storage(model)
        model(torch.tensor([1, 2, 3])).sum().backward()

    events = recorder.recorded_only(recorder.profiled_events(run))
    tensors = [model[0].weight, model[1].bias, model[2].weight, model[2].bias,
               model[2].running_mean, model[2].running_var, model[2].num_batches_tracked]
    assert [(e.action, e.size) for e in events[:7]] == [
        (ALLOCATE, 160), (ALLOCATE, 40), (ALLOCATE, 40), (ALLOCATE, 40), (ALLOCATE, 40),
        (ALLOCATE, 40), (ALLOCATE, 8)]
    assert [e.pointer for e in events[:7]] == [t.data_ptr() for t in tensors]
    assert len(events) > 7             # then the step's own
