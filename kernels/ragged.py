"""Ragged batches: each step takes a batch of items whose sizes span 256 B to
hundreds of MiB (log-uniform, as sequence lengths or point clouds are), and
keeps each item's result alive for a random number of steps.

Per item: an input is generated on the device, transformed into a new
output (y = 3 x + 1) and freed; the output's sum goes into a fresh
accumulator, and output and accumulator live on for 1 to ``MAX_LIFETIME``
steps. When an item expires its sum is checked against the exact value.

Out of memory skips the item (the workload continues).
"""

import numpy as np
from numba import cuda

from . import linalg
from .arrays import OutOfMemory

NAME = "ragged"
STEPS = 40
SIMULATOR_STEPS = 3
BATCH = 16
MAX_LIFETIME = 8
SMALLEST = 256                  # bytes
LARGEST = 400 << 20             # bytes at scale 1
ON_OUT_OF_MEMORY = "skips the item"


def item_sizes(scale, steps, seed=0):
    """The byte size (a multiple of 4: float32 items) and the lifetime in
    steps of each item, as two lists of ``steps`` batches."""
    rng = np.random.default_rng(seed)
    largest = max(4 * SMALLEST, int(LARGEST * scale))
    exponents = rng.uniform(np.log(SMALLEST), np.log(largest), size=(steps, BATCH))
    sizes = (np.exp(exponents).astype(np.int64) // 4 * 4).tolist()
    lifetimes = rng.integers(1, MAX_LIFETIME + 1, size=(steps, BATCH)).tolist()
    return sizes, lifetimes


def affine(out, x, a, b):
    """out = a x + b."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * x[i] + b


def _process(arrays, n, seed):
    """(output, accumulator, expected sum) of an item of ``n`` elements, or
    None when out of memory (then nothing of it stays allocated)."""
    allocated = []
    try:
        for shape, dtype in ((n, np.float32), (n, np.float32), (1, np.float64)):
            allocated.append(arrays.empty(shape, dtype))
    except OutOfMemory:
        for array in allocated:
            arrays.free(array)
        return None
    x, y, acc = allocated
    arrays.launch(linalg.fill_value, 1, acc, 0.0)
    arrays.launch(linalg.fill_pattern, n, x, seed)
    arrays.launch(affine, n, y, x, 3.0, 1.0)
    arrays.free(x)
    arrays.launch(linalg.total, n, acc, y)
    return y, acc, 3 * linalg.pattern_sum(n, seed) + n


def run(arrays, scale, steps=STEPS):
    """Process ``steps`` batches; raises AssertionError when an item's sum
    is wrong."""
    sizes, lifetimes = item_sizes(scale, steps)
    alive = []                  # (expiry step, output, accumulator, expected sum)
    for step in range(steps + MAX_LIFETIME):
        if step < steps:
            for item, (nbytes, lifetime) in enumerate(zip(sizes[step], lifetimes[step])):
                processed = _process(arrays, nbytes // 4, seed=step * BATCH + item)
                if processed is not None:
                    alive.append((step + lifetime, *processed))
        expired = [entry for entry in alive if entry[0] == step]
        alive = [entry for entry in alive if entry[0] != step]
        for _, y, acc, expected in expired:
            value = arrays.to_host(acc)
            if value is not None:
                assert value[0] == expected, (f"ragged: an item of {y.size} elements sums "
                                              f"to {value[0]}, expected {expected}")
            arrays.free(acc)
            arrays.free(y)
        arrays.checkpoint()
