"""What the pool costs the host, beside issue 38's goals, from one run.

1. Cold start: fresh processes with an empty Numba cache
   (``NUMBA_CACHE_DIR`` at a new folder), CPU seconds (user + system) of
   ``import numba_alloc``, of the first 30 mallocs on a simulated device,
   of their frees, and of the first automatic defragmentation (defrag on:
   a 40 MiB request that only moving blocks serves), each compile included
   (goals: the first malloc + free at most 1.0 CPU-second, the first
   defragmentation at most 3). Then the same in a process that finds the
   cache the first one left (warm).
2. Under pressure: each committed trace (benchmarks/traces/ and the
   bundled one) replayed with defrag on, on the smallest simulated device
   that serves it (bench_traces.py's search: bisection to 1 MiB, checked
   above)
   and on an ample one (four times its peak live bytes): the pool's host
   microseconds per operation on each and their ratio (goal: at most 3x),
   on a simulated device of sizes only (holds_data=False: a copy is
   counted and moves no byte, as a GPU's moves none through the host).
   Beside it the same on a device that holds its data, less the device's
   own work (the bytes defragmentation copies, with NumPy here; the
   unmapping of the host pages of a released segment that held data):
   hundreds of MiB copied through the host's caches leave the pool's
   code and data out of them, which that subtraction cannot remove.
3. ``pool.defragment()`` end to end (plan and moves, on the simulated
   device) of a pool whose blocks were freed at random, one arena (growth
   off) of 3,000 and 30,000 blocks and growth on with 10,000 and 100,000:
   seconds, and the ratio per 10x blocks (goal: at most 12x); beside them,
   the same without the simulated device's own copying (NumPy, in host
   memory: a GPU's copy kernel runs on the device), and the same on a
   device of sizes only (no byte copied, no cache traffic from copies).
4. The free + malloc pair against the minimal pure-Python best-fit pool
   (benchmarks/minimal_pool.py) at 100 and 10,000 live blocks, interleaved
   in one fresh process as bench_core.py's section 1 (goal: at most 1.0x),
   and the cyclic garbage a million pairs leave (goal: none of ours).

    python benchmarks/bench_host_costs.py [--out DIR] [--quick] [--sections 1,2,3,4]

``--quick`` runs smaller cases (no goals are judged then). Prints each
figure beside its goal and writes results.json to DIR when given.
"""

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_core import cyclic_garbage, in_fresh_process, paired  # noqa: E402
from bench_malloc import cpu_name, save, versions  # noqa: E402

MiB = 1 << 20
GOALS = {"first malloc + free": 1.0, "first defragmentation": 3.0, "pressure": 3.0,
         "per 10x blocks": 12.0, "pair": 1.0}

_COLD = r"""
import json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0 = cpu()
import numba_alloc
from numba_alloc import Pool, SimulatedDevice
t1 = cpu()
MiB = 1 << 20
pool = Pool(SimulatedDevice(1 << 34))
blocks = [pool.malloc(1000 * (i + 1) * (1 + (i % 3) * 700)) for i in range(30)]
t2 = cpu()
for block in blocks:
    pool.free(block)
pool.synchronize()
t3 = cpu()
# nine 9 MiB blocks in a 200 MiB arena: every other one freed, so 40 MiB
# are free in 9 MiB holes and only moving blocks serves a 40 MiB request
fragmented = Pool(SimulatedDevice(200 * MiB), defrag=True, growth=False)
held = [fragmented.malloc(9 * MiB) for _ in range(20)]
for block in held[::2]:
    fragmented.free(block)
fragmented.synchronize()
t4 = cpu()
big = fragmented.malloc(40 * MiB)
t5 = cpu()
assert fragmented.memory_stats()["num_defragmentations"] >= 1
print(json.dumps({"import": t1 - t0, "first 30 mallocs": t2 - t1, "their frees": t3 - t2,
                  "first defragmentation": t5 - t4}))
"""


