"""Defragmentation figures, side by side from one run.

1. Planner time (CPU): plan_hole and compaction_plan over 100,000 blocks;
   then compaction_plan's scaling beside issue 26's goals: 100,000 and
   1,000,000 blocks in segments (under 1.5 s at 1M, within 12x of 100k)
   and one arena of 30,000 blocks, as with growth off (under 0.3 s); and
   100,000 blocks of which a quarter of the segments are wholly free,
   planned as defragment() plans (charge_free).
   compaction_plan is what defragment() runs: a Layout of arrays, which the
   pool builds from its block table, in; arrays of moves out.
2. The copy kernel without a GPU: its PTX's global accesses (128-bit on
   the aligned path, loads in flight, instructions per 16 bytes, atomic
   sites) and its global atomics per thread block under the CUDA simulator.
3. On a GPU: the copy kernel's bandwidth against cuMemcpyDtoD for moves of
   1 MiB to 1 GiB beside issue 36's goals (0.5x at 1 MiB, 0.9x from 16
   MiB), with the host's launch work hidden and included.
4. On a GPU: a full compaction with numba_alloc as Numba's memory manager
   (numba_alloc.defragment(), and with release=False, which keeps the
   emptied segments cached) against cuMemcpyDtoD of the same moves,
   beside the goal of at most 1.25x.

    python benchmarks/bench_defrag.py [--out DIR] [--repeat N] [--quick]
    python benchmarks/bench_defrag.py --chunks-per-block 1 4 16 [--one-block-a-chunk 1024]
        [--repeat N] [--out DIR]
    python benchmarks/bench_defrag.py --standin [--scale 0.25] [--repeat N]

``--chunks-per-block`` and ``--one-block-a-chunk``: section 3 alone, once
for each way of cutting a launch: K chunks per block the GPU holds at once,
launched with that many blocks, each striding over its chunks (as
CudaDevice.copy launches, kernels.CHUNKS_PER_BLOCK is the default); or N
chunks and a block each (the launch the H200 session of 2026-11-30 measured: N = 1024), to
choose between them.

With --standin, only section 4, over the driver stand-in (tests/standin),
its arrays scaled: the host's work in defragment() (all but the stand-in's
copy kernels, which run on the CPU), a move's share, and the driver calls.

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


def segment_maps(blocks, seed=0, lengths=(20, 20), free_share=0.0):
    """Segments of ``lengths`` MiB (the least and most; full 20 MiB ones
    by default) of blocks of 512 B to 1 MiB, a third of them freed, and
    ``free_share`` of the segments wholly free (as many are after a
    workload drops its arrays), until there are at least ``blocks``
    blocks."""
    rng = random.Random(seed)
    segments, base, made = [], 1 << 40, 0
    while made < blocks:
        length = (rng.randrange(lengths[0], lengths[1] + 1) if lengths[0] < lengths[1]
                  else lengths[0]) * MiB
        free = free_share > 0 and rng.random() < free_share
        live, cursor = [], base
        while True:
            size = 512 * rng.randrange(1, 2048)
            if cursor + size > base + length:
                break
            if not free and rng.random() > 1 / 3:
                live.append(LiveBlock(cursor, size, rng.random() < 0.01))
            cursor += size
            made += 1
        segments.append(SegmentMap(base, length, tuple(live)))
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
    small and large cases taken in turn; and for the small number of blocks
    in segments of 2 to 20 MiB, a quarter of them free, planned as
    defragment() does (charge_free)."""
    small, large, arena = (10_000, 100_000, 3_000) if quick else (100_000, 1_000_000, 30_000)
    cases = {"small": Layout.of(segment_maps(small)), "large": Layout.of(segment_maps(large)),
             "arena": Layout.of(arena_map(arena)),
             "free": Layout.of(segment_maps(small, 2, (2, 20), 0.25))}
    charged = {"free": True}
    out = {"blocks": {"small": small, "large": large, "arena": arena, "free": small}}
    runs = {name: [] for name in cases}
    for name, layout in cases.items():
        compaction_plan(layout, charge_free=charged.get(name, False))
    for _ in range(repeat):
        for name, layout in cases.items():
            start = time.perf_counter()
            compaction_plan(layout, charge_free=charged.get(name, False))
            runs[name].append(time.perf_counter() - start)
    for name in cases:
        out[name] = statistics.median(runs[name])
    out["ratio"] = out["large"] / out["small"]
    return out


