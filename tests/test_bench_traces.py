"""benchmarks/bench_traces.py: the peak live bytes of a trace and the
bisection for the smallest device, on small traces."""

import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_traces as bench  # noqa: E402
from numba_alloc.observe.trace import (ALLOCATE, BUNDLED_TRACE, DEALLOCATE,  # noqa: E402
                                       TraceEvent, write_rmm_log)

MiB = bench.MiB


def event(action, pointer, size):
    return TraceEvent(1, 0.0, action, pointer, size, 0)


def test_peak_live_counts_requested_bytes_and_a_reused_address_once():
    events = [event(ALLOCATE, 0x10, 300), event(ALLOCATE, 0x20, 500),
              event(DEALLOCATE, 0x10, 300), event(DEALLOCATE, 0x99, 7),    # unknown free
              event(ALLOCATE, 0x20, 200),                                 # its free was lost
              event(ALLOCATE, 0x30, 450)]
    assert bench.peak_live(events) == 800


def test_the_smallest_device_fits_and_one_mib_less_does_not(tmp_path):
    events = bench.load(str(BUNDLED_TRACE))
    peak = bench.peak_live(events)
    device = bench.smallest_device(events, "no defrag", peak - 1, 2 * peak)
    assert device is not None and device >= peak
    assert bench.fits(events, "no defrag", device)
    assert not bench.fits(events, "no defrag", device - MiB)
    # a gzip-compressed log reads as the plain one
    path = tmp_path / "trace.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        write_rmm_log(events, f)
    assert bench.load(str(path)) == events


def test_a_device_too_small_at_the_top_of_the_range_is_none():
    events = [event(ALLOCATE, 0x10, 64 * MiB)]
    assert bench.smallest_device(events, "defrag", MiB, 32 * MiB) is None


def test_the_cost_columns_count_device_calls_and_events_recorded():
    """Four mallocs of 6 MiB, each freed before the next: with reuse first
    each malloc after the first reuses the freed bytes, closing a batch of
    one free (an event) each time; PyTorch's policy carves the segment's
    rest instead and records an event only when the rest runs out."""
    events = []
    for i in range(4):
        events += [event(ALLOCATE, 0x10 + i, 6 * MiB), event(DEALLOCATE, 0x10 + i, 6 * MiB)]
    calls, mallocs = bench.device_calls(events, 64 * MiB)
    assert mallocs == 4
    assert calls["no defrag"][1] > calls["PyTorch's"][1]
    assert calls["no defrag"][0] == calls["PyTorch's"][0] == 1     # one segment, never freed
