"""The pool's core against its yardsticks, side by side from one run.

1. Host microseconds per free+malloc pair (mixed sizes, garbage collector
   on) of :class:`numba_alloc.Pool` on the simulated device and of the
   minimal pure-Python best-fit pool (benchmarks/minimal_pool.py: same size
   rules, no stats, no lock, no pending frees), holding 100, 10,000 and
   100,000 live blocks. All six are interleaved round by round (the order
   reversed every other round); a ratio is the median over rounds of the
   ratio of two runs of the same round (Pool/minimal at one live count, and
   the Pool at a live count against the Pool at 100), with its range.
2. The plugin's ``NumbaAllocManager.memalloc`` plus release (dropping the
   returned pointer) against Numba's floor for any EMM plugin: an
   ``AutoFreePointer`` whose finalizer pops it from an allocations dict, as
   Numba's own manager keeps it, plus ``own()`` plus release. "glue only"
   is the same plugin over a stand-in pool whose malloc hands out handles
   made beforehand and whose free_later does nothing: the plugin's own cost,
   whatever the pool's. No GPU: the manager runs on a stand-in context and
   the simulated device, as tests/test_emm.py does. Interleaved as in 1.
3. Cyclic garbage: a million pairs (100,000 with --quick) with the garbage
   collector off, then one collection: how many unreachable objects it
   finds, and how many of them are numba_alloc's (the goal is none).
4. ``garbage_collection_threshold``: host microseconds per malloc of a pool
   growing from 90,000 to 100,000 live blocks of 256 KiB to 1 MiB (2 MiB
   segments: a new one every few mallocs; the simulated device backs none
   of it), the threshold at 0.01 of a 128 GiB limit (so every new segment
   checks what it could release) against no threshold, interleaved by
   rounds (issue 26's goal: under 2x).

Sections 1 and 2 each run in a fresh interpreter, so that neither measures
the heap the other left (section 1's pools hold 200,000 handles). A fresh
process's import and first use, cold and warm: bench_host_costs.py.

    python benchmarks/bench_core.py [--out DIR] [--quick] [--rounds N]

Prints the tables with ratios and writes results.json to DIR when given.
"""

import argparse
import gc
import itertools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import types
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(HERE)

from bench_malloc import cpu_name, mixed_size, save, versions  # noqa: E402
from minimal_pool import MinimalPool  # noqa: E402


