"""When keep_whole_segments should hold: the policy as it is against
variants of it, per trace (issue 40's part 3).

    python benchmarks/ablate_keep_whole.py VARIANT TRACE...

VARIANT is one of:

* ``main``: the policy as it is (the rule, and reuse first, from
  segments.SCARCE_FROM of the pool's limit reserved);
* ``from:F``: the rules for scarce memory from a fraction F of the limit
  reserved instead (``from:0``: at all times, as before 2026-11-29);
* ``split``: as ``main``, but when growing needs cached segments returned
  first, a segment the rule keeps whole is split for the request instead;
* ``off``: keep_whole_segments off (PyTorch's rule);

or several, comma-separated (``from:0,split``: split on the rule as it
was before 2026-11-29).

For each trace, one line: the variant, the trace's file name and a JSON
object: ``defrag`` and ``no defrag``, the smallest simulated device on
which no request fails over the trace's peak live bytes
(bench_traces.smallest_ratio); ``ample``, the most reserved over peak live
on a device of bench_traces.AMPLE times the peak, without defrag;
``tight_calls``, device allocations + frees replaying with defrag on the
smallest device.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import bench_traces  # noqa: E402

from numba_alloc import Pool, SimulatedDevice  # noqa: E402
from numba_alloc.cli.replay import replay_trace  # noqa: E402
from numba_alloc.policy import core, segments  # noqa: E402
from numba_alloc.policy.block import LARGE  # noqa: E402


def _split_before_returning(reclaim_and_grow):
    def split_first(pool, size, kind, nbytes):
        mv = pool._core.mv
        kept = mv[core.H_KEEP_WHOLE]
        if kind == LARGE and kept:
            mv[core.H_KEEP_WHOLE] = 0
            try:
                block = pool._take(nbytes)
            finally:
                mv[core.H_KEEP_WHOLE] = kept
            if block is not None:
                return block
        return reclaim_and_grow(pool, size, kind, nbytes)
    return split_first


def use_variant(variant):
    """Put ``variant`` in force in this process; the settings its pools
    take."""
    settings = {}
    for part in variant.split(","):
        if part.startswith("from:"):
            segments.SCARCE_FROM = float(part[5:])
        elif part == "split":
            segments.Segments._reclaim_and_grow = _split_before_returning(
                segments.Segments._reclaim_and_grow)
        elif part == "off":
            settings["keep_whole_segments"] = False
        elif part != "main":
            raise SystemExit(f"VARIANT must be main, from:F, split or off, got {part!r}")
    return settings


def measure(path, settings):
    events = bench_traces.load(path)
    peak = bench_traces.peak_live(events)
    figures = {}
    for name, defrag in (("defrag", True), ("no defrag", False)):
        bench_traces.POLICIES[name] = (lambda device, defrag=defrag:
                                       Pool(device, defrag=defrag, **settings))
        figures[name] = bench_traces.smallest_ratio(events, name, peak)[0]
    report = replay_trace(events, Pool(SimulatedDevice(bench_traces.AMPLE * peak), **settings))
    figures["ample"] = report.peak_reserved / peak
    if figures["defrag"]:
        pool = Pool(SimulatedDevice(round(figures["defrag"] * peak)), defrag=True, **settings)
        replay_trace(events, pool)
        figures["tight_calls"] = pool.stats.num_device_alloc + pool.stats.num_device_free
    return figures


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    variant, paths = sys.argv[1], sys.argv[2:]
    settings = use_variant(variant)
    for path in paths:
        print(variant, os.path.basename(path), json.dumps(measure(path, settings)), flush=True)


if __name__ == "__main__":
    main()
