"""NRT's np.empty inside kernels served by the pool's heap (the
nrt_heap_size setting) against CUDA's device malloc heap, side by side from
one run, with the goals of issue 39 beside the figures.

* ``sums``: each of 10^6 threads makes an ``np.empty(8, np.float64)``,
  fills it and writes its sum: one NRT allocation and one free a thread.
  Milliseconds a launch (CUDA events, the median of the launches after a
  warm-up one), NRT on the pool's heap (``nrt_heap_size:2GiB``) against
  NRT on CUDA's (``malloc_heap_size:3GiB``, so that it has the room), each
  side in a process of its own (the setting is fixed before the first
  kernel), alternating which goes first over the rounds. Goal: 100x.
* ``live``: 1 GiB of small arrays live at once inside one kernel: as many
  blocks as can be resident together (the cooperative launch bound), each
  thread four int64 arrays sized so that their data add up to 1 GiB, every
  thread waiting (a bounded spin on a counter) until all have theirs, then
  checking them. On the pool's heap (nrt_heap_size:2GiB within a limit of
  8 GiB): every thread done, the heap's peak at least 1 GiB; on CUDA's heap
  at its 8 MiB default the threads whose allocation failed (NRT's
  MemoryError ends them) are counted; with malloc_heap_size:3GiB CUDA's heap
  holds it too (the sums' side).
* ``counters``: after the pool's side of ``sums`` and ``live``,
  memory_stats()'s ``nrt.*`` against what the kernels did: allocations and
  frees equal to the threads' arrays, nothing in use, nothing failed.

    python benchmarks/bench_nrt_heap.py [--out DIR] [--rounds 3] [--threads N]

Without a GPU it says so and measures nothing. ``--child SIDE --parts
sums live`` runs one side (``pool``, ``cuda``, ``cuda-default``) and prints
its JSON line; ``--tiny --lto`` runs at a size the driver stand-in takes
(its kernels run as Python: tests/test_nrt_link.py), where the figures
mean nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_malloc import gpu_info, save, save_report, versions  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
THREADS = 1_000_000
ITEMS = 8               # float64 items of each thread's np.empty in sums
LAUNCHES = 5
ROUNDS = 3
LIVE_BYTES = GiB
ARRAYS = 4              # arrays a thread holds at once in live
SPINS = 200_000         # 1 us each: how long a thread waits for the others in live
MEMINFO, ALIGN = 40, 32     # what NRT adds to an array's bytes: its MemInfo, twice the alignment
GOAL = 100.0
SIDES = {   # NUMBA_ALLOC_CONF of each side
    "pool": "nrt_heap_size:2GiB,limit:8GiB",      # NRT on the pool's heap
    "cuda": "malloc_heap_size:3GiB",              # NRT on CUDA's heap, given room
    "cuda-default": "",                           # NRT on CUDA's heap at its 8 MiB
}


def kernels(lto):
    from numba import cuda

    @cuda.jit(lto=lto)
    def sums(out, items):
        i = cuda.grid(1)
        if i < out.size:
            x = np.empty(items, np.float64)
            for j in range(items):
                x[j] = i + j
            out[i] = x.sum()

    @cuda.jit(lto=lto)
    def live(items, arrived, done, wrong, spins):
        i = cuda.grid(1)
        total = cuda.gridsize(1)
        a = np.empty(items, np.int64)
        b = np.empty(items, np.int64)
        c = np.empty(items, np.int64)
        d = np.empty(items, np.int64)
        for j in range(items):
            a[j] = i
            b[j] = i + 1
            c[j] = i + 2
            d[j] = i + 3
        cuda.atomic.add(arrived, 0, 1)
        waited = 0
        while cuda.atomic.add(arrived, 0, 0) < total and waited < spins:
            cuda.nanosleep(1000)
            waited += 1
        bad = 0
        for j in range(items):
            if a[j] != i or b[j] != i + 1 or c[j] != i + 2 or d[j] != i + 3:
                bad += 1
        if bad:
            cuda.atomic.add(wrong, 0, 1)
        cuda.atomic.add(done, 0, 1)

    return sums, live


def run_sums(sums, threads, items, launches):
    """(ms per launch, each; whether every sum was right)."""
    from numba import cuda
    out = cuda.device_array(threads, np.float64)
    grid = (-(-threads // 256), 256)
    sums[grid](out, items)                          # compiled, linked, loaded; warm
    cuda.synchronize()
    times = []
    for _ in range(launches):
        start, end = cuda.event(), cuda.event()
        start.record()
        sums[grid](out, items)
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    i = np.arange(threads, dtype=np.float64)
    right = bool(np.array_equal(out.copy_to_host(), items * i + items * (items - 1) / 2))
    return times, right


def run_live(live, live_bytes, spins, tiny):
    """The live kernel at its resident size: what it did."""
    from numba import cuda
    block = 256
    arrived, done, wrong = (cuda.to_device(np.zeros(1, np.int64)) for _ in range(3))
    kernel = live.compile("void(int64, int64[::1], int64[::1], int64[::1], int64)")
    blocks = 1 if tiny else kernel.max_cooperative_grid_blocks(block)
    threads = blocks * block
    items = -(-live_bytes // (threads * ARRAYS * 8))        # at least live_bytes of data
    live[blocks, block](items, arrived, done, wrong, spins)
    cuda.synchronize()
    return {"threads": threads, "items": items, "arrays": ARRAYS,
            "data_bytes": threads * ARRAYS * items * 8,
            "nrt_bytes": threads * ARRAYS * (items * 8 + MEMINFO + 2 * ALIGN),
            "arrived": int(arrived.copy_to_host()[0]), "done": int(done.copy_to_host()[0]),
            "wrong": int(wrong.copy_to_host()[0])}


def child(side, threads, launches, lto, tiny, parts):
    """One side's figures (a process with its settings from NUMBA_ALLOC_CONF):
    ``parts``, of "sums" and "live"."""
    import numba_alloc
    from numba import cuda
    numba_alloc.install()
    sums, live = kernels(lto)
    result = {"side": side, "settings": os.environ.get("NUMBA_ALLOC_CONF", "")}
    if "sums" in parts:
        times, right = run_sums(sums, threads, ITEMS, launches)
        result["sums"] = {"threads": threads, "items": ITEMS, "ms": times, "right": right}
    if "live" in parts:
        result["live"] = run_live(live, 4096 if tiny else LIVE_BYTES, 10 if tiny else SPINS,
                                  tiny)
    cuda.synchronize()
    result["nrt"] = {k: v for k, v in numba_alloc.memory_stats().items() if k.startswith("nrt.")}
    return result


def spawn(side, parts, args):
    """A child process's figures for ``side`` (its JSON line), or its error."""
    env = {**os.environ, "NUMBA_CUDA_MEMORY_MANAGER": "numba_alloc",
           "NUMBA_CUDA_ENABLE_NRT": "1", "NUMBA_ALLOC_CONF": SIDES[side]}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--parts", *parts,
           "--threads", str(args.threads), "--launches", str(args.launches)]
    cmd += ["--lto"] * args.lto + ["--tiny"] * args.tiny
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"side": side, "error": (proc.stdout + proc.stderr)[-3000:]}
    return json.loads(proc.stdout.splitlines()[-1])


