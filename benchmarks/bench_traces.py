"""Fragmentation on real traces: the smallest device each policy needs,
beside what the best non-moving policy could need.

The traces, in four groups printed apart: ``kept``, those of
benchmarks/traces/ (RMM CSV logs, gzip-compressed) and the bundled
training-loop trace; ``tuning`` and ``held-out``, the corpus's two halves
(benchmarks/traces/tuning/ and held-out/, recorded by
benchmarks/record_corpus.py; benchmarks/traces/README.md says how the
corpus was split); ``unseen``, model families the corpus has none of,
recorded after the policy was settled (benchmarks/traces/unseen/, by
benchmarks/record_corpus.py --unseen). Replay each (numba-alloc replay's ``replay_trace``) on
simulated devices of sizes only (``holds_data=False``: no byte is stored
or copied, and the figures are sizes and counts) and find the smallest device on which no request fails
(:func:`smallest_device`: bisection, then every MiB just above the answer
and a ladder of larger devices, searching again above any that fails),
under three policies:

* ``defrag``: numba_alloc with defragmentation on;
* ``no defrag``: numba_alloc's defaults;
* ``PyTorch's``: the policy of PyTorch's caching allocator, which is
  numba_alloc with defragmentation off, ``keep_whole_segments`` and
  ``separate_big_segments`` off (any free block that fits serves), a batch of pending frees that never
  closes early (frees become reusable only when the pool needs memory,
  also when a large request would split a free block) and 20 MiB segments
  for requests of 1 to 10 MiB (not fitted to the request's size); unlike
  PyTorch, it still serves a small request from a large free block when
  the small pool can neither serve nor grow.

Beside them, the headroom (benchmarks/headroom.py): ``bound``, the most
bytes the live blocks hold at once rounded up to 512 B each, which no
non-moving policy can go below, and ``placed``, an arrangement of the whole
trace a clairvoyant offline planner builds (no block moved), which the
best non-moving policy does not exceed.

Each is a ratio of the trace's peak live bytes (the most bytes its
allocations held at once, as requested), beside issue 26's goals (at most
1.03x with defrag, 1.15x without); a ratio marked ``*`` passed over a
larger device that failed (the search says which). Then, with ample memory
(a device of AMPLE times the peak live bytes): the most each policy
reserved (issue 40's goal: never more than PyTorch's policy), and what the
policies cost: the device allocations and frees (cuMemAlloc/cuMemFree on a
GPU; keeping whole segments and fitted segments add some) and the events
recorded (cuEventRecord: one a batch of pending frees; reusing freed
blocks first closes more batches). The replay queues no GPU work, so
every free's work has completed by the next request. With ``--batches``,
the smallest devices with the batch of pending frees closing at each
number of frees given (``never``: only when the pool needs memory, or
before a large request splits a free block), with defrag and without.

    python benchmarks/bench_traces.py [--out DIR] [--group kept,tuning,held-out,unseen]
                                      [--batches 1,8,64,never] [--expandable] [TRACE...]

``--expandable``: numba_alloc's two policies with ``expandable_segments``
on (segments of 2 MiB pages mapped under one reserved range; PyTorch's
policy is as above).
"""

import argparse
import glob
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_malloc import host_line  # noqa: E402
from headroom import offline_placement, rounded_peak  # noqa: E402
from numba_alloc import Pool, SimulatedDevice  # noqa: E402
from numba_alloc.backends.simulated import SimulatedEvent  # noqa: E402
from numba_alloc.cli.replay import replay_trace  # noqa: E402
from numba_alloc.observe.trace import ALLOCATE, BUNDLED_TRACE, DEALLOCATE, read_rmm_log  # noqa: E402
from numba_alloc.policy import core  # noqa: E402

MiB = 1 << 20
GOALS = {"defrag": 1.03, "no defrag": 1.15}
AMPLE = 8           # ample memory: a device of this many times the peak live bytes
TRACES = os.path.join(HERE, "traces")
GROUPS = {          # group -> its traces
    "kept": lambda: sorted(glob.glob(os.path.join(TRACES, "*.csv.gz"))) + [str(BUNDLED_TRACE)],
    "tuning": lambda: sorted(glob.glob(os.path.join(TRACES, "tuning", "*.csv.gz"))),
    "held-out": lambda: sorted(glob.glob(os.path.join(TRACES, "held-out", "*.csv.gz"))),
    "unseen": lambda: sorted(glob.glob(os.path.join(TRACES, "unseen", "*.csv.gz"))),
}