def _pairs_runner(pool, live, pairs, seed):
    """A function running ``pairs`` free+malloc pairs on ``pool`` (which it
    fills with ``live`` blocks first); returns microseconds per pair."""
    rng = random.Random(seed)
    blocks = [pool.malloc(mixed_size(rng)) for _ in range(live)]
    order = [(rng.randrange(live), mixed_size(rng)) for _ in range(pairs)]
    free, malloc = pool.free, pool.malloc
    for j, size in order[: pairs // 4]:           # warm the pool's cache
        free(blocks[j])
        blocks[j] = malloc(size)

    def run():
        start = time.perf_counter()
        for j, size in order:
            free(blocks[j])
            blocks[j] = malloc(size)
        return (time.perf_counter() - start) / pairs * 1e6
    return run


def interleaved(runners, rounds):
    """Microseconds of each runner per round, alternating their order."""
    names = list(runners)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(runners[name]())
    return times


def paired(times, a, b):
    """(median, lowest, highest) over rounds of times[a] / times[b]."""
    ratios = sorted(x / y for x, y in zip(times[a], times[b]))
    return statistics.median(ratios), ratios[0], ratios[-1]


LIVE = (100, 10_000, 100_000)


def pool_section(pairs, rounds):
    """Per-round microseconds of "pool <live>" and "minimal <live>"."""
    from numba_alloc import Pool, SimulatedDevice
    runners = {}
    for live in LIVE:
        runners[f"pool {live}"] = _pairs_runner(Pool(SimulatedDevice(1 << 50)), live, pairs, live)
        runners[f"minimal {live}"] = _pairs_runner(MinimalPool(), live, pairs, live)
    return interleaved(runners, rounds)


class _Device:
    id = 0
    _dev = types.SimpleNamespace(memory_resource=None)     # cuda-core's Device


class _Context:
    """Stands in for Numba's Context (the manager reads only ``device``
    before it builds its backend, which is replaced by the simulated one)."""
    device = _Device()


class _StandInPool:
    """The pool as the plugin uses it, with malloc handing out ``handles``
    (live blocks of a real pool) in turn and free_later doing nothing."""

    def __init__(self, pool, handles):
        self.lock, self.relocator, self.settings = pool.lock, pool.relocator, pool.settings
        self._next = itertools.cycle(handles).__next__

    def malloc(self, nbytes):
        return self._next()

    def free_later(self, block):
        pass


def plugin_manager():
    """The plugin's manager on a stand-in context, its pool on a simulated device."""
    from numba_alloc import SimulatedDevice
    from numba_alloc.plugin import emm
    real = emm.CudaDevice
    emm.CudaDevice = lambda context: SimulatedDevice(1 << 40)
    try:
        manager = emm.NumbaAllocManager(context=_Context())
        manager.initialize()
    finally:
        emm.CudaDevice = real
    return manager


def manager_section(pairs, rounds):
    from numba.cuda.cudadrv.driver import AutoFreePointer, binding

    manager, glue = plugin_manager(), plugin_manager()
    rng = random.Random(7)
    sizes = [mixed_size(rng) for _ in range(pairs)]
    keep = [manager.memalloc(mixed_size(rng)) for _ in range(100)]   # some live blocks
    glue.pool = _StandInPool(glue.pool, [glue.pool.malloc(size) for size in sizes[:1024]])

    def timed(memalloc):
        def run():
            start = time.perf_counter()
            for size in sizes:
                mem = memalloc(size)
                del mem
            return (time.perf_counter() - start) / pairs * 1e6
        return run

    context = _Context()
    allocations = {}

    def floor():
        ctx = weakref.proxy(context)
        address = 1 << 40
        start = time.perf_counter()
        for size in sizes:
            def finalizer(key=address):
                allocations.pop(key, None)
            mem = AutoFreePointer(ctx, binding.CUdeviceptr(address), size, finalizer=finalizer)
            allocations[address] = mem
            owned = mem.own()
            del mem, owned
        return (time.perf_counter() - start) / pairs * 1e6

    runners = {"plugin": timed(manager.memalloc), "glue": timed(glue.memalloc), "floor": floor}
    for run in runners.values():                        # warm
        run()
    result = interleaved(runners, rounds)
    del keep
    return result


GC_LIVE = 100_000


def _growth_runner(threshold, live, seed):
    """A function growing a fresh pool to ``live`` blocks (threshold
    ``threshold`` of a 128 GiB limit) and returning microseconds per malloc
    of the last tenth."""
    from numba_alloc import Pool, SimulatedDevice
    rng = random.Random(seed)
    sizes = [rng.randrange(256 << 10, 1 << 20) for _ in range(live)]
    warm = live - live // 10

    def run():
        pool = Pool(SimulatedDevice(1 << 40), limit=128 << 30,
                    garbage_collection_threshold=threshold)
        malloc = pool.malloc
        blocks = [malloc(size) for size in sizes[:warm]]
        start = time.perf_counter()
        for size in sizes[warm:]:
            blocks.append(malloc(size))
        return (time.perf_counter() - start) / (live - warm) * 1e6
    return run


def gc_section(live, rounds):
    """Per-round microseconds of "threshold" and "none"."""
    return interleaved({"threshold": _growth_runner(0.01, live, 1),
                        "none": _growth_runner(None, live, 1)}, rounds)


_SECTIONS = {"pairs": pool_section, "memalloc": manager_section, "gc": gc_section}


def in_fresh_process(section, pairs, rounds):
    """Run a section of this file in a fresh interpreter; its per-round times."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--section", section,
                           "--pairs", str(pairs), "--rounds", str(rounds)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def cyclic_garbage(pairs):
    """Run ``pairs`` free+malloc pairs (100 live blocks) with the collector
    off, then collect: the unreachable objects found, in all and those whose
    type is numba_alloc's (a pool leaving reference cycles would show here)."""
    from numba_alloc import Pool, SimulatedDevice
    pool = Pool(SimulatedDevice(1 << 40))
    run = _pairs_runner(pool, 100, pairs, 1)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        pool.synchronize()
        found = gc.collect()
        ours = sum(1 for obj in gc.garbage
                   if type(obj).__module__.startswith("numba_alloc"))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return {"all": found, "ours": ours}


def _ratio(r):
    return f"{r[0]:.2f}x ({r[1]:.2f}-{r[2]:.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help="fewer pairs (a smoke run)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--section", choices=sorted(_SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not gc.isenabled():
        gc.enable()
    if args.section:                    # a section, run by in_fresh_process
        print(json.dumps(_SECTIONS[args.section](args.pairs, args.rounds)))
        return
    pairs = 10_000 if args.quick else 50_000
    rounds = 3 if args.quick else args.rounds

    import numba_alloc
    result = {"date": time.strftime("%Y-%m-%d"), "versions": versions(),
              "machine": f"{platform.node()}: {cpu_name()}, {os.cpu_count()} cores",
              "numba_alloc": os.path.dirname(numba_alloc.__file__),
              "pairs": pairs, "rounds": rounds, "gc": gc.isenabled()}
    print(f"host: {result['machine']} {result['versions']}")
    print(f"numba_alloc from {result['numba_alloc']}; {pairs:,} pairs per round, "
          f"{rounds} rounds interleaved; times: median round; ratios: median of "
          "the rounds' ratios (lowest-highest); gc on")

    print("\n1. free+malloc pair, mixed sizes: host microseconds")
    t = in_fresh_process("pairs", pairs, rounds)
    print(f"{'live blocks':>12} {'Pool':>8} {'minimal':>8} {'Pool/minimal':>21} "
          f"{'Pool vs 100 live':>21}")
    result["pairs_us"], result["pairs_ratio"] = {}, {}
    for live in LIVE:
        pool, minimal = f"pool {live}", f"minimal {live}"
        us = {"pool": statistics.median(t[pool]), "minimal": statistics.median(t[minimal])}
        ratios = {"pool/minimal": paired(t, pool, minimal),
                  "pool/pool at 100": paired(t, pool, "pool 100")}
        print(f"{live:>12,} {us['pool']:>8.2f} {us['minimal']:>8.2f} "
              f"{_ratio(ratios['pool/minimal']):>21} {_ratio(ratios['pool/pool at 100']):>21}")
        result["pairs_us"][str(live)], result["pairs_ratio"][str(live)] = us, ratios
    save(result, args.out)

    print("\n2. memalloc + release: host microseconds")
    t = in_fresh_process("memalloc", pairs, rounds)
    us = {name: statistics.median(times) for name, times in t.items()}
    ratios = {"plugin/floor": paired(t, "plugin", "floor"), "glue/floor": paired(t, "glue", "floor")}
    print(f"{'plugin':>8} {'glue only':>10} {'floor':>8} {'plugin/floor':>21} {'glue/floor':>21}")
    print(f"{us['plugin']:>8.2f} {us['glue']:>10.2f} {us['floor']:>8.2f} "
          f"{_ratio(ratios['plugin/floor']):>21} {_ratio(ratios['glue/floor']):>21}")
    result["memalloc_us"], result["memalloc_ratio"] = us, ratios
    save(result, args.out)

    cycle_pairs = 100_000 if args.quick else 1_000_000
    print(f"\n3. cyclic garbage after {cycle_pairs:,} pairs (collector off meanwhile)")
    garbage = cyclic_garbage(cycle_pairs)
    print(f"objects of numba_alloc the collector found: {garbage['ours']} "
          f"(of {garbage['all']} unreachable objects in all)")
    result["cyclic_garbage"] = {"pairs": cycle_pairs, **garbage}
    save(result, args.out)

    live = GC_LIVE // 10 if args.quick else GC_LIVE
    print(f"\n4. malloc growing a pool to {live:,} live blocks: host microseconds, "
          "garbage_collection_threshold 0.01 against none")
    t = in_fresh_process("gc", live, rounds)
    us = {name: statistics.median(times) for name, times in t.items()}
    ratio = paired(t, "threshold", "none")
    print(f"{'threshold':>10} {'none':>8} {'threshold/none':>21}")
    print(f"{us['threshold']:>10.2f} {us['none']:>8.2f} {_ratio(ratio):>21}"
          + ("" if args.quick else f"   goal < 2x: {'met' if ratio[0] < 2 else 'NOT met'}"))
    result["gc_threshold_us"], result["gc_threshold_ratio"] = us, ratio
    save(result, args.out)


if __name__ == "__main__":
    main()
