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
from numba_alloc.policy.sizes import ROUND  # noqa: E402

MiB = 1 << 20


def free_pieces(segments, kind):
    """Sizes of the free (inactive) blocks in the ``kind`` segments,
    largest first, and those segments' total bytes."""
    chosen = [s for s in segments if s["segment_type"] == kind]
    pieces = sorted((b["size"] for s in chosen for b in s["blocks"] if b["state"] == "inactive"),
                    reverse=True)
    return pieces, sum(s["total_size"] for s in chosen)


def mib(n):
    return f"{n / MiB:.1f} MiB"


def describe(events, policy, capacity):
    """The failure's shape as lines of text."""
    found = first_failure(events, POLICIES[policy](SimulatedDevice(capacity)))
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
    if policy == "defrag":
        lines.append(f"  defragmentation before this request: {defrags} times, "
                     f"{mib(moved)} moved; for this request: "
                     f"{'refused: ' + r.refusal if r.refusal else 'no plan made room'}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--policy", default="no defrag", choices=list(POLICIES))
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--capacity", type=int, help="the device's MiB")
    size.add_argument("--ratio", type=float, help="the device as a ratio of peak live")
    args = parser.parse_args()
    events = load(args.trace)
    capacity = (args.capacity * MiB if args.capacity else
                int(args.ratio * peak_live(events)) // MiB * MiB)
    print(os.path.basename(args.trace))
    print("\n".join(describe(events, args.policy, capacity)))


if __name__ == "__main__":
    main()