def cold_start():
    """CPU seconds of each first use, with an empty Numba cache, then warm."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache,
               "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        runs = {}
        for label in ("cold", "warm"):
            proc = subprocess.run([sys.executable, "-c", _COLD], env=env, cwd=cache,
                                  capture_output=True, text=True, check=True)
            runs[label] = json.loads(proc.stdout.splitlines()[-1])
    return runs


def traces():
    """(name, events) of every committed trace and the bundled one."""
    import glob

    from bench_traces import load
    from numba_alloc.observe.trace import BUNDLED_TRACE
    paths = sorted(glob.glob(os.path.join(HERE, "traces", "*.csv*"))) + [str(BUNDLED_TRACE)]
    return [(os.path.basename(p).split(".")[0], load(p)) for p in paths]


def pressure(quick):
    """{trace: (smallest capacity, {"sizes only" or "holding data":
    ((host, device) us/op there, (host, device) us/op on an ample
    device)})}, medians of three replays on a simulated device of sizes
    only and on one that holds its data."""
    from bench_traces import peak_live, smallest_ratio
    from numba_alloc import Pool, SimulatedDevice
    from numba_alloc.cli.replay import replay_trace
    out = {}
    for name, events in traces()[:2 if quick else None]:
        peak = peak_live(events)
        ratio, _ = smallest_ratio(events, "defrag", peak)
        if ratio is None:
            continue
        smallest = round(ratio * peak)

        def us_per_op(capacity, holds_data):
            runs = []
            for _ in range(3):
                device = SimulatedDevice(capacity, holds_data=holds_data)
                report = replay_trace(events, Pool(device, defrag=True))
                assert report.failed_requests == 0, (name, capacity)
                runs.append((report.host_us_per_op, report.device_us_per_op))
            return tuple(statistics.median(r[i] for r in runs) for i in range(2))
        out[name] = (smallest, {label: (us_per_op(smallest, holds), us_per_op(4 * peak, holds))
                                for label, holds in (("sizes only", False),
                                                     ("holding data", True))})
    return out


def fragmented_pool(blocks, growth, seed, holds_data=True):
    """A pool on a simulated device (``holds_data`` or of sizes only)
    holding ``blocks`` blocks of 512 B to 64 KiB (growth off: one arena
    just large enough), every other one in a random order freed, so that
    its free memory is scattered."""
    from numba_alloc import Pool, SimulatedDevice
    rng = random.Random(seed)
    sizes = [512 * rng.randrange(1, 129) for _ in range(blocks)]
    arena = (-(-sum(sizes) // (2 * MiB)) + 1) * 2 * MiB
    pool = Pool(SimulatedDevice(4 * arena, holds_data=holds_data), growth=growth, limit=arena,
                defrag=True)
    held = [pool.malloc(size) for size in sizes]
    rng.shuffle(held)
    for block in held[: blocks // 2]:
        pool.free(block)
    pool.synchronize()
    return pool, held[blocks // 2:]


def defragment_seconds(blocks, growth, repeat, holds_data=True):
    """Median seconds of pool.defragment() over ``repeat`` fresh pools, and
    of the part of it the simulated device's own work took (its copies)."""
    times, device = [], []
    for seed in range(repeat):
        pool, _ = fragmented_pool(blocks, growth, seed, holds_data)
        working, start = pool.backend.device_ns, time.perf_counter()
        pool.defragment()
        times.append(time.perf_counter() - start)
        device.append((pool.backend.device_ns - working) / 1e9)
    return statistics.median(times), statistics.median(device)


def defragment_scaling(quick):
    """{case: (small blocks, large blocks, (s, device s) small, (s, device s) large)}."""
    cases = {"one arena": (3_000, 30_000, False), "growth on": (10_000, 100_000, True)}
    if quick:
        cases = {"one arena": (300, 3_000, False), "growth on": (1_000, 10_000, True)}
    out = {}
    for name, (small, large, growth) in cases.items():
        defragment_seconds(small, growth, 1)            # warm: imports, first copies
        out[name] = (small, large, defragment_seconds(small, growth, 5),
                     defragment_seconds(large, growth, 3),
                     defragment_seconds(small, growth, 5, holds_data=False)[0],
                     defragment_seconds(large, growth, 3, holds_data=False)[0])
    return out


