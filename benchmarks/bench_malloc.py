"""Allocation latency, side by side from one run.

1. The pool's host time per malloc+free pair on the simulated device, for a
   mixed-size workload holding 100, 10,000 and 100,000 live blocks.
2. On a GPU: ``cuda.device_array(n)`` plus its release, for n from 256 B to
   64 MiB, under Numba's default manager, numba_alloc and RMM's Numba plugin
   (when installed), each in its own process (Numba fixes the manager per
   context), alternated over repetitions so that drift cancels in the ratios.
3. On a GPU: ``cuda.pinned_array(64 MiB)`` plus its release, 100 times, under
   the same managers (numba_alloc's host cache against a cuMemHostAlloc each
   time; the issue's goal: at least 20x).
4. On a GPU: what ``--split`` prints (below).

    python benchmarks/bench_malloc.py [--out DIR] [--repeat N] [--quick]
    python benchmarks/bench_malloc.py --split [--out DIR]

``--split``: instead, where the time of ``cuda.device_array(n)`` plus its
release goes under numba_alloc, on a GPU or else over the driver stand-in
(tests/standin): per pair, the whole, numba_alloc's share (its manager's
``memalloc`` and the block's finalizer, timed around each call less the
timer's own cost) and the rest, which is Numba's (and the driver's, which
cProfile then tells apart by file: numba_alloc, Numba, the driver or its
stand-in, the rest).

Prints the tables and writes results.json to DIR when given, rewritten
after each section and each GPU run, so that a run cut off keeps what
finished (``gpu_runs``: every child's figures as it completed).
"""

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

KiB, MiB = 1 << 10, 1 << 20
GPU_SIZES = [256, 4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB]
MANAGERS = {"default": None, "numba_alloc": "numba_alloc",
            "rmm": "rmm.allocators.numba"}


def mixed_size(rng):
    """Mostly small requests, some up to a few MiB: a Numba program's mix."""
    x = rng.random()
    if x < 0.6:
        return rng.randrange(1, 8 * KiB)
    if x < 0.95:
        return rng.randrange(8 * KiB, MiB)
    return rng.randrange(MiB, 8 * MiB)


