"""Reclaim on a GPU, side by side from one run: its copies' bandwidth
against pinned copies, and Numba arrays under the plugin.

First the copies (``blocks``): for blocks of 4 MiB, 64 MiB and 256 MiB (about
512 MiB of them per size, filled with a pattern), a Pool over the device
(CudaDevice, reclaim on) reclaims them all to host memory and brings them
all back, five rounds; each way, the bytes over the wall time (the host
waits for the copies), the first round apart (its chunks of pinned memory
are allocated then; later rounds reuse them from the host cache), against
the same bytes copied with plain asynchronous copies between a device
buffer and one pinned buffer of the block's size, measured in the same
rounds, alternating; beside the goal, 0.7x; every byte checked at the end.

Then a layer loop over uint32 arrays of 64 MiB whose bytes total about 1x (all
fit), 1.5x and 3x the pool's limit (1 GiB by default): each step launches
one kernel that reads layer i and updates layer i+1 (forward in order, then
backward, as a model's layers are used), twice over; every array is checked
against the values tracked on the host at the end. Each ratio runs in a
process of its own (``NUMBA_ALLOC_CONF=reclaim:true,limit:...``). For each:
milliseconds per step, MiB moved to host and back per step, and the reclaim
copies' effective bandwidth: the bytes moved over the time beyond the
fitting run's per-step time; against the pinned-memory copy peak measured in
the same run (256 MiB pinned buffers, each way). Then the hooks' cost per
launch (numba_alloc.plugin.activity): a small kernel over three resident arrays,
reclaim on against off (the hooks are installed only with it on).

    python benchmarks/bench_reclaim_gpu.py [--out DIR] [--limit-mib N]
        [--blocks-mib 4,64,256] [--blocks-total-mib 512] [--chunk-mib N,...]

``--chunk-mib`` measures the copies with other chunk sizes too
(numba_alloc.policy.host_copies.CHUNK). Without a GPU it says so and
measures nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_malloc import gpu_info, save, save_report, versions  # noqa: E402

MiB = 1 << 20
ARRAY = 64 * MiB
RATIOS = (1.0, 1.5, 3.0)
PASSES = 2
LAUNCHES = 5000
MASK = (1 << 32) - 1
BLOCK_SIZES = (4 * MiB, 64 * MiB, 256 * MiB)
ROUNDS = 5
GOAL = 0.7              # reclaim and bring-back against pinned copies, 4 MiB blocks and up


def layer_step(x, y):
    """Layer ``y`` takes ``x``: y[j] += x[j] + 1 (uint32, wrapping)."""
    for j in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        y[j] = y[j] + x[j] + np.uint32(1)


def add(a, b, c):
    """c = a + b, one element per thread."""
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


# the kernels with the signatures of their launches (tests/ptx_kernels.py
# compiles them for sm_90 in CI)
PTX_KERNELS = [(layer_step, "void(uint32[::1], uint32[::1])"),
               (add, "void(float32[::1], float32[::1], float32[::1])")]


def layer_count(ratio, limit):
    """Arrays of ARRAY bytes for ``ratio`` times ``limit``; at 1x, one fewer
    than fill the limit, so that everything fits."""
    if ratio == 1.0:
        return max(2, limit // ARRAY - 1)
    return max(2, int(ratio * limit) // ARRAY)


def _layers(ratio, limit):
    """One ratio's figures, in a process whose pool has ``limit``."""
    import numba_alloc
    step = cuda.jit(layer_step)
    n = layer_count(ratio, limit)
    words = ARRAY // 4
    arrays = [cuda.to_device(np.full(words, i, np.uint32)) for i in range(n)]
    values = list(range(n))
    order = [(i, i + 1) for i in range(n - 1)] + [(i + 1, i) for i in reversed(range(n - 1))]
    step[1024, 256](arrays[0], arrays[1])           # compiled before the clock starts
    values[1] = (values[1] + values[0] + 1) & MASK
    cuda.synchronize()
    with numba_alloc.device_pool() as pool:
        before = pool.memory_stats()
    start = time.perf_counter()
    for _ in range(PASSES):
        for x, y in order:
            step[1024, 256](arrays[x], arrays[y])
            values[y] = (values[y] + values[x] + 1) & MASK
    cuda.synchronize()
    elapsed = time.perf_counter() - start
    with numba_alloc.device_pool() as pool:
        after = pool.memory_stats()
    wrong = [i for i, a in enumerate(arrays) if not (a.copy_to_host() == values[i]).all()]
    steps = PASSES * len(order)
    return {"ratio": ratio, "arrays": n, "live_bytes": n * ARRAY, "limit": limit,
            "steps": steps, "ms_per_step": 1e3 * elapsed / steps,
            "to_host_bytes": after["reclaimed_bytes.allocated"] - before["reclaimed_bytes.allocated"],
            "back_bytes": after["reclaimed_bytes.freed"] - before["reclaimed_bytes.freed"],
            "single_reclaims": after["num_single_reclaims"] - before["num_single_reclaims"],
            "full_reclaims": after["num_full_reclaims"] - before["num_full_reclaims"],
            "wrong_arrays": wrong}