def kernel_facts():
    """What a CPU can check of the copy kernel: its PTX for sm_90 (global
    accesses by width, the loop moving the most 128-bit words; an error
    where NVVM is missing), and its global atomics per thread block under
    Numba's CUDA simulator over moves of every kind, every byte checked."""
    import numpy as np

    from numba_alloc.device import inspection, kernels
    facts = {}
    try:
        from numba import cuda
        ptx, _ = cuda.compile_ptx(kernels.copy_moves, kernels.COPY_MOVES_SIGNATURE, cc=(9, 0))
        facts["ptx"] = {"global": inspection.global_accesses(ptx),
                        "widest_loop": inspection.widest_loop(ptx)}
    except Exception as e:          # noqa: BLE001 - reported: no NVVM, the simulator, ...
        facts["ptx"] = {"error": f"{type(e).__name__}: {e}"}
    # aligned, shifted by a word's part, unaligned, empty; chunks of 1 KiB
    table = np.array([[0, 32768, 20000], [20005, 52773, 3000], [24000, 56001, 777],
                      [30000, 60000, 0]], np.int64)
    src = np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8)
    dst, counters = np.zeros(1 << 16, np.uint8), np.zeros(kernels.COUNTERS, np.int64)
    atomics = inspection.atomics_per_block(
        lambda: kernels.simulated_copy(dst, src, table, counters, 1, threads=32, chunk=1024,
                                       grid=3))
    right = all((dst[d:d + n] == src[s:s + n]).all() for s, d, n in table)
    facts["simulator"] = {
        "moves": len(table), "bytes": int(table[:, 2].sum()), "blocks_that_copied": len(atomics),
        "most_atomics_per_block": max(atomics.values()), "atomics": sum(atomics.values()),
        "right": bool(right and list(counters) == [1, table[:, 2].sum(), len(table)])}
    return facts


# issue 36: the copy kernel's bandwidth over cuMemcpyDtoD's (at least), and a
# full compaction's time over cuMemcpyDtoD's for the same moves (at most)
BANDWIDTH_GOALS = {MiB: 0.5, 16 * MiB: 0.9, 256 * MiB: 0.9, GiB: 0.9}
COMPACTION_GOAL = 1.25


