"""Fragmentation on real traces: the smallest device each policy needs.

For every trace under benchmarks/traces/ (RMM CSV logs, gzip-compressed;
benchmarks/record_torch_trace.py records PyTorch training runs) and the
bundled training-loop trace, replay it (numba-alloc replay's
``replay_trace``) on simulated devices and find, by bisection to 1 MiB, the
smallest device on which no request fails, under three policies:

* ``defrag``: numba_alloc with defragmentation on;
* ``no defrag``: numba_alloc's defaults;
* ``PyTorch's``: the policy of PyTorch's caching allocator, which is
  numba_alloc with defragmentation off, ``keep_whole_segments`` off (any
  free block that fits serves), a batch of pending frees that never
  closes early (frees become reusable only when the pool needs memory,
  also when a large request would split a free block) and 20 MiB segments
  for requests of 1 to 10 MiB (not fitted to the request's size); unlike
  PyTorch, it still serves a small request from a large free block when
  the small pool can neither serve nor grow.

What the policies cost is printed too: the device allocations and frees
(cuMemAlloc/cuMemFree on a GPU; keeping whole segments and fitted
segments add some) and the events recorded (cuEventRecord: one a batch
of pending frees; reusing freed blocks first closes more batches) each
policy makes replaying the trace on a device of twice its peak live bytes.

Each is printed as a ratio of the trace's peak live bytes (the most bytes
its allocations held at once, as requested), beside issue 26's goals (at
most 1.03x with defrag, 1.15x without). The replay queues no GPU work, so
every free's work has completed by the next request. With ``--batches``,
the same with the batch of pending frees closing at each number of frees
given (``never``: only when the pool needs memory, or before a large
request splits a free block), with defrag and without: whether the batch
still trades one mode against the other (before the pool reused freed
blocks ahead of splitting, it did).

    python benchmarks/bench_traces.py [--out DIR] [--batches 1,8,64,never] [TRACE...]
"""

import argparse
import glob
import gzip
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_malloc import host_line  # noqa: E402
from numba_alloc import Pool, SimulatedDevice  # noqa: E402
from numba_alloc.backends.simulated import SimulatedEvent  # noqa: E402
from numba_alloc.cli.replay import replay_trace  # noqa: E402
from numba_alloc.observe.trace import ALLOCATE, BUNDLED_TRACE, read_rmm_log  # noqa: E402
from numba_alloc.policy import core  # noqa: E402

MiB = 1 << 20
GOALS = {"defrag": 1.03, "no defrag": 1.15}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return read_rmm_log(f)


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
    mv = with_batch(pool, NEVER)._core.mv
    mv[core.H_REUSE_FIRST] = mv[core.H_FIT_SEGMENTS] = 0
    return pool


POLICIES = {
    "defrag": lambda device: Pool(device, defrag=True),
    "no defrag": lambda device: Pool(device),
    "PyTorch's": lambda device: as_pytorch(Pool(device, keep_whole_segments=False)),
}


def batch_policies(batches):
    """Policies with and without defrag for each batch size in ``batches``."""
    return {f"{'defrag' if defrag else 'no defrag'}, batch {'never' if b == NEVER else b}":
            (lambda device, b=b, defrag=defrag: with_batch(Pool(device, defrag=defrag), b))
            for b in batches for defrag in (True, False)}


def fits(events, policy, capacity):
    report = replay_trace(events, POLICIES[policy](SimulatedDevice(capacity)))
    return report.failed_requests == 0


def smallest_device(events, policy, low, high):
    """The smallest capacity (a multiple of 1 MiB) in (low, high] on which
    the trace replays without a failed request; None when ``high`` fails."""
    low, high = low // MiB, -(-high // MiB)
    if not fits(events, policy, high * MiB):
        return None
    while high - low > 1:
        mid = (low + high) // 2
        if fits(events, policy, mid * MiB):
            high = mid
        else:
            low = mid
    return high * MiB


