"""Make the pictures the README shows, on the simulated device:

* docs/segments.png: plot_segments after a workload that scatters free
  memory (the notebook's pipeline);
* docs/timeline.png: plot_timeline over a replay of the bundled training-loop
  trace.

Usage: python docs/make_figures.py
"""

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


def main():
    fig = numba_alloc.plot_segments(scattered_pool())
    fig.savefig(DOCS / "segments.png", dpi=90)
    replayed = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"))
    numba_alloc.record_history(device=replayed)
    numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, replayed)
    numba_alloc.plot_timeline(replayed, x="event").savefig(DOCS / "timeline.png", dpi=90)
    print(f"wrote {DOCS / 'segments.png'} and {DOCS / 'timeline.png'}")


if __name__ == "__main__":
    main()
