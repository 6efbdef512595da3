"""Defragmentation figures, side by side from one run.

1. Planner time (CPU): plan_hole and compaction_plan over 100,000 blocks;
   then compaction_plan's scaling beside issue 26's goals: 100,000 and
   1,000,000 blocks in segments (under 1.5 s at 1M, within 12x of 100k)
   and one arena of 30,000 blocks, as with growth off (under 0.3 s).
   compaction_plan is what defragment() runs: a Layout of arrays, which the
   pool builds from its block table, in; arrays of moves out.
2. On a GPU: the copy kernel's bandwidth against cuMemcpyDtoD for moves of
   1 MiB to 4 GiB (alternating, median of repetitions), and compaction time
   per GiB moved with numba_alloc as Numba's memory manager.

    python benchmarks/bench_defrag.py [--out DIR] [--repeat N] [--quick]

Writes defrag.json to DIR when given, rewritten after each section, so
that a run cut off keeps what finished.
"""

import argparse
import json
import os
import platform
import random
import statistics
import time

from bench_malloc import host_line, versions
from numba_alloc.policy.compaction import Layout, LiveBlock, SegmentMap, compaction_plan, plan_hole

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def segment_maps(blocks, seed=0):
    """Full 20 MiB segments of blocks of 512 B to 1 MiB, a third of them
    freed, until there are at least ``blocks`` blocks."""
    rng = random.Random(seed)
    segments, base, made = [], 1 << 40, 0
    while made < blocks:
        live, cursor = [], base
        while True:
            size = 512 * rng.randrange(1, 2048)
            if cursor + size > base + 20 * MiB:
                break
            if rng.random() > 1 / 3:
                live.append(LiveBlock(cursor, size, rng.random() < 0.01))
            cursor += size
            made += 1
        segments.append(SegmentMap(base, 20 * MiB, tuple(live)))
        base += 32 * MiB
    return segments


def planner_times(blocks, repeat):
    segments = segment_maps(blocks)
    layout = Layout.of(segments)
    compaction_plan(layout)                     # compiled, or loaded from the cache
    hole, compact = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        moves = plan_hole(segments, 16 * MiB)
        hole.append(time.perf_counter() - start)
        start = time.perf_counter()
        phases, emptied = compaction_plan(layout)
        compact.append(time.perf_counter() - start)
    return {"blocks": blocks, "segments": len(segments),
            "plan_hole_s": statistics.median(hole), "hole_moves": len(moves or []),
            "compaction_plan_s": statistics.median(compact),
            "compaction_moves": sum(map(len, phases)), "segments_emptied": len(emptied)}


def arena_map(blocks, seed=1):
    """One arena (growth off): ``blocks`` blocks of 512 B to 31.5 KiB with
    free gaps of up to 1.5 KiB between them, 1% pinned."""
    rng = random.Random(seed)
    live, cursor = [], 1 << 40
    for _ in range(blocks):
        cursor += 512 * rng.randrange(0, 4)
        size = 512 * rng.randrange(1, 64)
        live.append(LiveBlock(cursor, size, rng.random() < 0.01))
        cursor += size
    return [SegmentMap(1 << 40, cursor - (1 << 40) + 4096, tuple(live))]


# issue 26: seconds of compaction_plan, and the 1M / 100k ratio
SCALING_GOALS = {"large": 1.5, "arena": 0.3, "ratio": 12.0}


def planner_scaling(quick, repeat):
    """Median seconds of compaction_plan (after one untimed call, which may
    compile it) for the small and large segment maps and the arena, the
    small and large cases taken in turn."""
    small, large, arena = (10_000, 100_000, 3_000) if quick else (100_000, 1_000_000, 30_000)
    cases = {"small": Layout.of(segment_maps(small)), "large": Layout.of(segment_maps(large)),
             "arena": Layout.of(arena_map(arena))}
    out = {"blocks": {"small": small, "large": large, "arena": arena}}
    runs = {name: [] for name in cases}
    for layout in cases.values():
        compaction_plan(layout)
    for _ in range(repeat):
        for name, layout in cases.items():
            start = time.perf_counter()
            compaction_plan(layout)
            runs[name].append(time.perf_counter() - start)
    for name in cases:
        out[name] = statistics.median(runs[name])
    out["ratio"] = out["large"] / out["small"]
    return out


