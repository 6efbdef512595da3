"""Why a trace fails on a device: the pool at its first failed request.

Replays a trace (an RMM CSV log, gzip-compressed or not) under one of
bench_traces.py's policies on a simulated device and, at the first request
that fails, prints the failure's shape: the request and which pool it is
for, the live bytes then (requested and as the pool holds them), the
free bytes (in the pool's segments, on the device) against the largest
free piece, the small pool's and the large pool's reserved and free bytes,
the largest free pieces, and what defragmentation had done (and, for the
failed request, why it did not help).

    python benchmarks/diagnose_trace.py TRACE [--policy "no defrag"] (--capacity MIB | --ratio R)

``--ratio``: the device as a ratio of the trace's peak live bytes (rounded
down to a MiB); bench_traces.py's smallest device less 1 MiB shows why
that one fails.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_traces import POLICIES, first_failure, load, peak_live  # noqa: E402
from numba_alloc import SimulatedDevice  # noqa: E402
from numba_alloc.observe.trace import ALLOCATE, DEALLOCATE  # noqa: E402
from numba_alloc.policy.sizes import ROUND, segment_size  # noqa: E402

MiB = 1 << 20


def free_pieces(segments, kind):
    """Sizes of the free (inactive) blocks in the ``kind`` segments,
    largest first, and those segments' total bytes."""
    chosen = [s for s in segments if s["segment_type"] == kind]
    pieces = sorted((b["size"] for s in chosen for b in s["blocks"] if b["state"] == "inactive"),
                    reverse=True)
    return pieces, sum(s["total_size"] for s in chosen)


def where_pieces_lie(segments, count):
    """For the ``count`` largest free pieces: (piece, its segment's bytes,
    live bytes in that segment, its live blocks)."""
    found = []
    for s in segments:
        live = [b["size"] for b in s["blocks"] if b["state"] != "inactive"]
        found += [(b["size"], s["total_size"], sum(live), len(live))
                  for b in s["blocks"] if b["state"] == "inactive"]
    return sorted(found, reverse=True)[:count]


def movable_into_holes(segments, kind):
    """(live bytes of the ``kind`` segments, of those in blocks no larger
    than the largest free piece of another segment): what could move
    into the holes at all."""
    chosen = [s for s in segments if s["segment_type"] == kind]
    holes = sorted((b["size"], s["address"]) for s in chosen for b in s["blocks"]
                   if b["state"] == "inactive")
    live = fits = 0
    for s in chosen:
        elsewhere = max((h for h, a in holes if a != s["address"]), default=0)
        for b in s["blocks"]:
            if b["state"] != "inactive":
                live += b["size"]
                fits += b["size"] if b["size"] <= elsewhere else 0
    return live, fits


def mib(n):
    return f"{n / MiB:.1f} MiB"


def describe(events, policy, capacity):
    """The failure's shape as lines of text."""
    found = first_failure(events, POLICIES[policy](SimulatedDevice(capacity, holds_data=False)))
    peak = peak_live(events)
    head = (f"{policy} on a device of {mib(capacity)} ({capacity / peak:.3f}x peak live "
            f"{mib(peak)})")
    if found is None:
        return [f"{head}: no request fails"]
    index, error, live_bytes, (defrags, moved) = found
    r = error.report
    small, small_reserved = free_pieces(r.segments, "small")
    large, large_reserved = free_pieces(r.segments, "large")
    reserved = small_reserved + large_reserved
    pieces = sorted(small + large, reverse=True)
    free = r.device_free + sum(pieces)
    lines = [f"{head}: event {index:,} of {len(events):,} ({index / len(events):.0%} through), "
             f"a {mib(r.nbytes)} request for the {'small' if r.small else 'large'}"
             f" pool fails",
             f"  live then {mib(live_bytes)} requested ({live_bytes / peak:.3f}x peak live), "
             f"{mib(r.allocated)} allocated (rounded to {ROUND} B)",
             f"  free {mib(free)}: {mib(sum(pieces))} in the pool's segments, {mib(r.device_free)}"
             f" on the device; largest free piece {mib(max(pieces[:1] + [r.device_free]))}",
             f"  reserved {mib(reserved)}: small pool {mib(small_reserved)} "
             f"({small_reserved / peak:.1%} of peak live) with {mib(sum(small))} free, "
             f"large pool {mib(large_reserved)} with {mib(sum(large))} free",
             f"  largest free pieces: " + ", ".join(mib(p) for p in pieces[:6]) +
             f" ({len(pieces)} free pieces in {len(r.segments)} segments)"]
    segment = segment_size(r.size)
    large_sizes = sorted(s["total_size"] for s in r.segments if s["segment_type"] == "large")
    lines.append(f"  the request would reserve a segment of {mib(segment)}: "
                 f"{mib(max(0, segment - r.device_free))} more than the device has free; "
                 f"{len(large_sizes)} large segments, median {mib(large_sizes[len(large_sizes) // 2])}"
                 f", {sum(size >= r.size for size in large_sizes)} of them at least the request's size")
    lines.append("  where the largest pieces lie (segment, live bytes in blocks): " + ", ".join(
        f"{mib(piece)} in {mib(total)} ({mib(live)} in {n})"
        for piece, total, live, n in where_pieces_lie(r.segments, 4)))
    live, fits = movable_into_holes(r.segments, "large")
    lines.append(f"  large pool's live blocks: {mib(live)}, {fits / live:.0%} of it in blocks no "
                 f"larger than another segment's largest free piece")
    if policy == "defrag":
        lines.append(f"  defragmentation before this request: {defrags} times, "
                     f"{mib(moved)} moved; for this request: "
                     f"{'refused: ' + r.refusal if r.refusal else 'no plan made room'}")
    return lines


