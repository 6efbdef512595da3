"""benchmarks/bench_traces.py and headroom.py: the peak live bytes of a
trace, the search for the smallest device (also where a bigger device
fails), and the headroom's bound and offline arrangement, on small
traces."""

import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_traces as bench  # noqa: E402
import headroom  # noqa: E402
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
    device, failed = bench.smallest_device(lambda c: bench.fits(events, "no defrag", c),
                                           peak - 1, 2 * peak, 16 * MiB, 64 * MiB, peak)
    assert device is not None and device >= peak
    assert bench.fits(events, "no defrag", device)
    # a bigger device than an earlier answer that failed is reported, and searched above
    assert all(peak <= c < device and not bench.fits(events, "no defrag", c) for c in failed)
    assert not bench.fits(events, "no defrag", device - MiB)
    # fits stops at the first failure, as replay_trace counts them
    for capacity, failures in ((device, 0), (device - MiB, 1)):
        report = bench.replay_trace(events, bench.Pool(bench.SimulatedDevice(capacity)))
        assert min(report.failed_requests, 1) == failures
    # a gzip-compressed log reads as the plain one
    path = tmp_path / "trace.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        write_rmm_log(events, f)
    assert bench.load(str(path)) == events


def test_a_device_too_small_at_the_top_of_the_range_is_none():
    events = [event(ALLOCATE, 0x10, 64 * MiB)]
    assert bench.smallest_device(lambda c: bench.fits(events, "defrag", c),
                                 MiB, 32 * MiB, MiB, MiB, MiB) == (None, [])


def searched(fitting, low=0, high=400, window=8, step=20, reach=200):
    """smallest_device over ``fitting(mib)``, in MiB: (answer, failures
    found above an earlier answer, capacities tried)."""
    tried = []

    def fits_at(capacity):
        tried.append(capacity // MiB)
        return fitting(capacity // MiB)
    device, failed = bench.smallest_device(fits_at, low * MiB, high * MiB, window * MiB,
                                           step * MiB, reach * MiB)
    return device // MiB, [f // MiB for f in failed], tried


def test_the_search_is_bisection_when_bigger_devices_always_fit():
    device, failed, tried = searched(lambda mib: mib >= 137)
    assert (device, failed) == (137, [])
    assert len(tried) == len(set(tried)) <= 9 + 8 + 200 // 20 + 1


def test_a_bigger_device_failing_just_above_the_answer_moves_it_up():
    """Fits from 100 MiB, but not at 103-105: plain bisection over (0,
    400] tries 200, 100, 50, ... and answers 100; every MiB of the window
    above it is tried, 103 fails, and the search goes on above it."""
    device, failed, _ = searched(lambda mib: mib >= 100 and not 103 <= mib <= 105)
    assert (device, failed) == (106, [103])


def test_a_bigger_device_failing_far_above_the_answer_is_found_by_the_ladder():
    """Fits from 120 MiB but not at 230-259, beyond the window: bisection
    answers 120, the window (121-128) fits, the ladder of 20 MiB steps from
    148 fails at 248, and a bisection above it answers 260."""
    device, failed, _ = searched(lambda mib: mib >= 120 and not 230 <= mib < 260)
    assert (device, failed) == (260, [248])


def test_a_failure_beyond_the_reach_is_not_looked_for():
    """The contract's limit: above C + reach only ``high`` is tried."""
    device, failed, tried = searched(lambda mib: mib >= 120 and not 350 <= mib < 360)
    assert (device, failed) == (120, []) and max(t for t in tried if t < 400) <= 320


def test_the_bound_is_the_peak_of_live_blocks_rounded_to_512_bytes():
    events = [event(ALLOCATE, 0x10, 1), event(ALLOCATE, 0x20, 513),     # 512 + 1024
              event(DEALLOCATE, 0x10, 1), event(ALLOCATE, 0x30, 2000),  # 1024 + 2048
              event(DEALLOCATE, 0x99, 5),                               # unknown: skipped
              event(ALLOCATE, 0x20, 100)]              # its free was lost: 512 + 2048
    assert headroom.rounded_peak(events) == 3072
    assert bench.peak_live(events) == 2513


def arranged_without_overlap(events):
    """The offline arrangement's size, after checking that no two blocks
    whose lifetimes overlap share a byte."""
    top, offsets = headroom.offline_placement(events)
    starts, ends, sizes = headroom.lifetimes(events)
    for i in range(len(sizes)):
        for j in range(i):
            if starts[i] < ends[j] and starts[j] < ends[i]:
                assert (offsets[i] + sizes[i] <= offsets[j] or
                        offsets[j] + sizes[j] <= offsets[i]), (i, j)
    assert top == max(offsets + sizes)
    return top


def test_the_offline_arrangement_never_overlaps_and_lies_above_the_bound():
    events = bench.load(str(BUNDLED_TRACE))[:700]
    top = arranged_without_overlap(events)
    assert headroom.rounded_peak(events) <= top <= 1.1 * headroom.rounded_peak(events)


def test_the_offline_arrangement_reaches_the_bound_where_an_online_one_cannot():
    """A, B and C of 1 KiB; A and C long-lived, B freed early; then D of
    2 KiB. In request order a first fit puts A, B, C end to end and D above
    them (5 KiB: D does not fit B's hole); knowing B dies, the offline planner puts
    A and C side by side and B and D above them: 4 KiB, the bound."""
    K = 1024
    events = [event(ALLOCATE, 0xA, K), event(ALLOCATE, 0xB, K), event(ALLOCATE, 0xC, K),
              event(DEALLOCATE, 0xB, K), event(ALLOCATE, 0xD, 2 * K)]
    assert arranged_without_overlap(events) == headroom.rounded_peak(events) == 4 * K


def test_the_cost_columns_count_device_calls_and_events_recorded():
    """Four mallocs of 6 MiB, each freed before the next: with reuse first
    each malloc after the first reuses the freed bytes, closing a batch of
    one free (an event) each time; PyTorch's policy carves the segment's
    rest instead and records an event only when the rest runs out. The
    most reserved: one fitted segment of three 6 MiB blocks, 18 MiB;
    PyTorch's policy, 20 MiB. (On a 48 MiB device, where 18 MiB reserved
    is scarce memory: reuse first is in force.)"""
    events = []
    for i in range(4):
        events += [event(ALLOCATE, 0x10 + i, 6 * MiB), event(DEALLOCATE, 0x10 + i, 6 * MiB)]
    figures, mallocs = bench.ample_memory(events, 48 * MiB)
    assert mallocs == 4
    assert figures["no defrag"][2] > figures["PyTorch's"][2]
    assert figures["no defrag"][1] == figures["PyTorch's"][1] == 1     # one segment, never freed
    assert figures["no defrag"][0] == 18 * MiB and figures["PyTorch's"][0] == 20 * MiB