def summarize(runs):
    """The figures of every child, by side: the median ms a launch of sums
    (over every round's launches), the ratio, the live runs, the counters
    checked against what the kernels did."""
    def launches(side):
        return [t for r in runs if r.get("side") == side and "sums" in r
                for t in r["sums"]["ms"]]
    pool, cuda = launches("pool"), launches("cuda")
    summary = {"errors": [r for r in runs if "error" in r]}
    if pool and cuda:
        summary["sums"] = {"threads": next(r["sums"]["threads"] for r in runs if "sums" in r),
                           "pool_ms": statistics.median(pool), "cuda_ms": statistics.median(cuda),
                           "ratio": statistics.median(cuda) / statistics.median(pool),
                           "goal": GOAL,
                           "right": all(r["sums"]["right"] for r in runs if "sums" in r)}
        summary["sums"]["met"] = summary["sums"]["ratio"] >= GOAL
    summary["live"] = {r["side"]: r["live"] for r in runs if "live" in r}
    checked = [r for r in runs if r.get("side") == "pool" and "live" in r and "sums" in r]
    if checked:
        r = checked[0]
        arrays = r["live"]["done"] * ARRAYS + r["sums"]["threads"] * (len(r["sums"]["ms"]) + 1)
        nrt = r["nrt"]
        summary["counters"] = {"expected_allocs": arrays, **nrt,
                               "exact": nrt["nrt.num_allocs"] == nrt["nrt.num_frees"] == arrays
                               and nrt["nrt.bytes_in_use"] == 0 and nrt["nrt.num_failed"] == 0}
    return summary


