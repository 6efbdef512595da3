"""The bundled workload of ``numba-alloc demo``: an iterative smoother that
keeps two long-lived arrays (the field and the smoother's output, swapped
every step) and allocates temporaries of changing sizes every step, as a
Numba pipeline does.

On a GPU it runs real Numba kernels under the plugin and checks their
result against NumPy; without one it runs the same allocation sequence
through the pool on a simulated device, writing and checking the data there.
Both make the same requests in the same order: the two arrays, then each
step its temporaries (:func:`allocation_plan`), freed after the step's
kernel is queued, the last first; at the end the two arrays. Both return the
pool and a :class:`PeakSummary`.
"""

import numpy as np

from ..units import MiB
from ..observe.summary import format_summary


def field_elements(scale):
    """float32 elements of each long-lived array: ``scale`` MiB, at least 1."""
    return max(1, int(scale * MiB) // 4)


def allocation_plan(steps, scale):
    """(step, [temporary sizes in float32 elements]) for each step: a
    pyramid of buffers whose sizes change with the step, as in a multigrid
    smoother."""
    rng = np.random.default_rng(1)
    base = field_elements(scale)
    for step in range(steps):
        levels = 3 + step % 3
        sizes = [max(1, base >> level) for level in range(levels)]
        sizes += [int(x) for x in rng.integers(16, 4096, size=4)]
        yield step, sizes


class PeakSummary:
    """The pool's summary (``summary``, a str) at the first ``update`` that
    saw its allocated bytes at their highest, and that step (``step``)."""

    def __init__(self, pool):
        self.pool, self.allocated, self.step, self.summary = pool, -1, None, ""

    def update(self, step):
        """Take the summary now if the pool has more bytes allocated than at
        every earlier update."""
        allocated = self.pool.current("allocated_bytes")
        if allocated > self.allocated:
            self.allocated, self.step, self.summary = allocated, step, format_summary(self.pool)


def run_simulated(steps=40, scale=8.0, capacity="1GiB"):
    """Run the plan through a Pool on a SimulatedDevice of ``capacity``;
    return (the pool, its PeakSummary)."""
    from ..policy.pool import Pool
    from ..backends.simulated import SimulatedDevice
    device = SimulatedDevice(capacity)
    pool = Pool(device)
    peak = PeakSummary(pool)
    nbytes = 4 * field_elements(scale)
    field, out = pool.malloc(nbytes), pool.malloc(nbytes)
    for step, sizes in allocation_plan(steps, scale):
        temporaries = [pool.malloc(4 * n) for n in sizes]
        peak.update(step)
        for t in temporaries:
            device.write(t.address, np.full(min(t.size, 64), step % 256, np.uint8))
        device.launch()                       # the step's kernel
        for t in temporaries:
            if not (device.read(t.address, min(t.size, 64)) == step % 256).all():
                raise AssertionError("the simulated device returned wrong data")
        for t in reversed(temporaries):
            pool.free(t)
        field, out = out, field
        device.complete()
    pool.free(field)
    pool.free(out)
    return pool, peak


def run_gpu(steps=40, scale=8.0):
    """Run the plan with Numba kernels on the current GPU; numba_alloc must
    be Numba's memory manager. Returns (the device's pool, its PeakSummary);
    AssertionError if the smoother's result is wrong."""
    from numba import cuda

    from ..api.functions import device_pool

    @cuda.jit
    def smooth(out, x, weight):
        i = cuda.grid(1)
        if 0 < i < x.size - 1:
            out[i] = (1 - weight) * x[i] + weight * 0.5 * (x[i - 1] + x[i + 1])
        elif i < x.size:
            out[i] = x[i]

    n = field_elements(scale)
    host = np.linspace(0, 1, n, dtype=np.float32) ** 2
    with device_pool() as pool:
        peak = PeakSummary(pool)
        field = cuda.to_device(host)
        out = cuda.device_array_like(field)
        for step, sizes in allocation_plan(steps, scale):
            temporaries = [cuda.device_array(s, dtype=np.float32) for s in sizes]
            peak.update(step)
            smooth[(n + 255) // 256, 256](out, field, np.float32(0.25))
            for t in temporaries:
                t[:1].copy_to_device(np.float32([step]))
            del t                             # the loop's name would keep the last into the next step
            while temporaries:                # each freed as it goes, the last first
                temporaries.pop()
            field, out = out, field
        result = field.copy_to_host()
        del field, out
    expected = host.copy()
    for _ in range(steps):
        inner = 0.75 * expected[1:-1] + 0.125 * (expected[:-2] + expected[2:])
        expected[1:-1] = inner.astype(np.float32)
    if not np.allclose(result, expected, atol=1e-5):
        raise AssertionError("the demo's smoother gave a wrong result")
    return pool, peak