def gpu_bandwidth(sizes, repeat, spacer=GiB, chunks_per_block=None, one_block_a_chunk=None):
    """GB/s (read + write: 2n over the time) of the copy kernel, launched
    as CudaDevice.copy launches it (kernels.launch_tables, launch_config),
    and of cuMemcpyDtoD, moving n bytes; medians of ``repeat`` event-timed
    runs, the two copies alternating. "device": queued behind a memset of
    ``spacer`` bytes, so that the host's launch work overlaps it and only
    the device's time counts ("hidden": the share of runs where the memset
    was still running when the copy had been issued); "idle": issued to an
    idle GPU, the host's launch work included (as measured on 2026-11-27);
    "right": whether a last launch copied every byte; "blocks" and "chunks":
    the kernel's launch. ``chunks_per_block`` (default
    kernels.CHUNKS_PER_BLOCK): the launch's chunks per block the GPU holds
    at once, and no more blocks than those; ``one_block_a_chunk``: instead,
    that many chunks and a block each."""
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    from numba_alloc.device import kernels
    from numba_alloc.device.kernels import launch_config, resident_blocks
    kernel = kernels.gpu_copy_moves()
    resident = None if one_block_a_chunk else resident_blocks(kernel)
    target = one_block_a_chunk or (
        (chunks_per_block or kernels.CHUNKS_PER_BLOCK) * resident if resident
        else kernels.TARGET_CHUNKS)             # a driver that cannot say: as CudaDevice
    scratch = cuda.to_device(np.zeros(kernels.SCRATCH_WORDS, np.int64))
    busy = cuda.device_array(spacer, np.uint8)

    def timed(copy, behind):
        start, stop, issued = cuda.event(), cuda.event(), cuda.event(timing=False)
        if behind:
            driver.cuMemsetD8(busy.device_ctypes_pointer.value, 0, spacer)
            issued.record()
        start.record()
        copy()
        stop.record()
        hidden = behind and not issued.query()
        stop.synchronize()
        return cuda.event_elapsed_time(start, stop) / 1e3, hidden

    out = {}
    for n in sizes:
        src, dst = cuda.device_array(n, np.uint8), cuda.device_array(n, np.uint8)
        ((words, ((_, at, chunks),)),) = kernels.launch_tables(
            [((0, n), (0, n), np.array([[0, 0, n]], np.int64))], 0, target_chunks=target)
        scratch[kernels.TABLE:kernels.TABLE + len(words)].copy_to_device(words)
        blocks, threads = launch_config(chunks, resident)
        copies = {"kernel": lambda: kernel[blocks, threads](dst, src, scratch, at),
                  "memcpy": lambda: driver.cuMemcpyDtoD(dst.device_ctypes_pointer.value,
                                                        src.device_ctypes_pointer.value, n)}
        for copy in copies.values():        # warm
            copy()
        cuda.synchronize()
        runs = {(mode, which): [] for mode in ("device", "idle") for which in copies}
        for r in range(repeat):
            for which in (("kernel", "memcpy") if r % 2 == 0 else ("memcpy", "kernel")):
                for mode in ("device", "idle"):
                    runs[mode, which].append(timed(copies[which], mode == "device"))
        out[n] = {mode: {which: 2 * n / statistics.median(t for t, _ in runs[mode, which]) / 1e9
                         for which in copies} for mode in ("device", "idle")}
        out[n]["device"]["hidden"] = statistics.mean(
            h for which in copies for _, h in runs["device", which])
        driver.cuMemsetD8(dst.device_ctypes_pointer.value, 0, n)
        copies["kernel"]()
        out[n]["right"] = bool((dst.copy_to_host() == src.copy_to_host()).all())
        out[n]["blocks"], out[n]["chunks"] = blocks[0], chunks     # the blocks that copy
        del src, dst
    return out


def _timed(owner, name, seconds, counts):
    """Wrap ``owner.name`` so that its calls add to ``seconds[name]`` and
    ``counts[name]``; returns a function that unwraps it."""
    function, own = getattr(owner, name), name in vars(owner)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
            counts[name] = counts.get(name, 0) + 1

    setattr(owner, name, timed)
    return (lambda: setattr(owner, name, function)) if own else (lambda: delattr(owner, name))


