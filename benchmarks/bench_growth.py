"""What growing and giving memory back cost on the device, with whole
segments (cuMemAlloc, cuMemFree) and with expandable_segments (2 MiB pages:
cuMemAddressReserve once, then cuMemCreate and cuMemMap per page, cuMemUnmap
and cuMemRelease per page), side by side from one run.

A pool of its own over the current GPU (CudaDevice), each mode in a fresh
pool, in alternating rounds: ``grow`` allocates 16 blocks of 64 MiB and 200
of 3 MiB (1.6 GiB in all), every one a request that grows the pool; ``give
back`` frees them all and empties the cache. Then ``move``: 128 MiB of
mapped pages moved to other addresses, by remapping them (what
defragmentation does to a run of pages, remap_pages) against copying their
bytes into pages mapped there (cuMemcpyDtoD: what moving costs without
it). It prints the milliseconds of each phase (median of the rounds), the
ratios expandable / whole segments and remap / copy, and the driver calls
of one round of each where they can be counted (over the driver stand-in,
which records them; there the times are the stand-in's Python and mean
nothing).

    python benchmarks/bench_growth.py [--out DIR] [--rounds N] [--standin]

The question it answers: what mapping pages one at a time costs a GPU
against reserving whole segments, before expandable_segments can be a
default there (PyTorch maps 20 MiB at a time in its large pool).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_malloc import gpu_info, save, save_report, standin_env, versions  # noqa: E402

MiB = 1 << 20
BLOCKS = [64 * MiB] * 16 + [3 * MiB] * 200
MODES = {"segments": False, "expandable": True}
MOVED = 128 * MiB


def one_round(expandable, recorder=None):
    """Milliseconds of growing and of giving back, in a fresh pool; with
    ``recorder`` (a context manager yielding the calls made), the driver
    calls of each phase by name."""
    import contextlib

    from numba import cuda

    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice
    backend = CudaDevice(cuda.current_context())
    pool = Pool(backend, expandable_segments=expandable, keep_whole_segments=False)
    record = recorder or contextlib.nullcontext
    figures, calls = {}, {}
    try:
        with record() as made:
            start = time.perf_counter()
            blocks = [pool.malloc(n) for n in BLOCKS]
            figures["grow_ms"] = 1e3 * (time.perf_counter() - start)
        calls["grow"] = _count(made)
        reserved = pool.stats.current("reserved_bytes")
        with record() as made:
            start = time.perf_counter()
            for block in blocks:
                pool.free(block)
            pool.synchronize()
            pool.empty_cache()
            figures["give_back_ms"] = 1e3 * (time.perf_counter() - start)
        calls["give_back"] = _count(made)
        figures["reserved_mib"] = reserved / MiB
        figures["left_mib"] = pool.stats.current("reserved_bytes") / MiB
    finally:
        pool.reset()
        backend.close()
    return figures, calls


def move_round(recorder=None):
    """Milliseconds of moving MOVED bytes of mapped pages to other
    addresses of their range: by remapping them, and by copying them into
    pages mapped there (and waiting for the copy); with ``recorder``, the
    driver calls of each by name. Bytes checked after each."""
    import contextlib

    import numpy as np
    from numba import cuda

    from numba_alloc.backends.cuda_device import CudaDevice
    backend = CudaDevice(cuda.current_context())
    record = recorder or contextlib.nullcontext
    base = backend.reserve_addresses(3 * MOVED)
    figures, calls, mapped = {}, {}, []
    data = np.arange(MOVED // 4, dtype=np.uint32)
    try:
        backend.map_pages(base, MOVED)
        mapped.append(base)
        backend._array(base, data.shape, np.uint32).copy_to_device(data)
        with record() as made:
            start = time.perf_counter()
            backend.remap_pages(base, MOVED, base + 2 * MOVED)
            figures["remap_ms"] = 1e3 * (time.perf_counter() - start)
        mapped[0] = base + 2 * MOVED
        calls["remap"] = _count(made)
        source = backend._array(base + 2 * MOVED, data.shape, np.uint32)
        backend.map_pages(base, MOVED)
        mapped.append(base)
        target = backend._array(base, data.shape, np.uint32)
        with record() as made:
            start = time.perf_counter()
            target.copy_to_device(source)
            cuda.synchronize()
            figures["copy_ms"] = 1e3 * (time.perf_counter() - start)
        calls["copy"] = _count(made)
        if not ((source.copy_to_host() == data).all() and (target.copy_to_host() == data).all()):
            raise AssertionError("the bytes moved are wrong")
    finally:
        for address in mapped:
            backend.unmap_pages(address, MOVED)
        backend.free_addresses(base)
        backend.close()
    return figures, calls


def _count(made):
    if made is None:
        return None
    counted = {}
    for call in made:
        if call.name.startswith(("cuMem", "cuCtxSynchronize")):
            counted[call.name] = counted.get(call.name, 0) + 1
    return counted


def measure(rounds):
    """Per mode: the rounds' figures, and one round's driver calls (over the
    stand-in; None on a GPU)."""
    recorder = None
    try:
        import standin
        installed = standin.installed()
        if installed is not None:
            recorder = installed.recording
    except ImportError:
        pass
    runs = {mode: [] for mode in MODES}
    calls = {}
    for mode, expandable in MODES.items():      # warm-up, and the calls of one round
        _, calls[mode] = one_round(expandable, recorder)
    _, calls["move"] = move_round(recorder)
    moves = []
    for _ in range(rounds):
        for mode, expandable in MODES.items():
            runs[mode].append(one_round(expandable)[0])
        moves.append(move_round()[0])
    return {"runs": runs, "moves": moves, "calls": calls if recorder else None,
            "standin": recorder is not None}


def report(result, where):
    lines = [f"growing a pool by {len(BLOCKS)} blocks ({sum(BLOCKS) / MiB:.0f} MiB) and giving "
             f"it back, {where}; median of {len(result['runs']['segments'])} rounds:"]
    medians = {mode: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
               for mode, runs in result["runs"].items()}
    for phase in ("grow_ms", "give_back_ms"):
        seg, exp = medians["segments"][phase], medians["expandable"][phase]
        lines.append(f"  {phase[:-3]:<10} whole segments {seg:9.2f} ms   expandable "
                     f"{exp:9.2f} ms   expandable / whole: {exp / seg:6.2f}x")
    for mode in MODES:
        lines.append(f"  {mode}: {medians[mode]['reserved_mib']:.0f} MiB reserved, "
                     f"{medians[mode]['left_mib']:.0f} MiB left after empty_cache")
    remap = statistics.median(m["remap_ms"] for m in result["moves"])
    copy = statistics.median(m["copy_ms"] for m in result["moves"])
    lines.append(f"  moving {MOVED // MiB} MiB of pages: remapped {remap:9.2f} ms   copied "
                 f"{copy:9.2f} ms   remap / copy: {remap / copy:6.2f}x")
    if result["calls"]:
        for mode, phases in result["calls"].items():
            lines.append(f"  driver calls, {mode}: " + "; ".join(
                f"{phase}: " + ", ".join(f"{n} {name}" for name, n in sorted(counted.items()))
                for phase, counted in phases.items()))
    if result["standin"]:
        lines.append("  (over the driver stand-in: the times are its Python; the calls are "
                     "what a GPU would get)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--standin", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.rounds)))
        return 0
    gpu = None if args.standin else gpu_info()
    env = os.environ.copy() if gpu else standin_env()
    proc = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    result = json.loads(proc.stdout.splitlines()[-1])
    where = f"on {gpu['gpu']}" if gpu else "over the driver stand-in"
    text = report(result, where)
    print(text)
    save({"versions": versions(), "gpu": gpu, "rounds": args.rounds, **result}, args.out)
    save_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