def report(summary, info):
    lines = [f"NRT's np.empty on the pool's heap against CUDA's heap ({info})", ""]
    s = summary.get("sums")
    if s:
        lines += ["| kernel | pool's heap | CUDA's heap | ratio | goal |", "| --- | --- | --- | --- | --- |",
                  f"| {s['threads']:,} threads, np.empty({ITEMS}) each, filled and summed | "
                  f"{s['pool_ms']:.3f} ms | "
                  f"{s['cuda_ms']:.3f} ms | {s['ratio']:.1f}x | {s['goal']:.0f}x "
                  f"({'met' if s['met'] else 'not met'}; sums {'right' if s['right'] else 'WRONG'}) |",
                  ""]
    for side, live in summary["live"].items():
        lines.append(f"live, {side}: {live['done']} of {live['threads']} threads done "
                     f"({live['wrong']} wrong), {live['arrived']} arrived together, "
                     f"{live['data_bytes'] / GiB:.2f} GiB of arrays "
                     f"({live['nrt_bytes'] / GiB:.2f} GiB asked of NRT's allocator)")
    c = summary.get("counters")
    if c:
        lines += ["", f"counters after the pool's kernels: {c['nrt.num_allocs']} allocations and "
                  f"{c['nrt.num_frees']} frees for {c['expected_allocs']} arrays, "
                  f"{c['nrt.bytes_in_use']} bytes in use, {c['nrt.num_failed']} failed, peak "
                  f"{c['nrt.peak_bytes_in_use'] / GiB:.2f} GiB: "
                  f"{'exact' if c['exact'] else 'NOT exact'}"]
    for e in summary["errors"]:
        lines += ["", f"{e['side']} failed:", e["error"]]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--launches", type=int, default=LAUNCHES)
    parser.add_argument("--child", choices=sorted(SIDES))
    parser.add_argument("--parts", nargs="+", choices=("sums", "live"), default=("sums",))
    parser.add_argument("--lto", action="store_true", help="compile the kernels with lto=True")
    parser.add_argument("--tiny", action="store_true", help="the stand-in's size")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.threads, args.launches, args.lto, args.tiny,
                               args.parts)))
        return 0
    info = gpu_info()
    if info is None and not args.tiny:
        print("bench_nrt_heap.py needs a GPU (or --tiny over the driver stand-in): nothing "
              "measured")
        return 0
    runs = []
    for r in range(args.rounds):
        parts = ("sums", "live") if r == 0 else ("sums",)
        for side in (("pool", "cuda") if r % 2 == 0 else ("cuda", "pool")):
            runs.append(spawn(side, parts, args))
            save({"runs": runs}, args.out)          # what finished, should the step be cut
    runs.append(spawn("cuda-default", ("live",), args))
    summary = summarize(runs)
    text = report(summary, f"{info['gpu']}, driver {info['driver']}" if info else "no GPU")
    print(text)
    save({"versions": versions(), "gpu": info, "runs": runs, "summary": summary}, args.out)
    save_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