def _defragment(backend, sizes, also=(), recording=None, release=True):
    """numba_alloc.defragment(release=release) over ``sizes``-byte arrays,
    every other one dropped (afterwards, empty_cache() gives back what it
    kept): its seconds, those of its copies (CudaDevice.start_copies,
    whose phases are recorded, and finish_copies) and of its releases of emptied segments
    (CudaDevice.release: cuMemFree), what it moved, and the moves' lengths.
    ``also``: (owner, name) of more calls to time, their seconds under
    "<name>_seconds"; ``recording``: the stand-in's, to count the driver
    calls of defragment() by name ("driver_calls")."""
    import contextlib
    from collections import Counter

    import numpy as np
    from numba import cuda

    import numba_alloc
    from numba_alloc.device import kernels
    # every run from an empty pool: Numba's deferred frees of the last run done
    cuda.current_context().memory_manager.deallocations.clear()
    numba_alloc.empty_cache()
    arrays = [cuda.device_array(int(n), np.uint8) for n in sizes]
    del arrays[::2]
    # the dropped arrays' frees done and retired, so that defragment()'s
    # time and calls are its own
    cuda.current_context().memory_manager.deallocations.clear()
    with numba_alloc.device_pool() as pool:
        pool.synchronize()
    calls, seconds, counts = [], {}, {}
    begin_copies = backend.start_copies

    def recorded_start(phases, first):
        if not calls:
            seconds["before_start"] = time.perf_counter() - start
        calls.extend((phase, first if i == 0 else 0) for i, phase in enumerate(phases))
        return begin_copies(phases, first)

    backend.start_copies = recorded_start
    undo = [_timed(backend, name, seconds, counts)
            for name in ("start_copies", "finish_copies", "release")]
    undo += [_timed(owner, name, seconds, counts) for owner, name in also]
    try:
        with (recording or contextlib.nullcontext)() as made:
            start = time.perf_counter()
            result = numba_alloc.defragment(release=release)
            elapsed = time.perf_counter() - start
    finally:
        for unwrap in reversed(undo):
            unwrap()
        del backend.start_copies
    del arrays
    numba_alloc.empty_cache()
    lengths = [int(n) for phase, _ in calls for n in phase.moves[:, 2]]
    launches = sum(len(launched) for phase, first in calls      # as CudaDevice.copy launches
                   for _, launched in kernels.launch_tables([kernels.phase_span(phase)], first))
    figures = {"seconds": elapsed,
               "copy_seconds": seconds.get("start_copies", 0.0) + seconds.get("finish_copies", 0.0),
               "start_seconds": seconds.get("start_copies", 0.0),
               "finish_seconds": seconds.get("finish_copies", 0.0),
               "release_seconds": seconds.get("release", 0.0),
               "before_start_seconds": seconds.get("before_start", 0.0),
               "releases": counts.get("release", 0), "bytes_moved": result.bytes_moved,
               "moves": len(lengths), "launches": launches}
    figures.update({f"{name}_seconds": seconds.get(name, 0.0) for _, name in also})
    if recording is not None:
        figures["driver_calls"] = dict(Counter(call[0] for call in made))
    return figures, lengths


def _memcpy(lengths):
    """Seconds of cuMemcpyDtoD moving ``lengths`` bytes one call each
    (queued, then waited for), and of one call of them all."""
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    import numba_alloc
    total = sum(lengths)
    src, dst = cuda.device_array(total, np.uint8), cuda.device_array(total, np.uint8)
    s, d = src.device_ctypes_pointer.value, dst.device_ctypes_pointer.value
    cuda.synchronize()
    start = time.perf_counter()
    offset = 0
    for n in lengths:
        driver.cuMemcpyDtoD(d + offset, s + offset, n)
        offset += n
    cuda.synchronize()
    each = time.perf_counter() - start
    start = time.perf_counter()
    driver.cuMemcpyDtoD(d, s, total)
    cuda.synchronize()
    once = time.perf_counter() - start
    del src, dst
    numba_alloc.empty_cache()
    return {"memcpy_seconds": each, "memcpy_one_call_seconds": once}


# section 4's layout: arrays of 1-8 MiB (so they share 20 MiB segments),
# every other one dropped: a compaction packs the half-empty segments. (Of
# 400 arrays of 1-64 MiB, as until 2026-11-30, most had segments of their
# own: the compaction, planned right, moves 2% of the live bytes.)
ARRAYS, SMALLEST, LARGEST = 4000, MiB, 8 * MiB


def gpu_compaction(repeat, arrays=ARRAYS, smallest=SMALLEST, largest=LARGEST):
    """A full compaction with numba_alloc as Numba's memory manager:
    ``arrays`` arrays of ``smallest`` to ``largest`` bytes, every other one
    dropped, then numba_alloc.defragment(), and the same with
    release=False ("kept_" figures: the emptied segments stay cached),
    against cuMemcpyDtoD of the same moves (wall time, the three
    alternating in order); one dict a repetition."""
    import numpy as np

    import numba_alloc
    with numba_alloc.device_pool() as pool:
        backend = pool.backend
    sizes = np.random.default_rng(0).integers(smallest, largest, arrays)
    figures, lengths = [], None
    for r in range(repeat):
        row = {}
        for which in (("defrag", "kept", "memcpy") if r % 2 == 0 or lengths is None
                      else ("memcpy", "kept", "defrag")):
            if which == "defrag":
                figures_of_run, lengths = _defragment(backend, sizes)
                row.update(figures_of_run)
            elif which == "kept":
                kept, _ = _defragment(backend, sizes, release=False)
                row.update({f"kept_{name}": value for name, value in kept.items()})
            else:
                row.update(_memcpy(lengths))
        figures.append(row)
    return figures