def _peak():
    """Pinned-memory copy bandwidth, bytes per second, each way (median of 5)."""
    nbytes = 256 * MiB
    host = cuda.pinned_array(nbytes, np.uint8)
    device = cuda.device_array(nbytes, np.uint8)
    figures = {}
    for way, copy in (("to_device", lambda: device.copy_to_device(host)),
                      ("to_host", lambda: device.copy_to_host(host))):
        copy()
        times = []
        for _ in range(5):
            cuda.synchronize()
            start = time.perf_counter()
            copy()
            cuda.synchronize()
            times.append(time.perf_counter() - start)
        figures[way] = nbytes / statistics.median(times)
    return figures


def _timed(action, synchronize):
    """Seconds ``action()`` takes, the device idle before and after."""
    synchronize()
    start = time.perf_counter()
    action()
    synchronize()
    return time.perf_counter() - start


def _blocks(size, total):
    """Seconds per round of reclaiming and bringing back ``total // size``
    blocks of ``size`` bytes with a Pool over this device, and of the same
    copies between a device buffer and one pinned buffer; whether every
    byte came back."""
    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice
    from numba_alloc.policy import host_copies, reclaim
    backend = CudaDevice(cuda.current_context())
    pool = Pool(backend, reclaim=True)
    count = max(1, total // size)
    blocks = [pool.malloc(size) for _ in range(count)]
    pattern = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    for i, block in enumerate(blocks):
        backend._array(block.address, (size,), np.uint8).copy_to_device(pattern ^ np.uint8(i))
    device_buffer, host_buffer = backend.allocate(size), backend.host_allocate(size)

    def pinned_out():
        for _ in range(count):
            backend.copy_to_host(device_buffer, host_buffer, size)

    def reclaim_all():
        with pool.lock:
            reclaim.reclaim_blocks(pool, reclaim.victims(pool))

    def pinned_in():
        for _ in range(count):
            backend.copy_from_host(host_buffer, device_buffer, size)

    def bring_back_all():
        with pool.use(*blocks):
            pass
    steps = {"pinned_out": pinned_out, "out": reclaim_all, "pinned_in": pinned_in,
             "in": bring_back_all}
    times = {name: [] for name in steps}

    def idle():
        """The device idle, and the pool told so: blocks used since (by
        bring_back_all) are victims again only after a synchronization
        the pool sees (residency.py)."""
        backend.synchronize()
        pool.synchronize()
    for _ in range(ROUNDS):                 # alternating, in this order each round
        for name, step in steps.items():
            times[name].append(_timed(step, idle))
    wrong = [i for i, block in enumerate(blocks) if not (backend._array(
        block.address, (size,), np.uint8).copy_to_host() == (pattern ^ np.uint8(i))).all()]
    reclaimed = pool.memory_stats()["reclaimed_bytes.allocated"]
    for block in blocks:
        pool.free(block)
    pool.synchronize()
    pool.empty_cache()
    pool.host_cache.empty()
    backend.release(device_buffer)
    backend.host_release(host_buffer)
    return {"size": size, "blocks": count, "bytes": count * size, "chunk": host_copies.CHUNK,
            "seconds": times, "reclaimed_bytes": reclaimed, "wrong_blocks": wrong}


def _launch_cost():
    """Microseconds per launch of a small kernel over three resident arrays."""
    touch = cuda.jit(add)
    a, b, c = (cuda.to_device(np.ones(1 << 18, np.float32)) for _ in range(3))
    touch[1024, 256](a, b, c)
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(LAUNCHES):
        touch[1024, 256](a, b, c)
    cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / LAUNCHES


def _child(what, first, second, sizes=BLOCK_SIZES):
    if what == "layers":
        return _layers(float(first), int(second))
    if what == "blocks":        # first: the chunk size, second: bytes per block size
        from numba_alloc.policy import host_copies
        host_copies.CHUNK = int(first) or host_copies.CHUNK
        return [_blocks(size, int(second)) for size in sizes]
    if what == "peak":
        return _peak()
    return _launch_cost()


def run_child(what, conf, ratio=0.0, limit=0, extra=()):
    """The figures of one child process (``what``: layers, blocks, peak or
    launch; ``extra``: more arguments)."""
    env = {**os.environ, "NUMBA_CUDA_MEMORY_MANAGER": "numba_alloc", "NUMBA_ALLOC_CONF": conf}
    out = subprocess.run([sys.executable, __file__, "--child", what, str(ratio), str(limit),
                          *extra], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stdout + out.stderr)[-2000:]}
    return json.loads(out.stdout.splitlines()[-1])