def load(path):
    """The events of the RMM CSV log at ``path`` (gzip-compressed or not)."""
    return read_rmm_log(path)


def peak_live(events):
    """The most bytes the trace's allocations held at once, as requested."""
    sizes, live, peak = {}, 0, 0
    for e in events:
        if e.action == ALLOCATE:
            live += e.size - sizes.pop(e.pointer, 0)
            sizes[e.pointer] = e.size
            peak = max(peak, live)
        else:
            live -= sizes.pop(e.pointer, 0)
    return peak


NEVER = 1 << 62        # a batch of pending frees this long never closes early


def with_batch(pool, frees):
    """``pool`` with its batch of pending frees closing at ``frees`` frees
    (the core's H_BATCH; NEVER: when the pool needs memory)."""
    pool._core.mv[core.H_BATCH] = frees
    return pool


def as_pytorch(pool):
    """``pool`` under PyTorch's reuse and segment rules: freed blocks
    become reusable only when the pool needs memory (as PyTorch's caching
    allocator reuses them once their stream's events have completed), not
    before a large request splits a free block (H_REUSE_FIRST off), and a
    request of 1 to 10 MiB reserves 20 MiB (H_FIT_SEGMENTS off)."""
    pool._reuse_first = False       # the core's H_REUSE_FIRST follows it
    with_batch(pool, NEVER)._core.mv[core.H_FIT_SEGMENTS] = 0
    return pool


POLICIES = {
    "defrag": lambda device: Pool(device, defrag=True),
    "no defrag": lambda device: Pool(device),
    "PyTorch's": lambda device: as_pytorch(Pool(device, keep_whole_segments=False,
                                                separate_big_segments=False,
                                                expandable_segments=False)),
}
# --expandable: numba_alloc's with expandable_segments on (PyTorch's stays as it is)
EXPANDABLE = {
    "defrag": lambda device: Pool(device, defrag=True, expandable_segments=True),
    "no defrag": lambda device: Pool(device, expandable_segments=True),
}


def batch_policies(batches):
    """Policies with and without defrag for each batch size in ``batches``."""
    return {f"{'defrag' if defrag else 'no defrag'}, batch {'never' if b == NEVER else b}":
            (lambda device, b=b, defrag=defrag: with_batch(Pool(device, defrag=defrag), b))
            for b in batches for defrag in (True, False)}


def first_failure(events, pool):
    """(index of the first event whose request ``pool`` cannot meet, its
    OutOfMemoryError, live bytes requested then, (defragmentations, bytes
    moved) before that request), replaying ``events`` as replay_trace
    does (a reused address frees the old block first; unknown frees and
    recorded failures are skipped) up to there; None when none fails."""
    from numba_alloc.observe.out_of_memory import OutOfMemoryError
    live, live_bytes = {}, 0
    for index, e in enumerate(events):
        if e.action == ALLOCATE:
            if e.pointer in live:
                old = live.pop(e.pointer)
                live_bytes -= old.size
                pool.free(old)
            moved = (pool.stats.num_defragmentations, pool.stats.bytes_defragged)
            try:
                live[e.pointer] = pool.malloc(e.size)
            except OutOfMemoryError as error:
                return index, error, live_bytes, moved
            live_bytes += e.size
        elif e.action == DEALLOCATE and e.pointer in live:
            block = live.pop(e.pointer)
            live_bytes -= block.size
            pool.free(block)
    return None


def fits(events, policy, capacity):
    """Whether ``events`` replay under ``policy`` on a device of
    ``capacity`` bytes with no failed request."""
    pool = POLICIES[policy](SimulatedDevice(capacity, holds_data=False))
    return first_failure(events, pool) is None