def gpu_bandwidth(sizes, repeat):
    """GB/s of the copy kernel and of cuMemcpyDtoD, moving n bytes."""
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    from numba_alloc.device import kernels
    from numba_alloc.backends.cuda_device import launch_config
    out = {}
    counters = cuda.to_device(np.zeros(kernels.COUNTERS, np.int64))
    kernel = kernels.gpu_copy_moves()
    for n in sizes:
        src = cuda.device_array(n, np.uint8)
        dst = cuda.device_array(n, np.uint8)
        table = cuda.to_device(np.array([[0, 0, n]], np.int64))
        blocks, threads = launch_config(n)
        args = (dst, src, dst.view(np.complex128), src.view(np.complex128), table, counters, 0)
        kernel[blocks, threads](*args)                      # compile and warm
        times = {"kernel": [], "memcpy": []}
        for r in range(repeat):
            for which in (("kernel", "memcpy") if r % 2 == 0 else ("memcpy", "kernel")):
                start, stop = cuda.event(), cuda.event()
                start.record()
                if which == "kernel":
                    kernel[blocks, threads](*args)
                else:
                    driver.cuMemcpyDtoD(dst.device_ctypes_pointer.value,
                                        src.device_ctypes_pointer.value, n)
                stop.record()
                stop.synchronize()
                times[which].append(cuda.event_elapsed_time(start, stop) / 1e3)
        # a copy reads and writes n bytes
        out[n] = {k: 2 * n / statistics.median(v) / 1e9 for k, v in times.items()}
        del src, dst
    return out


def gpu_compaction(repeat):
    """Seconds per GiB moved by numba_alloc.defragment() on fragmented arrays."""
    import numpy as np
    from numba import cuda

    import numba_alloc
    figures = []
    for _ in range(repeat):
        arrays = [cuda.device_array(int(n), np.uint8)
                  for n in np.random.default_rng(0).integers(1 * MiB, 64 * MiB, 400)]
        del arrays[::2]
        cuda.synchronize()
        start = time.perf_counter()
        result = numba_alloc.defragment()
        elapsed = time.perf_counter() - start
        figures.append({"seconds": elapsed, "bytes_moved": result.bytes_moved,
                        "s_per_GiB": elapsed / max(result.bytes_moved / GiB, 1e-12)})
        del arrays
        numba_alloc.empty_cache()
    return figures


def save(result, out):
    """Write ``result`` to ``out``/defrag.json (atomically) when ``out`` is given."""
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "defrag.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2, default=str)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    result = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
              "machine": platform.machine(), "versions": versions(), "host": host_line()}
    print(result["host"])
    blocks = 10_000 if args.quick else 100_000
    planner = planner_times(blocks, args.repeat)
    result["planner"] = planner
    save(result, args.out)
    print(f"1. Planner (CPU, {planner['blocks']:,} blocks in {planner['segments']} segments): "
          f"plan_hole(16 MiB) {planner['plan_hole_s'] * 1e3:.1f} ms "
          f"({planner['hole_moves']} moves), compaction_plan {planner['compaction_plan_s'] * 1e3:.1f} ms "
          f"({planner['compaction_moves']} moves, {planner['segments_emptied']} segments emptied)")
    scaling = planner_scaling(args.quick, max(1, args.repeat // 2))
    result["planner_scaling"] = scaling
    save(result, args.out)
    n = scaling["blocks"]
    goals = not args.quick
    print("   compaction_plan scaling (median s" + (", beside issue 26's goals):" if goals
                                                    else "; --quick: smaller, no goals):"))
    for name, label in (("small", f"{n['small']:,} blocks in segments"),
                        ("large", f"{n['large']:,} blocks in segments"),
                        ("arena", f"one arena of {n['arena']:,} blocks"),
                        ("ratio", "large / small")):
        value = scaling[name]
        goal = SCALING_GOALS.get(name) if goals else None
        shown = f"{value:.2f}x" if name == "ratio" else f"{value:.3f} s"
        print(f"   {label:<34} {shown:>10}" + (
            f"   goal < {goal}{'x' if name == 'ratio' else ' s'}: "
            f"{'met' if value < goal else 'NOT met'}" if goal else ""))

    from numba import cuda
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        print("2. GPU: skipped (no CUDA GPU here)")
    else:
        import numba_alloc
        numba_alloc.install()
        device = cuda.get_current_device()
        result["gpu"] = str(device.name)
        sizes = [MiB, 16 * MiB, 256 * MiB] + ([] if args.quick else [GiB, 4 * GiB])
        bandwidth = gpu_bandwidth(sizes, args.repeat)
        result["bandwidth_GBps"] = bandwidth
        save(result, args.out)
        print(f"2. Copy bandwidth on {device.name} (GB/s, read + write):")
        print(f"{'bytes':>12} {'kernel':>9} {'memcpy':>9} {'kernel/memcpy':>14}")
        for n, row in bandwidth.items():
            print(f"{n:>12} {row['kernel']:>9.1f} {row['memcpy']:>9.1f} "
                  f"{row['kernel'] / row['memcpy']:>13.2f}x")
        compaction = gpu_compaction(max(1, args.repeat // 2))
        result["compaction"] = compaction
        save(result, args.out)
        best = min(c["s_per_GiB"] for c in compaction)
        print(f"3. Compaction with numba_alloc.defragment(): {best:.3f} s per GiB moved "
              f"(best of {len(compaction)}; {compaction[0]['bytes_moved'] / GiB:.2f} GiB moved)")
    save(result, args.out)


if __name__ == "__main__":
    main()