def replay_until(events, pool, stop, watch=None):
    """Replay ``events`` (as first_failure does; none may fail) into
    ``pool`` up to event ``stop`` (excluded), calling ``watch(index)``
    after each event."""
    live = {}
    for index, e in enumerate(events[:stop]):
        if e.action == ALLOCATE:
            if e.pointer in live:
                pool.free(live.pop(e.pointer))
            live[e.pointer] = pool.malloc(e.size)
        elif e.action == DEALLOCATE and e.pointer in live:
            pool.free(live.pop(e.pointer))
        if watch:
            watch(index)


def describe_ample(events, policy, capacity):
    """Where the reserved bytes are at the moment ``policy`` reserves the
    most, replaying on a device of ``capacity`` bytes, as lines of text."""
    peak = peak_live(events)
    most = [0, 0]

    def watch(index):
        reserved = pool.current("reserved_bytes")
        if reserved > most[0]:
            most[:] = reserved, index + 1
    pool = POLICIES[policy](SimulatedDevice(capacity, holds_data=False))
    replay_until(events, pool, len(events), watch)
    pool = POLICIES[policy](SimulatedDevice(capacity, holds_data=False))
    replay_until(events, pool, most[1])
    snapshot = pool.snapshot()
    segments = snapshot["segments"]
    lines = [f"{policy}, ample memory ({mib(capacity)}): most reserved {mib(most[0])} "
             f"({most[0] / peak:.3f}x peak live) at event {most[1]:,} of {len(events):,}"]
    for kind in ("small", "large"):
        chosen = [s for s in segments if s["segment_type"] == kind]
        empty = [s["total_size"] for s in chosen if not s["allocated_size"]]
        pending = sum(b["size"] for s in chosen for b in s["blocks"]
                      if b["state"] == "active_pending_free")
        pieces, total = free_pieces(segments, kind)
        lines.append(f"  {kind} pool: {mib(total)} in {len(chosen)} segments, "
                     f"{mib(sum(s['allocated_size'] for s in chosen))} allocated, "
                     f"{mib(pending)} pending frees, {mib(sum(pieces))} free "
                     f"({mib(sum(empty))} of it in {len(empty)} wholly free segments; "
                     f"largest pieces {', '.join(mib(p) for p in pieces[:4])})")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--policy", default="no defrag", choices=list(POLICIES))
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--capacity", type=int, help="the device's MiB")
    size.add_argument("--ratio", type=float, help="the device as a ratio of peak live")
    parser.add_argument("--ample", action="store_true",
                        help="show where the reserved bytes are when the most are reserved")
    args = parser.parse_args()
    events = load(args.trace)
    capacity = (args.capacity * MiB if args.capacity else
                int(args.ratio * peak_live(events)) // MiB * MiB)
    print(os.path.basename(args.trace))
    print("\n".join((describe_ample if args.ample else describe)(events, args.policy, capacity)))


if __name__ == "__main__":
    main()
