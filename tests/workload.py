"""A small mixed workload for the observability tests."""

import random

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def make_pool(capacity=256 * MiB, **settings):
    device = SimulatedDevice(capacity)
    return device, Pool(device, **settings)


def mixed(pool, device, steps=300, seed=0, oom_every=0):
    """Random allocations (small and large) and frees, some freed while
    "GPU work" is queued (so they stay pending a while), and, every
    ``oom_every`` steps, a request too large for the device. Returns the
    blocks still live."""
    rng = random.Random(seed)
    live = []
    for step in range(steps):
        crowded = sum(b.allocated_size for b in live) > device.capacity // 3
        if live and (crowded or rng.random() < 0.45):
            block = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.3:
                device.launch()
            pool.free(block)
        else:
            size = rng.choice((rng.randrange(1, 64 * KiB), rng.randrange(MiB, 12 * MiB)))
            live.append(pool.malloc(size))
        if rng.random() < 0.2:
            device.complete()
        if oom_every and step % oom_every == oom_every - 1:
            try:
                pool.malloc(device.capacity + 1)
            except OutOfMemoryError:
                pass
    return live