def simulated_pairs(live, pairs):
    """Microseconds per free+malloc pair with ``live`` blocks held."""
    from numba_alloc import Pool, SimulatedDevice
    rng = random.Random(live)
    pool = Pool(SimulatedDevice(1 << 50))
    blocks = [pool.malloc(mixed_size(rng)) for _ in range(live)]
    order = [(rng.randrange(live), mixed_size(rng)) for _ in range(pairs)]
    for j, size in order[: pairs // 10]:          # warm the pool's cache
        pool.free(blocks[j])
        blocks[j] = pool.malloc(size)
    start = time.perf_counter()
    for j, size in order:
        pool.free(blocks[j])
        blocks[j] = pool.malloc(size)
    return (time.perf_counter() - start) / pairs * 1e6


def gpu_child(pairs):
    """Runs in a child process whose manager the environment chose: print
    JSON {size: us per device_array + release}."""
    import numpy as np
    from numba import cuda
    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "rmm.allocators.numba":
        import rmm
        rmm.reinitialize(pool_allocator=True)
    cuda.current_context()
    out = {}
    for size in GPU_SIZES:
        n = pairs if size <= MiB else max(50, pairs // 20)
        for _ in range(n // 10):
            cuda.device_array(size, dtype=np.uint8)
        cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            a = cuda.device_array(size, dtype=np.uint8)
            del a
        cuda.synchronize()
        out[size] = (time.perf_counter() - start) / n * 1e6
    print(json.dumps(out))


SPLIT_SIZES = [256, 64 * KiB, 16 * MiB]


def _pairs(size, n):
    """Seconds for ``n`` of cuda.device_array(size) + release."""
    import numpy as np
    from numba import cuda
    start = time.perf_counter()
    for _ in range(n):
        a = cuda.device_array(size, dtype=np.uint8)
        del a
    return time.perf_counter() - start


def _timer_cost(n=100_000):
    """Seconds one timed call adds: two perf_counter calls and a sum."""
    clock, spent = time.perf_counter, [0.0]
    start = clock()
    for _ in range(n):
        t = clock()
        spent[0] += clock() - t
    return (clock() - start) / n


def split_child(pairs):
    """Runs in a child process under numba_alloc (a GPU's or the
    stand-in's): print JSON {size: {"total_us", "ours_us", "pool_us",
    "numba_us", "profile": {part: share of profiled time}}}: ``ours``, the
    manager's memalloc and the block's finalizer (with the Numba pointer
    objects the plugin interface has them make); ``pool``, of those, the
    pool's malloc and free_later."""
    import cProfile
    import pstats

    from numba import cuda

    from numba_alloc.plugin import emm
    from numba_alloc.policy.pool import Pool
    cuda.current_context()
    out = {}
    cost = _timer_cost()
    clock = time.perf_counter

    def timed(function, spent):
        """``function`` adding its seconds and calls to ``spent``."""
        def call(*args):
            t = clock()
            try:
                return function(*args)
            finally:
                spent[0] += clock() - t
                spent[1] += 1
        return call

    def net(spent):
        return (spent[0] - spent[1] * cost) / pairs

    memalloc, free_block = emm.NumbaAllocManager.memalloc, emm._free_block
    malloc, free_later = Pool.malloc, Pool.free_later
    for size in SPLIT_SIZES:
        _pairs(size, pairs // 10)                           # warm: the pool's cache holds it
        total = min(_pairs(size, pairs) for _ in range(3)) / pairs
        glue, pool = [0.0, 0], [0.0, 0]
        emm.NumbaAllocManager.memalloc = timed(memalloc, glue)
        emm._free_block = lambda *args: timed(free_block(*args), glue)
        Pool.malloc, Pool.free_later = timed(malloc, pool), timed(free_later, pool)
        try:
            _pairs(size, pairs)
            # the pool's calls run inside the glue's: each adds its timer there too
            ours = net(glue) - pool[1] * cost / pairs
            in_pool = net(pool)
        finally:
            emm.NumbaAllocManager.memalloc, emm._free_block = memalloc, free_block
            Pool.malloc, Pool.free_later = malloc, free_later
        profile = cProfile.Profile()
        profile.runcall(_pairs, size, pairs // 4)
        parts = {}
        for (path, _, _), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():
            part = ("numba_alloc" if "numba_alloc" + os.sep in path else
                    "driver stand-in" if os.sep + "standin" + os.sep in path else
                    "driver bindings" if os.sep + "cuda" + os.sep + "bindings" in path else
                    "Numba" if os.sep + "numba" in path else "other")
            parts[part] = parts.get(part, 0.0) + tottime
        whole = sum(parts.values()) or 1.0
        out[size] = {"total_us": total * 1e6, "ours_us": ours * 1e6, "pool_us": in_pool * 1e6,
                     "numba_us": (total - ours) * 1e6,
                     "profile": {k: v / whole for k, v in sorted(parts.items())}}
    print(json.dumps(out))


def split_section(args, result=None):
    """Run :func:`split_child` under numba_alloc (over the stand-in where
    no GPU is), print its table and save it, in ``result`` when given
    (section 4 of a GPU run), else on its own (--split)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CUDA_MEMORY_MANAGER"}
    where = gpu_info()
    if where is None:
        env = standin_env()
    env["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_alloc"
    pairs = 2_000 if args.quick else 20_000
    proc = subprocess.run([sys.executable, __file__, "--child-split", str(pairs)], env=env,
                          capture_output=True, text=True, check=True)
    split = json.loads(proc.stdout.splitlines()[-1])
    machine = where["gpu"] if where else "the driver stand-in (no GPU)"
    print(host_line())
    print(f"cuda.device_array(n) + release under numba_alloc on {machine}: microseconds a "
          f"pair (best of 3 runs of {pairs:,}); numba_alloc's share: its memalloc and the "
          "block's finalizer (the Numba pointer objects they make included), of which the "
          "pool's malloc and free_later; the rest, Numba's; then cProfile's shares by file")
    print(f"{'size':>10} {'total':>8} {'numba_alloc':>12} {'its pool':>9} {'Numba':>8} "
          f"{'ours':>6}   profile")
    for size, row in split.items():
        shares = ", ".join(f"{k} {v:.0%}" for k, v in row["profile"].items())
        print(f"{int(size):>10} {row['total_us']:>8.2f} {row['ours_us']:>12.2f} "
              f"{row['pool_us']:>9.2f} {row['numba_us']:>8.2f} "
              f"{row['ours_us'] / row['total_us']:>6.0%}   {shares}")
    if result is None:
        result = {"date": time.strftime("%Y-%m-%d"), "host": host_line()}
    result.update({"machine": machine, "pairs": pairs, "split_us": split})
    save(result, args.out)


PINNED_SIZE, PINNED_ARRAYS = 64 * MiB, 100


def pinned_child():
    """Runs in a child process whose manager the environment chose: print
    JSON {"ms_per_array": ms per cuda.pinned_array(64 MiB) + release}."""
    import numpy as np
    from numba import cuda
    cuda.current_context()
    cuda.pinned_array(PINNED_SIZE, dtype=np.uint8)          # first use: not timed
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(PINNED_ARRAYS):
        a = cuda.pinned_array(PINNED_SIZE, dtype=np.uint8)
        del a
    cuda.synchronize()
    print(json.dumps({"ms_per_array": (time.perf_counter() - start) / PINNED_ARRAYS * 1e3}))


def available(manager):
    if manager == "rmm":
        try:
            import rmm  # noqa: F401
        except ImportError:
            return False
    return True


def save(result, out):
    """Write ``result`` to ``out``/results.json (atomically) when ``out`` is given."""
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(path + ".tmp", path)


def save_report(text, out):
    """Write ``text`` (a benchmark's printed table) to ``out``/results.md
    when ``out`` is given."""
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "results.md"), "w") as f:
            f.write(text + "\n")


def standin_env():
    """The environment of a process that runs over the driver stand-in
    (tests/standin): not the CUDA simulator, no NUMBA_ALLOC_CONF."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_ALLOC_CONF")}
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(tests, "standin", "startup"), tests,
                                         *filter(None, env.get("PYTHONPATH", "").split(
                                             os.pathsep))])
    env["NUMBA_ALLOC_STANDIN"] = "1"
    return env


def child_runs(repeat, child_args, on_run=None):
    """Each available manager's child (``child_args``) run ``repeat`` times,
    alternating the order: {manager: [its figures, parsed]}; ``on_run(
    repetition, manager, figures)`` is called after each."""
    managers = [m for m in MANAGERS if available(m)]
    runs = {m: [] for m in managers}
    for r in range(repeat):
        for m in (managers if r % 2 == 0 else managers[::-1]):
            env = {k: v for k, v in os.environ.items() if k != "NUMBA_CUDA_MEMORY_MANAGER"}
            if MANAGERS[m]:
                env["NUMBA_CUDA_MEMORY_MANAGER"] = MANAGERS[m]
            proc = subprocess.run([sys.executable, __file__, *child_args], env=env,
                                  capture_output=True, text=True, check=True)
            runs[m].append(json.loads(proc.stdout.splitlines()[-1]))
            if on_run is not None:
                on_run(r, m, runs[m][-1])
    return runs


def gpu_table(repeat, pairs, on_run=None):
    """Median microseconds per size and manager (see child_runs)."""
    runs = child_runs(repeat, ["--child", str(pairs)], on_run)
    return {m: {s: statistics.median(run[str(s)] for run in runs[m]) for s in GPU_SIZES}
            for m in runs}


def cpu_name():
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_line():
    """One line naming the machine a benchmark ran on and the versions."""
    return f"host: {cpu_name()}, {os.cpu_count()} cores; {versions()}"


def versions():
    import numba
    info = {"python": platform.python_version(), "numba": numba.__version__,
            "machine": platform.machine(), "cpu": platform.processor() or platform.machine()}
    try:
        from importlib.metadata import version
        info["numba-cuda"] = version("numba-cuda")
    except Exception:
        pass
    return info


def gpu_info():
    from numba import cuda
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        return None
    from numba.cuda.cudadrv.driver import driver
    return {"gpu": cuda.get_current_device().name.decode()
            if isinstance(cuda.get_current_device().name, bytes) else cuda.get_current_device().name,
            "driver": driver.get_version()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer pairs (a smoke run)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-pinned", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-split", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--split", action="store_true",
                        help="where a device_array's time goes: numba_alloc's and Numba's")
    args = parser.parse_args()
    if args.child:
        return gpu_child(args.child)
    if args.child_pinned:
        return pinned_child()
    if args.child_split:
        return split_child(args.child_split)
    if args.split:
        return split_section(args)

    pairs = 20_000 if args.quick else 200_000
    result = {"date": time.strftime("%Y-%m-%d"), "versions": versions()}
    print(f"host: {platform.node()} {result['versions']}")
    print("\n1. Pool on the simulated device: host microseconds per free+malloc pair")
    sim = {}
    for live in (100, 10_000, 100_000):
        sim[live] = statistics.median(simulated_pairs(live, pairs) for _ in range(args.repeat))
    print(f"{'live blocks':>12} {'us/pair':>9} {'vs 100 live':>12}")
    for live, us in sim.items():
        print(f"{live:>12,} {us:>9.2f} {us / sim[100]:>11.2f}x")
    result["simulated_us_per_pair"] = sim
    save(result, args.out)

    gpu = gpu_info()
    if gpu is None:
        print("\n2. GPU: skipped (no CUDA GPU here)")
    else:
        print(f"\n2. GPU {gpu['gpu']} (driver API {gpu['driver']}): microseconds per "
              "cuda.device_array(n) + release, median of runs")
        result["gpu"] = gpu
        result["gpu_runs"] = []

        def on_run(rep, manager, figures):
            result["gpu_runs"].append({"repetition": rep, "manager": manager,
                                       "us_per_array": figures})
            save(result, args.out)
        table = gpu_table(args.repeat, 2_000 if args.quick else 20_000, on_run)
        managers = list(table)
        print(f"{'size':>10} " + " ".join(f"{m:>12}" for m in managers)
              + "  default/numba_alloc" + ("  rmm/numba_alloc" if "rmm" in table else ""))
        for size in GPU_SIZES:
            row = " ".join(f"{table[m][size]:>12.2f}" for m in managers)
            ratios = f"{table['default'][size] / table['numba_alloc'][size]:>20.2f}x"
            if "rmm" in table:
                ratios += f"{table['rmm'][size] / table['numba_alloc'][size]:>16.2f}x"
            print(f"{size:>10} {row}  {ratios}")
        result["gpu_us_per_array"] = table
        save(result, args.out)

        print(f"\n3. GPU: ms per cuda.pinned_array({PINNED_SIZE >> 20} MiB) + release, "
              f"{PINNED_ARRAYS} in a row, median of runs")
        runs = child_runs(args.repeat, ["--child-pinned"])
        pinned = {m: statistics.median(run["ms_per_array"] for run in runs[m]) for m in runs}
        for m, ms in pinned.items():
            print(f"{m:>12} {ms:>9.3f} ms  {ms / pinned['numba_alloc']:>8.1f}x numba_alloc's")
        result["gpu_ms_per_pinned_array"] = pinned
        save(result, args.out)
        print("\n4. ", end="")
        split_section(args, result)
    save(result, args.out)


if __name__ == "__main__":
    main()