def standin_compaction(repeat, scale):
    """Section 4's compaction over the driver stand-in (tests/standin), its
    arrays ``scale`` times as large: one dict of _defragment's figures a
    repetition, after one untimed, with "run_seconds" (the stand-in
    running the copy kernels on the CPU, inside the copies),
    "_move_records_seconds" (the blocks' records and Numba's arrays
    following: between starting the copies and waiting for them, which a
    GPU runs meanwhile), "before_start_seconds" (from the call to the
    first start_copies) and "driver_calls"."""
    import numpy as np
    import standin
    from standin.kernels import LaunchPlan

    import numba_alloc
    from numba_alloc.policy import moves
    numba_alloc.install()
    with numba_alloc.device_pool() as pool:
        backend = pool.backend
    sizes = (np.random.default_rng(0).integers(SMALLEST, LARGEST, ARRAYS) * scale
             ).astype(np.int64)
    runs = [_defragment(backend, sizes, [(LaunchPlan, "run"), (moves, "_move_records")],
                        standin.installed().recording)[0]
            for _ in range(repeat + 1)]
    return runs[1:]


def print_standin_compaction(runs, scale):
    """The host's share of defragment() over the stand-in: medians."""
    def median(key):
        return statistics.median(run[key] for run in runs)

    first = runs[0]
    host = median("seconds") - median("run_seconds")
    copies = median("copy_seconds") - median("run_seconds")
    print(f"4. Full compaction over the driver stand-in (arrays {scale}x section 4's; median of "
          f"{len(runs)}): {first['bytes_moved'] / MiB:,.0f} MiB in {first['moves']} moves, "
          f"{first['launches']} launches, {first['releases']} emptied segments released")
    print(f"   the host's work: {host * 1e3:.1f} ms, {host / first['moves'] * 1e6:.0f} us a move "
          f"(the copies' {copies * 1e3:.1f} ms, the releases' {median('release_seconds') * 1e3:.1f}"
          f" ms, the rest {(host - copies - median('release_seconds')) * 1e3:.1f} ms); the "
          f"stand-in's copy kernels, on the CPU, {median('run_seconds') * 1e3:.0f} ms left out")
    records = median("_move_records_seconds")
    print(f"   of the rest, the records following the moves while a GPU would copy: "
          f"{records * 1e3:.1f} ms; the planning before them and the rest: "
          f"{(host - copies - median('release_seconds') - records) * 1e3:.1f} ms")
    print(f"   the host's work before the copies start (a GPU's idle time): "
          f"{median('before_start_seconds') * 1e3:.1f} ms")
    print("   driver calls: " + ", ".join(f"{name} {n}" for name, n in sorted(
        first["driver_calls"].items(), key=lambda item: -item[1])))
    print("   (the stand-in's driver is Python: its calls cost what a GPU's do not, and a "
          "GPU's cuMemFree costs what its does not)")


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
    parser.add_argument("--chunks-per-block", type=int, nargs="+", metavar="K", default=[],
                        help="only the copy bandwidth (section 3), once for each number of "
                             "chunks a launch is cut into per block the GPU holds at once "
                             "(kernels.CHUNKS_PER_BLOCK)")
    parser.add_argument("--one-block-a-chunk", type=int, nargs="+", metavar="N", default=[],
                        help="with or instead of --chunks-per-block: launches of N chunks "
                             "and a block each (as measured on the H200 on 2026-11-30: N = 1024)")
    parser.add_argument("--standin", action="store_true",
                        help="only section 4, over the driver stand-in: the host's work")
    parser.add_argument("--scale", type=float, default=0.25,
                        help="--standin: the arrays' sizes against section 4's")
    args = parser.parse_args()
    if args.standin:
        return main_standin(args)
    if args.chunks_per_block or args.one_block_a_chunk:
        sweep_launches(args)
        return
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
                        ("ratio", "large / small"),
                        ("free", f"{n['free']:,} blocks, free segments")):
        value = scaling[name]
        goal = SCALING_GOALS.get(name) if goals else None
        shown = f"{value:.2f}x" if name == "ratio" else f"{value:.3f} s"
        print(f"   {label:<34} {shown:>10}" + (
            f"   goal < {goal}{'x' if name == 'ratio' else ' s'}: "
            f"{'met' if value < goal else 'NOT met'}" if goal else ""))

    facts = kernel_facts()
    result["kernel_facts"] = facts
    save(result, args.out)
    print_kernel_facts(facts)

    from numba import cuda
    if cuda.config.ENABLE_CUDASIM or not cuda.is_available():
        print("3. Copy bandwidth on a GPU: skipped (no CUDA GPU here)")
        print("4. Compaction on a GPU: skipped (no CUDA GPU here)")
    else:
        import numba_alloc
        numba_alloc.install()
        device = cuda.get_current_device()
        result["gpu"] = str(device.name)
        bandwidth = gpu_bandwidth(list(BANDWIDTH_GOALS), args.repeat)
        result["bandwidth_GBps"] = bandwidth
        save(result, args.out)
        print_bandwidth(device.name, bandwidth, args.repeat)
        compaction = gpu_compaction(max(1, args.repeat // 2))
        result["compaction"] = compaction
        save(result, args.out)
        print_compaction(compaction)
    save(result, args.out)


def sweep_launches(args):
    """Section 3 alone, for each way of cutting a launch that ``args``
    names (a GPU's)."""
    from numba import cuda
    import numba_alloc
    numba_alloc.install()
    name = cuda.get_current_device().name
    result = {"date": time.strftime("%Y-%m-%d"), "gpu": str(name), "versions": versions(),
              "sweep": {}}
    layouts = ([(f"{n} chunks, a block each", {"one_block_a_chunk": n})
                for n in args.one_block_a_chunk]
               + [(f"{k} chunks per resident block", {"chunks_per_block": k})
                  for k in args.chunks_per_block])
    for label, layout in layouts:
        bandwidth = gpu_bandwidth(list(BANDWIDTH_GOALS), args.repeat, **layout)
        result["sweep"][label] = bandwidth
        save(result, args.out)
        print(f"{label}:")
        print_bandwidth(name, bandwidth, args.repeat)


def main_standin(args):
    """Section 4 over the driver stand-in, in a process of its own (the
    stand-in goes in before CUDA is first used)."""
    import subprocess
    import sys

    from bench_malloc import standin_env
    if os.environ.get("NUMBA_ALLOC_STANDIN") != "1":
        proc = subprocess.run([sys.executable, *sys.argv], env=standin_env())
        return proc.returncode
    import numba_alloc
    runs = standin_compaction(max(1, args.repeat), args.scale)
    result = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
              "versions": versions(), "host": host_line(), "standin_scale": args.scale,
              "numba_alloc": os.path.dirname(numba_alloc.__file__), "standin_compaction": runs}
    save(result, args.out)
    print(result["host"])
    print(f"numba_alloc from {result['numba_alloc']}")
    print_standin_compaction(runs, args.scale)
    return 0


def print_kernel_facts(facts):
    print("2. The copy kernel, checked without a GPU:")
    ptx = facts["ptx"]
    if "error" in ptx:
        print(f"   PTX: not compiled ({ptx['error']})")
    else:
        accesses, loop = ptx["global"], ptx["widest_loop"]
        widths = sorted({int(b) for b in accesses["loads"]} | {int(b) for b in accesses["stores"]})
        print(f"   PTX (sm_90): global loads and stores of {', '.join(map(str, widths))} bits; "
              f"the aligned path {128 if loop else 'no'}-bit "
              f"({accesses['loads'].get(128, 0)} load and {accesses['stores'].get(128, 0)} "
              f"store sites); global atomic sites: {accesses['atomics']}")
        if loop:
            print(f"   its widest loop: {loop['loads_before_store']} loads in flight a thread "
                  f"before its stores, {loop['instructions']} instructions for "
                  f"{16 * loop['loads']} bytes ({loop['per_16_bytes']:.1f} per 16 bytes)")
    sim = facts["simulator"]
    most = sim["most_atomics_per_block"]
    print(f"   CUDA simulator: {sim['moves']} moves ({sim['bytes']:,} bytes) in "
          f"{sim['blocks_that_copied']} thread blocks: {sim['atomics']} global atomics, at most "
          f"{most} a block (goal at most 1: {'met' if most <= 1 else 'NOT met'}); "
          f"bytes and counters {'right' if sim['right'] else 'WRONG'}")


def print_bandwidth(name, bandwidth, repeat):
    print(f"3. Copy bandwidth on {name} (GB/s, read + write, median of {repeat}, the kernel "
          "and cuMemcpyDtoD alternating); device: behind a memset, the host's launch work "
          "hidden; idle: issued to an idle GPU, launch work included:")
    print(f"{'bytes':>12} {'kernel':>8} {'memcpy':>8} {'ratio':>7} {'goal':>12}"
          f" {'idle: kernel':>13} {'memcpy':>8} {'ratio':>7}")
    for n, row in bandwidth.items():
        device, idle = row["device"], row["idle"]
        ratio, idle_ratio = device["kernel"] / device["memcpy"], idle["kernel"] / idle["memcpy"]
        goal = BANDWIDTH_GOALS.get(n)
        shown = f">= {goal}x {'met' if ratio >= goal else 'NOT'}" if goal else ""
        hidden = "" if device["hidden"] == 1 else f"  (launch hidden in {device['hidden']:.0%})"
        hidden += "" if row["right"] else "  THE KERNEL'S COPY WAS WRONG"
        print(f"{n:>12} {device['kernel']:>8.1f} {device['memcpy']:>8.1f} {ratio:>6.2f}x "
              f"{shown:>12} {idle['kernel']:>13.1f} {idle['memcpy']:>8.1f} "
              f"{idle_ratio:>6.2f}x  ({row['blocks']} blocks, {row['chunks']} chunks){hidden}")


def _rest(figures):
    """Seconds of a defragment() outside its copies and releases."""
    return figures["seconds"] - figures["copy_seconds"] - figures["release_seconds"]


def print_compaction(compaction):
    best = min(compaction, key=lambda c: c["seconds"])
    memcpy = min(c["memcpy_seconds"] for c in compaction)
    ratio = best["seconds"] / memcpy
    print(f"4. Full compaction, numba_alloc.defragment() (best of {len(compaction)}; "
          f"{best['bytes_moved'] / MiB:,.0f} MiB in {best['moves']} moves, "
          f"{best['launches']} launches): {best['seconds'] * 1e3:.1f} ms, of which copying "
          f"{best['copy_seconds'] * 1e3:.1f} ms and releasing {best['releases']} emptied "
          f"segments (cuMemFree) {best['release_seconds'] * 1e3:.1f} ms; the rest "
          f"{_rest(best) * 1e3:.1f} ms (before its copies start "
          f"{best.get('before_start_seconds', 0.0) * 1e3:.1f} ms); cuMemcpyDtoD of the same moves "
          f"{memcpy * 1e3:.1f} ms (one call of all the bytes "
          f"{min(c['memcpy_one_call_seconds'] for c in compaction) * 1e3:.1f} ms)")
    print(f"   defragment() / cuMemcpyDtoD {ratio:.2f}x (goal <= {COMPACTION_GOAL}x: "
          f"{'met' if ratio <= COMPACTION_GOAL else 'NOT met'}); its copies / cuMemcpyDtoD "
          f"{best['copy_seconds'] / memcpy:.2f}x")
    kept = min(c["kept_seconds"] for c in compaction)
    print(f"   defragment(release=False), the emptied segments kept cached: "
          f"{kept * 1e3:.1f} ms, / cuMemcpyDtoD {kept / memcpy:.2f}x (goal <= {COMPACTION_GOAL}x: "
          f"{'met' if kept / memcpy <= COMPACTION_GOAL else 'NOT met'})")


if __name__ == "__main__":
    raise SystemExit(main())