def summarize(layers, peak, launch_on, launch_off):
    """The side-by-side figures: per ratio, ms per step over the fitting
    run's, MiB to host and back per step, effective bandwidth (bytes moved
    over the time beyond the fitting run's per step) and its fraction of the
    pinned peak (the mean of both ways); the hooks' cost per launch."""
    fit = next((r for r in layers if r.get("ratio") == 1.0 and "error" not in r), None)
    peak_bw = (peak["to_device"] + peak["to_host"]) / 2 if peak and "error" not in peak else None
    rows = []
    for r in layers:
        if "error" in r:
            rows.append({"ratio": r.get("ratio"), "error": r["error"]})
            continue
        moved = r["to_host_bytes"] + r["back_bytes"]
        row = {"ratio": r["ratio"], "arrays": r["arrays"], "ms_per_step": r["ms_per_step"],
               "mib_to_host_per_step": r["to_host_bytes"] / MiB / r["steps"],
               "mib_back_per_step": r["back_bytes"] / MiB / r["steps"],
               "correct": not r["wrong_arrays"]}
        if fit is not None:
            row["step_over_fit"] = r["ms_per_step"] / fit["ms_per_step"]
            extra = (r["ms_per_step"] - fit["ms_per_step"]) * r["steps"] / 1e3
            if moved and extra > 0:
                row["reclaim_bandwidth"] = moved / extra
                if peak_bw:
                    row["bandwidth_over_peak"] = row["reclaim_bandwidth"] / peak_bw
        rows.append(row)
    hooks = None
    if isinstance(launch_on, float) and isinstance(launch_off, float):
        hooks = {"us_per_launch_reclaim_on": launch_on, "us_per_launch_reclaim_off": launch_off,
                 "hook_cost_us": launch_on - launch_off}
    return {"rows": rows, "peak": peak, "hooks": hooks}


def block_rows(figures):
    """Per block size: bandwidths (bytes per second) of reclaim and
    bring-back, the first (cold) round apart and the median of the others,
    of the pinned copies (median of all rounds), the ratios to them and
    whether the goal is met."""
    rows = []
    for f in figures:
        if "error" in f:
            rows.append({"error": f["error"]})
            continue
        t, nbytes = f["seconds"], f["bytes"]
        row = {"size": f["size"], "blocks": f["blocks"], "chunk": f["chunk"],
               "correct": not f["wrong_blocks"]}
        for way in ("out", "in"):
            row[f"{way}_cold"] = nbytes / t[way][0]
            row[way] = nbytes / statistics.median(t[way][1:] or t[way])
            row[f"pinned_{way}"] = nbytes / statistics.median(t[f"pinned_{way}"])
            row[f"{way}_ratio"] = row[way] / row[f"pinned_{way}"]
        row["goal_met"] = min(row["out_ratio"], row["in_ratio"]) >= GOAL
        rows.append(row)
    return rows


