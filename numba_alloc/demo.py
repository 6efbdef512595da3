"""The bundled workload of ``numba-alloc demo``: an iterative smoother that
keeps a few long-lived arrays and allocates temporaries of changing sizes
every step, as a Numba pipeline does.

On a GPU it runs real Numba kernels under the plugin and checks their
result; without one it runs the same allocation sequence through the pool on
a simulated device, writing and checking the data there.
"""

import numpy as np

from .config import MiB


def allocation_plan(steps, scale):
    """(step, [temporary sizes in elements]) for each step: a pyramid of
    buffers whose sizes change with the step, as in a multigrid smoother."""
    rng = np.random.default_rng(1)
    base = int(scale * MiB) // 4
    for step in range(steps):
        levels = 3 + step % 3
        sizes = [max(1, base >> level) for level in range(levels)]
        sizes += [int(x) for x in rng.integers(16, 4096, size=4)]
        yield step, sizes


def run_simulated(steps=40, scale=8.0, capacity="1GiB"):
    """Run the plan through a Pool on a SimulatedDevice; return the pool."""
    from .pool import Pool
    from .simulated import SimulatedDevice
    device = SimulatedDevice(capacity)
    pool = Pool(device)
    field = pool.malloc(int(scale * MiB))
    for step, sizes in allocation_plan(steps, scale):
        temporaries = [pool.malloc(4 * n) for n in sizes]
        for t in temporaries:
            device.write(t.address, np.full(min(t.size, 64), step % 256, np.uint8))
        device.launch()                       # the kernels of this step
        for t in temporaries:
            assert (device.read(t.address, min(t.size, 64)) == step % 256).all()
            pool.free(t)
        device.complete()
    pool.free(field)
    return pool


def run_gpu(steps=40, scale=64.0):
    """Run the plan with Numba kernels on the current GPU; numba_alloc must
    be Numba's memory manager. Returns the device's pool."""
    from numba import cuda

    from .api import device_pool

    @cuda.jit
    def smooth(out, x, weight):
        i = cuda.grid(1)
        if 0 < i < x.size - 1:
            out[i] = (1 - weight) * x[i] + weight * 0.5 * (x[i - 1] + x[i + 1])
        elif i < x.size:
            out[i] = x[i]

    n = int(scale * MiB) // 4
    host = np.linspace(0, 1, n, dtype=np.float32) ** 2
    field = cuda.to_device(host)
    for step, sizes in allocation_plan(steps, scale):
        temporaries = [cuda.device_array(s, dtype=np.float32) for s in sizes]
        out = cuda.device_array_like(field)
        smooth[(n + 255) // 256, 256](out, field, np.float32(0.25))
        field = out
        for t in temporaries:
            t[:1].copy_to_device(np.float32([step]))
        del temporaries
    expected = host.copy()
    for _ in range(steps):
        inner = 0.75 * expected[1:-1] + 0.125 * (expected[:-2] + expected[2:])
        expected[1:-1] = inner.astype(np.float32)
    if not np.allclose(field.copy_to_host(), expected, atol=1e-5):
        raise AssertionError("the demo's smoother gave a wrong result")
    with device_pool() as pool:
        return pool