def judged(value, goal, quick):
    if quick:
        return "(--quick: not judged)"
    return f"goal at most {goal}: {'met' if value <= goal else 'NOT met'}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help="smaller cases, no goals judged")
    parser.add_argument("--sections", default="1,2,3,4")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    result = {"date": time.strftime("%Y-%m-%d"), "versions": versions(),
              "machine": f"{platform.node()}: {cpu_name()}, {os.cpu_count()} cores"}
    print(f"host: {result['machine']} {result['versions']}")

    if "1" in sections:
        print("\n1. Cold start, CPU seconds (fresh processes, empty Numba cache, then warm):")
        runs = result["cold_start"] = cold_start()
        for label, run in runs.items():
            print(f"   {label:>5}: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items()))
        cold = runs["cold"]
        first = cold["first 30 mallocs"] + cold["their frees"]
        print(f"   first malloc + free, cold: {first:.2f} CPU-s, "
              f"{judged(first, GOALS['first malloc + free'], False)}")
        print(f"   first defragmentation, cold: {cold['first defragmentation']:.2f} CPU-s, "
              f"{judged(cold['first defragmentation'], GOALS['first defragmentation'], False)}")

    if "2" in sections:
        print("\n2. Under pressure: replays with defrag on, the pool's host us per operation "
              "(median of 3), on the smallest device that serves the trace and on one of 4x "
              "its peak live bytes. Judged on a simulated device of sizes only (holds_data="
              "False: copies counted, no byte moved, as a GPU moves them on the device); "
              "beside it, on one that holds its data, the pool's host time less the device's "
              "own work (NumPy copies, unmapping), whose traffic through the host's caches "
              "still slows the pool's code after it:")
        result["pressure"] = found = pressure(args.quick)
        print(f"   {'trace':<22} {'smallest':>9} {'pool':>7} {'ample':>7} {'ratio':>7}  "
              f"{'holding data: pool':>19} {'ample':>6} {'ratio':>7}")
        for name, (smallest, figures) in found.items():
            (pool, _), (ample, _) = figures["sizes only"]
            (host, device), (ample_host, ample_device) = figures["holding data"]
            ratio = pool / ample
            held = (host - device) / (ample_host - ample_device)
            print(f"   {name:<22} {smallest / MiB:>7.0f}Mi {pool:>7.1f} {ample:>7.1f} "
                  f"{ratio:>6.2f}x  {host - device:>19.1f} {ample_host - ample_device:>6.1f} "
                  f"{held:>6.2f}x  {judged(ratio, GOALS['pressure'], args.quick)}")

    if "3" in sections:
        print("\n3. pool.defragment() end to end (plan and moves), seconds (in brackets: "
              "without the simulated device's own copying); then the pool's own time on a "
              "device of sizes only:")
        result["defragment"] = scaling = defragment_scaling(args.quick)
        for name, (small, large, (t_small, d_small), (t_large, d_large), s_small,
                   s_large) in scaling.items():
            ratio = t_large / t_small
            own = (t_large - d_large) / (t_small - d_small)
            print(f"   {name:<10} {small:>7,} blocks {t_small:.3f} s ({t_small - d_small:.3f}), "
                  f"{large:>7,} blocks {t_large:.3f} s ({t_large - d_large:.3f}): {ratio:.1f}x "
                  f"({own:.1f}x); sizes only {s_small:.3f} s, {s_large:.3f} s: "
                  f"{s_large / s_small:.1f}x  {judged(ratio, GOALS['per 10x blocks'], args.quick)}")

    if "4" in sections:
        pairs, rounds = (10_000, 5) if args.quick else (50_000, 15)
        print(f"\n4. free+malloc pair against the minimal pool ({pairs:,} pairs a round, "
              f"{rounds} rounds interleaved; ratio: median of the rounds' ratios, range):")
        t = in_fresh_process("pairs", pairs, rounds)
        result["pairs"] = {}
        for live in (100, 10_000):
            ratio = paired(t, f"pool {live}", f"minimal {live}")
            result["pairs"][live] = {"pool_us": statistics.median(t[f"pool {live}"]),
                                     "minimal_us": statistics.median(t[f"minimal {live}"]),
                                     "ratio": ratio}
            print(f"   {live:>6,} live: pool {result['pairs'][live]['pool_us']:.2f} us, minimal "
                  f"{result['pairs'][live]['minimal_us']:.2f} us, {ratio[0]:.2f}x "
                  f"({ratio[1]:.2f}-{ratio[2]:.2f})  {judged(ratio[0], GOALS['pair'], args.quick)}")
        garbage = result["garbage"] = cyclic_garbage(100_000 if args.quick else 1_000_000)
        print(f"   cyclic garbage after the pairs: {garbage['all']} objects, "
              f"{garbage['ours']} of numba_alloc's (goal: none of ours)")
    if args.out:
        save(result, args.out)


if __name__ == "__main__":
    main()