def blocks_report(rows):
    lines = ["| block | blocks | chunk | reclaim GB/s (first round) | pinned to host | x pinned "
             "| bring-back GB/s (first round) | pinned to device | x pinned "
             f"| goal {GOAL}x | correct |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| error: {r['error'].splitlines()[-1][:100]} |")
            continue
        lines.append(
            f"| {r['size'] / MiB:g} MiB | {r['blocks']} | {r['chunk'] / MiB:g} MiB "
            f"| {r['out'] / 1e9:.1f} ({r['out_cold'] / 1e9:.1f}) | {r['pinned_out'] / 1e9:.1f} "
            f"| {r['out_ratio']:.2f} | {r['in'] / 1e9:.1f} ({r['in_cold'] / 1e9:.1f}) "
            f"| {r['pinned_in'] / 1e9:.1f} | {r['in_ratio']:.2f} "
            f"| {'met' if r['goal_met'] else 'not met'} | {r['correct']} |")
    return "\n".join(lines)


def report(summary):
    lines = ["| ratio | arrays | ms/step | x fit | MiB to host/step | MiB back/step "
             "| reclaim GB/s | of pinned peak | correct |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in summary["rows"]:
        if "error" in row:
            lines.append(f"| {row['ratio']} | error: {row['error'].splitlines()[-1][:80]} |")
            continue
        bw = row.get("reclaim_bandwidth")
        lines.append(
            f"| {row['ratio']}x | {row['arrays']} | {row['ms_per_step']:.3f} "
            f"| {row.get('step_over_fit', float('nan')):.2f} | {row['mib_to_host_per_step']:.1f} "
            f"| {row['mib_back_per_step']:.1f} | {'-' if bw is None else f'{bw / 1e9:.1f}'} "
            f"| {row.get('bandwidth_over_peak', float('nan')):.2f} | {row['correct']} |")
    peak = summary["peak"]
    if peak and "error" not in peak:
        lines.append(f"\npinned peak: {peak['to_device'] / 1e9:.1f} GB/s to the device, "
                     f"{peak['to_host'] / 1e9:.1f} GB/s to the host")
    hooks = summary["hooks"]
    if hooks:
        lines.append(f"launch of a 3-array kernel: {hooks['us_per_launch_reclaim_off']:.2f} us "
                     f"with reclaim off, {hooks['us_per_launch_reclaim_on']:.2f} us with it on "
                     f"(hooks: {hooks['hook_cost_us']:+.2f} us per launch)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--limit-mib", type=int, default=1024)
    parser.add_argument("--blocks-mib", default=",".join(str(s // MiB) for s in BLOCK_SIZES),
                        help="block sizes for the copies, MiB, comma-separated")
    parser.add_argument("--blocks-total-mib", type=int, default=512)
    parser.add_argument("--chunk-mib", default="0", help="chunk sizes to measure the "
                        "copies with, MiB, comma-separated (0: the module's)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(float(m) * MiB) for m in args.blocks_mib.split(",")]
    if args.child:
        print(json.dumps(_child(*args.child, sizes=sizes)))
        return 0
    gpu = gpu_info()
    if gpu is None:
        print("bench_reclaim_gpu: no GPU here; nothing measured")
        return 0
    blocks = []
    for chunk in (int(c) * MiB for c in args.chunk_mib.split(",")):
        figures = run_child("blocks", "", chunk, args.blocks_total_mib * MiB,
                            ["--blocks-mib", args.blocks_mib])
        blocks += [figures] if isinstance(figures, dict) else figures
    rows = block_rows(blocks)
    print(blocks_report(rows) + "\n", flush=True)    # kept if the layers run out of time
    limit = args.limit_mib * MiB
    conf = f"reclaim:true,limit:{limit}"
    peak = run_child("peak", "")
    layers = [run_child("layers", conf, ratio, limit) for ratio in RATIOS]
    costs = {"on": [], "off": []}
    for _ in range(3):                      # interleaved
        for key, c in (("off", ""), ("on", "reclaim:true")):
            value = run_child("launch", c)
            if isinstance(value, float):
                costs[key].append(value)
    summary = summarize(layers, peak, *(statistics.median(costs[k]) if costs[k] else None
                                        for k in ("on", "off")))
    print(report(summary))
    save({"versions": versions(), "gpu": gpu, "limit": limit, "layers": layers,
          "summary": summary, "blocks": blocks, "block_rows": rows}, args.out)
    save_report(blocks_report(rows) + "\n\n" + report(summary), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
