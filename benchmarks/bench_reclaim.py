"""Reclaim under oversubscription, on the simulated device, side by side
from one run.

A training-like loop over ``layers`` blocks whose bytes total 1x (fits),
1.5x and 3x the device: each step uses the blocks of one layer (forward in
order, then backward in reverse), as ``with pool.use(...)``, and checks one
byte of each. For each ratio: host microseconds per step, and the bytes
reclaim moved to host memory and back per step. Then, at 3x, the victim
order reclaim uses (least recently used first) against two alternatives,
largest first and most recently used first, by the same measures.

Last, the host cost the reclaim hooks (numba_alloc.plugin.activity) add to a
kernel launch under the Numba plugin: a stand-in launch that prepares three
pool arrays as Numba's launch does, without and with the hooks.

Without a GPU this measures the policy's host cost and its copy traffic,
not copy bandwidth: the simulated device copies with NumPy. On a GPU,
benchmarks/bench_reclaim_gpu.py measures Numba kernels under reclaim and the
copies' bandwidth against the pinned-memory peak.

    python benchmarks/bench_reclaim.py [--out DIR] [--quick]
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_core import plugin_manager  # noqa: E402
from bench_malloc import save, versions  # noqa: E402

MiB = 1 << 20
CAPACITY = 256 * MiB
SIZES = (7 * MiB, 15 * MiB, 31 * MiB)   # blocks of 8, 16 and 32 MiB, in turn


def _loop(ratio, passes, victim_order=None):
    """(microseconds per step, MiB to host per step, MiB back per step)."""
    from numba_alloc import Pool, SimulatedDevice
    from numba_alloc.policy import reclaim
    original = reclaim.victims
    if victim_order is not None:
        reclaim.victims = victim_order
    try:
        device = SimulatedDevice(CAPACITY)
        pool = Pool(device, reclaim=True)
        blocks, total = [], 0
        while total + 64 * MiB <= ratio * CAPACITY:       # room for one brought back
            blocks.append(pool.malloc(SIZES[len(blocks) % 3]))
            total += blocks[-1].allocated_size
        count = len(blocks)
        for i, block in enumerate(blocks):
            with pool.use(block):
                device.synchronize()            # after the copy that brought it back
                device.write(block.address, np.full(1, i % 251, np.uint8))
        order = list(range(count)) + list(reversed(range(count)))
        before = pool.memory_stats()
        steps = 0
        start = time.perf_counter()
        for _ in range(passes):
            for i in order:
                with pool.use(blocks[i]):
                    device.synchronize()
                    assert device.read(blocks[i].address, 1)[0] == i % 251
                steps += 1
        seconds = time.perf_counter() - start
        after = pool.memory_stats()
        out = (after["reclaimed_bytes.allocated"] - before["reclaimed_bytes.allocated"]) / MiB
        back = (after["reclaimed_bytes.freed"] - before["reclaimed_bytes.freed"]) / MiB
        return seconds / steps * 1e6, out / steps, back / steps
    finally:
        reclaim.victims = original


def _alternatives(lru):
    """Victim orders to compare with ``lru`` (reclaim.victims)."""
    from numba_alloc.policy.core import NF, SIZE, TABLE

    def largest_first(pool):
        return sorted(lru(pool), key=lambda v: -pool._mv[TABLE + v[0] * NF + SIZE])

    def most_recent_first(pool):
        return list(reversed(lru(pool)))
    return (("largest first", largest_first), ("most recently used", most_recent_first))


def _launch_hooks(launches, rounds=41):
    """Host microseconds per launch of a stand-in kernel over three 1 MiB
    pool arrays (Numba's own argument preparation, as a launch does it, and
    no GPU), without and with the reclaim hooks (numba_alloc.plugin.activity), in
    interleaved rounds of ``launches``; the best round of each (a cost: what
    the VM's interference did not add to it)."""
    import numpy as np
    from numba import typeof
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    from numba_alloc.plugin import activity

    class Kernel:
        extensions = []
        _prepare_args = dispatcher._Kernel._prepare_args

    def launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
        retr, kernelargs = [], []
        for value in args:
            self._prepare_args(typeof(value), value, stream, retr, kernelargs)

    manager = plugin_manager()
    manager.pool.configure(reclaim=True)
    arrays = tuple(DeviceNDArray((1 << 18,), (4,), np.dtype(np.float32),
                                 gpu_data=manager.memalloc(1 << 20)) for _ in range(3))
    kernel, hooked = Kernel(), activity._hooked_launch(launch)
    times = {"without": [], "with": []}
    for _ in range(rounds):
        for name, call in (("without", launch), ("with", hooked)):
            start = time.perf_counter()
            for _ in range(launches):
                call(kernel, arrays, 1, 1)
            times[name].append((time.perf_counter() - start) / launches * 1e6)
    manager.pool.configure(reclaim=False)
    return {name: min(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    passes = 1 if args.quick else 3
    from numba_alloc.policy import reclaim
    lru = reclaim.victims
    results = {"ratios": {}, "policies": {}}
    print(f"simulated device of {CAPACITY // MiB} MiB, blocks of 8, 16 and 32 MiB, a forward "
          f"and backward pass over them per round, {passes} rounds; host time and reclaim "
          "traffic per step")
    print(f"{'blocks / device':>16} {'us per step':>12} {'MiB out':>9} {'MiB back':>9}")
    for ratio in (1.0, 1.5, 3.0):
        us, out, back = _loop(ratio, passes)
        results["ratios"][ratio] = {"us_per_step": us, "mib_out": out, "mib_back": back}
        print(f"{ratio:>15.1f}x {us:>12.1f} {out:>9.2f} {back:>9.2f}")
    base = results["ratios"][1.0]["us_per_step"]
    print("host time per step against the 1x run: " + ", ".join(
        f"{r}x {v['us_per_step'] / base:.2f}x" for r, v in results["ratios"].items()))
    print("\nvictim order at 3x")
    print(f"{'order':>22} {'us per step':>12} {'MiB out':>9} {'MiB back':>9}")
    for name, order in (("least recently used", None), *_alternatives(lru)):
        us, out, back = _loop(3.0, passes, order)
        results["policies"][name] = {"us_per_step": us, "mib_out": out, "mib_back": back}
        print(f"{name:>22} {us:>12.1f} {out:>9.2f} {back:>9.2f}")
    assert reclaim.victims is lru
    hooks = _launch_hooks(100 if args.quick else 300)
    results["launch_hooks"] = hooks
    print(f"\nlaunch of a stand-in kernel over three pool arrays (Numba's argument "
          f"preparation, no GPU; best of 41 rounds): {hooks['without']:.2f} us without the "
          f"reclaim hooks, "
          f"{hooks['with']:.2f} us with them ({hooks['with'] - hooks['without']:+.2f} us, "
          f"{hooks['with'] / hooks['without']:.2f}x)")
    if args.out:
        save({"versions": versions(), **results}, args.out)


if __name__ == "__main__":
    main()
