"""Make the pictures the README shows, on the simulated device:

* docs/segments.png: plot_segments after a workload that scatters free
  memory (the notebook's pipeline);
* docs/timeline.png: plot_timeline over a replay of the bundled training-loop
  trace.

and docs/figures.json, what the two pictures show in numbers (each
segment's size, bytes allocated and blocks; the replay's events and its
peaks), which tests/test_docs.py recomputes: when the pool's policy changes
what they show, the test fails until the pictures are made again.

Usage: python docs/make_figures.py
"""

import json
from pathlib import Path

import numpy as np

import numba_alloc

DOCS = Path(__file__).parent


def scattered_pool():
    """A pool after steps that keep one result of twelve temporaries each,
    with one block pinned and one freed while GPU work is queued."""
    device = numba_alloc.SimulatedDevice("2GiB")
    pool = numba_alloc.Pool(device)
    rng = np.random.default_rng(0)
    results = [pool.malloc(64 << 20)]
    for _ in range(30):
        temporaries = [pool.malloc(int(n)) for n in rng.integers(1 << 10, 6 << 20, size=12)]
        results.append(temporaries.pop(int(rng.integers(len(temporaries)))))
        for i in rng.permutation(len(temporaries)):
            pool.free(temporaries[i])
    pool.pin(results[3])
    pool.synchronize()              # the temporaries' frees complete
    device.launch()
    pool.free(results[8])
    return pool


def replayed_pool():
    """A pool that has replayed the bundled trace, its history recorded."""
    replayed = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"))
    numba_alloc.record_history(device=replayed)
    numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, replayed)
    return replayed


def shown(scattered, replayed):
    """What the pictures of these pools show, in numbers (figures.json)."""
    segments = sorted([s["total_size"], s["allocated_size"], len(s["blocks"])]
                      for s in scattered.snapshot()["segments"])
    timeline = {"events": len(numba_alloc.recorded_events(replayed)),
                "peak_reserved": replayed.peak("reserved_bytes"),
                "peak_allocated": replayed.peak("allocated_bytes")}
    return {"segments": segments, "timeline": timeline}


def main():
    scattered, replayed = scattered_pool(), replayed_pool()
    numba_alloc.plot_segments(scattered).savefig(DOCS / "segments.png", dpi=90)
    numba_alloc.plot_timeline(replayed, x="event").savefig(DOCS / "timeline.png", dpi=90)
    (DOCS / "figures.json").write_text(json.dumps(shown(scattered, replayed), indent=1) + "\n")
    print(f"wrote {DOCS / 'segments.png'}, {DOCS / 'timeline.png'} and {DOCS / 'figures.json'}")


if __name__ == "__main__":
    main()