def smallest_device(fits_at, low, high, window, step, reach):
    """(C, failed): C the smallest capacity (a multiple of 1 MiB) in (low,
    high] that bisection (to 1 MiB) finds with ``fits_at(C)`` true, and
    ``fits_at`` also true at every MiB from C to C + ``window`` bytes, at
    every ``step`` bytes from there to C + ``reach`` and at ``high``; None
    when ``high`` fails. ``failed``: the capacities above an earlier
    bisection's answer found failing (a bigger device failing where a
    smaller one fitted), each followed by a bisection above it. Costs
    about log2((high - low) / MiB) + window / MiB + reach / step calls of
    ``fits_at``, more per failure found; each capacity is tried once."""
    tried = {}

    def fits_mib(mib):
        if mib not in tried:
            tried[mib] = fits_at(mib * MiB)
        return tried[mib]

    low, top = low // MiB, -(-high // MiB)
    if not fits_mib(top):
        return None, []
    failed, high = [], top
    while True:
        while high - low > 1:       # low fails (or is the range's end), high fits
            mid = (low + high) // 2
            if fits_mib(mid):
                high = mid
            else:
                low = mid
        near = min(top, high + -(-window // MiB))
        checks = [*range(high + 1, near + 1),
                  *range(near + max(1, step // MiB), min(top, high + reach // MiB + 1),
                         max(1, step // MiB))]
        failure = next((mib for mib in checks if not fits_mib(mib)), None)
        if failure is None:
            return high * MiB, failed
        failed.append(failure * MiB)
        low, high = failure, top


def smallest_ratio(events, policy, peak):
    """(smallest device / ``peak``, the devices found failing above an
    earlier answer) for ``policy``: searched in (peak, 4 peak + 64 MiB],
    the answer checked at every MiB up to 1% of ``peak`` above it (at
    least 8 MiB), then every 1% up to 20% above it."""
    device, failed = smallest_device(lambda capacity: fits(events, policy, capacity), peak - 1,
                                     4 * peak + 64 * MiB, max(8 * MiB, peak // 100),
                                     max(MiB, peak // 100), peak // 5)
    return (None if device is None else device / peak), failed


class CountingDevice(SimulatedDevice):
    """A simulated device that counts the events the pool records (a
    GPU's cuEventRecord: one per batch of pending frees)."""

    def __init__(self, capacity, holds_data=True):
        super().__init__(capacity, holds_data=holds_data)
        self.events_recorded = 0

    def event(self):
        return _CountedEvent(self)


class _CountedEvent(SimulatedEvent):
    __slots__ = ()

    def record(self):
        self._device.events_recorded += 1
        super().record()


def ample_memory(events, capacity):
    """({policy: (most bytes reserved, device allocations + frees, events
    recorded)}, the trace's mallocs) replaying ``events`` on a device of
    ``capacity`` bytes."""
    figures = {}
    for name, policy in POLICIES.items():
        device = CountingDevice(capacity, holds_data=False)
        pool = policy(device)
        report = replay_trace(events, pool)
        figures[name] = (report.peak_reserved,
                         pool.stats.num_device_alloc + pool.stats.num_device_free,
                         device.events_recorded)
    return figures, report.allocations


def measure(path):
    """The figures of one trace, as traces.json holds them."""
    events = load(path)
    peak = peak_live(events)
    ratios, failed = {}, {}
    for name in POLICIES:
        ratios[name], failed[name] = smallest_ratio(events, name, peak)
    bound, (placed, _) = rounded_peak(events), offline_placement(events)
    figures, mallocs = ample_memory(events, AMPLE * peak)
    return {"events": len(events), "allocations": mallocs, "peak_live": peak, "ratios": ratios,
            "failed_above": {k: v for k, v in failed.items() if v},
            "bound": bound / peak, "placed": placed / peak,
            "reserved_ample": {k: r / peak for k, (r, _, _) in figures.items()},
            "device_calls_ample": {k: c for k, (_, c, _) in figures.items()},
            "events_recorded_ample": {k: e for k, (_, _, e) in figures.items()}}


def ratio(r, width):
    return f"{'>4x':>{width}}" if r is None else f"{r:>{width - 1}.3f}x"


def print_group(group, traces, width):
    """Print one group's tables and its goals; returns whether every goal
    is met."""
    names = list(POLICIES)
    print(f"== {group}: smallest simulated device with no failed request, as a ratio of the "
          "trace's peak live bytes; bound and placed: the best non-moving policy lies between")
    print(f"{'trace':<28} {'events':>8} {'peak live':>10}  " +
          "  ".join(f"{name:>{width}}" for name in names + ["bound", "placed"]))
    for name, t in traces.items():
        print(f"{name:<28} {t['events']:>8,} {t['peak_live'] / MiB:>8.1f} M  " + "  ".join(
            ratio(t["ratios"][p], width - 1) + ("*" if p in t["failed_above"] else " ")
            for p in names) + "  " + "  ".join(ratio(t[k], width) for k in ("bound", "placed")))
    for name, t in traces.items():
        for p, failed in t["failed_above"].items():
            print(f"  * {name}, {p}: failed on larger devices too: " +
                  ", ".join(f"{f / t['peak_live']:.3f}x" for f in failed))
    print(f"Most reserved with ample memory ({AMPLE}x peak live), as a ratio of peak live; "
          "device allocations + frees / events recorded")
    print(f"{'trace':<28} {'mallocs':>8}  " + "  ".join(f"{name:>{width}}" for name in names) +
          "  " + "  ".join(f"{name:>{width}}" for name in names))
    for name, t in traces.items():
        pairs = [f"{t['device_calls_ample'][p]} / {t['events_recorded_ample'][p]}" for p in names]
        print(f"{name:<28} {t['allocations']:>8,}  " + "  ".join(
            ratio(t["reserved_ample"][p], width) for p in names) + "  " + "  ".join(
            f"{pair:>{width}}" for pair in pairs))
    met = {f"{name} at most {goal}x": all(t["ratios"][name] is not None
                                          and t["ratios"][name] <= goal for t in traces.values())
           for name, goal in GOALS.items()}
    met["reserved with ample memory at most PyTorch's"] = all(
        t["reserved_ample"][p] <= t["reserved_ample"]["PyTorch's"]
        for t in traces.values() for p in GOALS)
    print(f"Goals (issues 26 and 40), {group}, on every trace: " + ", ".join(
        f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in met.items()))
    return all(met.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="traces to replay instead of the groups'")
    parser.add_argument("--out")
    parser.add_argument("--group", default=",".join(GROUPS),
                        help=f"groups of traces, comma-separated (default: {','.join(GROUPS)})")
    parser.add_argument("--batches", help="frees a batch closes at, comma-separated "
                        "(whole numbers >= 1, or never)")
    parser.add_argument("--expandable", action="store_true",
                        help="numba_alloc's policies with expandable_segments on")
    args = parser.parse_args()
    if args.expandable:
        POLICIES.update(EXPANDABLE)
    if args.batches:
        try:
            batches = [NEVER if b == "never" else int(b) for b in args.batches.split(",")]
        except ValueError:
            batches = [0]
        if min(batches) < 1:
            parser.error(f"--batches takes whole numbers >= 1 or never, got {args.batches!r}")
        POLICIES.clear()
        POLICIES.update(batch_policies(batches))
    groups = args.group.split(",")
    if any(g not in GROUPS for g in groups):
        parser.error(f"--group takes {', '.join(GROUPS)}, comma-separated; got {args.group!r}")
    paths = {"given": args.traces} if args.traces else {g: GROUPS[g]() for g in groups}
    result = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
              "machine": platform.machine(), "host": host_line(), "groups": {},
              "expandable_segments": args.expandable}
    print(result["host"])
    if args.batches:
        return _batches(paths, result, args.out)
    width = max(10, *map(len, POLICIES))
    for group, group_paths in paths.items():
        traces = result["groups"][group] = {}
        for path in group_paths:
            start = time.perf_counter()
            traces[os.path.basename(path)] = measure(path)
            print(f"  ({os.path.basename(path)} measured in {time.perf_counter() - start:.0f} s)",
                  file=sys.stderr, flush=True)
        print_group(group, traces, width)
    _save(result, args.out, "traces.json")


def _batches(paths, result, out):
    """--batches: the smallest device of each batch policy, per group."""
    width = max(10, *map(len, POLICIES))
    for group, group_paths in paths.items():
        print(f"== {group}: smallest simulated device with no failed request, as a ratio of "
              "the trace's peak live bytes")
        print(f"{'trace':<28} {'peak live':>10}  " + "  ".join(f"{n:>{width}}" for n in POLICIES))
        rows = result["groups"][group] = {}
        for path in group_paths:
            events = load(path)
            peak = peak_live(events)
            row = rows[os.path.basename(path)] = {
                name: smallest_ratio(events, name, peak)[0] for name in POLICIES}
            print(f"{os.path.basename(path):<28} {peak / MiB:>8.1f} M  " + "  ".join(
                ratio(r, width) for r in row.values()))
    _save(result, out, "batches.json")


def _save(result, out, name):
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