class CountingDevice(SimulatedDevice):
    """A simulated device that counts the events the pool records (a
    GPU's cuEventRecord: one per batch of pending frees)."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.events_recorded = 0

    def event(self):
        return _CountedEvent(self)


class _CountedEvent(SimulatedEvent):
    __slots__ = ()

    def record(self):
        self._device.events_recorded += 1
        super().record()


def device_calls(events, capacity):
    """({policy: (device allocations + frees, events recorded)}, the
    trace's mallocs) replaying ``events`` on a device of ``capacity``
    bytes."""
    calls = {}
    for name, policy in POLICIES.items():
        device = CountingDevice(capacity)
        pool = policy(device)
        mallocs = replay_trace(events, pool).allocations
        calls[name] = (pool.stats.num_device_alloc + pool.stats.num_device_free,
                       device.events_recorded)
    return calls, mallocs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--out")
    parser.add_argument("--batches", help="frees a batch closes at, comma-separated "
                        "(whole numbers >= 1, or never)")
    args = parser.parse_args()
    if args.batches:
        try:
            batches = [NEVER if b == "never" else int(b) for b in args.batches.split(",")]
        except ValueError:
            batches = [0]
        if min(batches) < 1:
            parser.error(f"--batches takes whole numbers >= 1 or never, got {args.batches!r}")
        POLICIES.clear()
        POLICIES.update(batch_policies(batches))
    paths = args.traces or sorted(glob.glob(os.path.join(HERE, "traces", "*.csv.gz"))) + [
        str(BUNDLED_TRACE)]
    result = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
              "machine": platform.machine(), "host": host_line(), "traces": {}}
    print(result["host"])
    print("Smallest simulated device with no failed request, as a ratio of the "
          "trace's peak live bytes (bisection to 1 MiB)")
    width = max(10, *map(len, POLICIES))
    print(f"{'trace':<28} {'events':>8} {'peak live':>10}  " +
          "  ".join(f"{name:>{width}}" for name in POLICIES))
    for path in paths:
        events = load(path)
        peak = peak_live(events)
        row = {}
        for name in POLICIES:
            device = smallest_device(events, name, peak - 1, 4 * peak + 64 * MiB)
            row[name] = None if device is None else device / peak
        name = os.path.basename(path)
        calls, mallocs = device_calls(events, 2 * peak)
        result["traces"][name] = {"events": len(events), "allocations": mallocs,
                                  "peak_live": peak, "ratios": row,
                                  "device_calls_at_2x": {k: c for k, (c, _) in calls.items()},
                                  "events_recorded_at_2x": {k: e for k, (_, e) in calls.items()}}
        print(f"{name:<28} {len(events):>8,} {peak / MiB:>8.1f} M  " + "  ".join(
            f"{'>4x':>{width}}" if r is None else f"{r:>{width - 1}.3f}x" for r in row.values()))
    if args.batches:
        return _save(result, args.out, "batches.json")
    print("Replaying each trace on a device of 2x its peak live: device allocations + frees "
          "(cuMemAlloc/cuMemFree on a GPU), then events recorded (cuEventRecord)")
    print(f"{'trace':<28} {'mallocs':>8}  " + "  ".join(f"{name:>{width}}" for name in POLICIES))
    for name, t in result["traces"].items():
        pairs = [f"{t['device_calls_at_2x'][p]} / {t['events_recorded_at_2x'][p]}"
                 for p in POLICIES]
        print(f"{name:<28} {t['allocations']:>8,}  " + "  ".join(
            f"{pair:>{width}}" for pair in pairs))
    print("Goals (issue 26), on every trace: " + ", ".join(
        f"{name} at most {goal}x: " + ("met" if all(
            t["ratios"][name] is not None and t["ratios"][name] <= goal
            for t in result["traces"].values()) else "NOT met")
        for name, goal in GOALS.items()))
    _save(result, args.out, "traces.json")


def _save(result, out, name):
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
