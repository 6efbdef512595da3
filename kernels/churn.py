"""Long-lived blocks amid churn, the pattern that fragments a pool: a
simulation keeps state blocks that live for 50 to 150 steps, while every
step allocates and frees many small scratch arrays around them; every
``GATHER_EVERY`` steps, and at the last step, it gathers all its state into
one contiguous buffer, which needs a hole as large as the live state.

Every array is filled on the device. Each step's scratch arrays are summed
into a fresh accumulator checked at the end of the step; a state block is
summed and checked just before it is freed (its data must have survived
all the churn, and any move); each gather is summed and checked.

Out of memory skips that array (the workload continues).
"""

import numpy as np
from numba import cuda

from . import linalg
from .arrays import OutOfMemory

NAME = "churn"
STEPS = 200
SIMULATOR_STEPS = 8
SCRATCH = 24                    # scratch arrays per step
STATE_EVERY = 4                 # a new state block every this many steps
STATE_LIFETIME = (50, 150)      # steps
GATHER_EVERY = 25
SMALLEST = 256                  # bytes
SCRATCH_LARGEST = 8 << 20       # bytes at scale 1
STATE_SIZES = (1 << 20, 8 << 20)  # bytes at scale 1
ON_OUT_OF_MEMORY = "skips the array"


def plan(scale, steps, seed=0):
    """Per step: the byte sizes of its scratch arrays, and the (size,
    lifetime) of the state block it allocates (None on most steps)."""
    rng = np.random.default_rng(seed)
    scratch_largest = max(4 * SMALLEST, int(SCRATCH_LARGEST * scale))
    low, high = (max(SMALLEST, int(size * scale)) for size in STATE_SIZES)
    scratch = np.exp(rng.uniform(np.log(SMALLEST), np.log(scratch_largest),
                                 size=(steps, SCRATCH))).astype(np.int64) // 4 * 4
    states = [(int(rng.integers(low, high + 1)) // 4 * 4, int(rng.integers(*STATE_LIFETIME)))
              if step % STATE_EVERY == 0 else None for step in range(steps)]
    return scratch.tolist(), states


def copy_into(out, offset, x):
    """out[offset + i] = x[i]."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[offset + i] = x[i]


def _filled(arrays, nbytes, value):
    """A float32 array of ``nbytes`` filled with ``value``; None when out of memory."""
    try:
        array = arrays.empty(nbytes // 4)
    except OutOfMemory:
        return None
    arrays.launch(linalg.fill_value, array.size, array, value)
    return array


def _check_sum(arrays, summed, expected, what):
    """Sum the arrays ``summed`` into one fresh accumulator and check the
    total is ``expected`` (skipped when out of memory or without data)."""
    try:
        acc = arrays.empty(1, np.float64)
    except OutOfMemory:
        return
    arrays.launch(linalg.fill_value, 1, acc, 0.0)
    for array in summed:
        arrays.launch(linalg.total, array.size, acc, array)
    value = arrays.to_host(acc)
    arrays.free(acc)
    if value is not None:
        assert value[0] == expected, f"churn: {what} sums to {value[0]}, expected {expected}"


def _gather(arrays, state, step):
    """Copy every state block into one new buffer, check it, free it."""
    try:
        gathered = arrays.empty(sum(array.size for _, array, _ in state))
    except OutOfMemory:
        return
    offset = 0
    for _, array, _ in state:
        arrays.launch(copy_into, array.size, gathered, offset, array)
        offset += array.size
    _check_sum(arrays, [gathered], sum(v * a.size for _, a, v in state), f"gather at step {step}")
    arrays.free(gathered)


def _scratch(arrays, sizes, step):
    """Allocate, fill, check and free one step's scratch arrays."""
    scratch, expected = [], 0
    for k, nbytes in enumerate(sizes):
        value = 1 + (step + k) % 13
        array = _filled(arrays, nbytes, value)
        if array is not None:
            scratch.append(array)
            expected += value * array.size
    _check_sum(arrays, scratch, expected, f"step {step}'s scratch")
    for array in scratch:
        arrays.free(array)


def run(arrays, scale, steps=STEPS):
    """Run ``steps`` steps (the last frees all state); raises
    AssertionError when any array's data is wrong."""
    scratch_sizes, states = plan(scale, steps)
    state = []                  # (expiry step, array, value)
    for step in range(steps):
        if states[step] is not None:
            nbytes, lifetime = states[step]
            value = 1 + step % 97
            array = _filled(arrays, nbytes, value)
            if array is not None:
                state.append((step + lifetime, array, value))
        _scratch(arrays, scratch_sizes[step], step)
        if state and (step % GATHER_EVERY == GATHER_EVERY - 1 or step == steps - 1):
            _gather(arrays, state, step)
        expired = [entry for entry in state if entry[0] <= step or step == steps - 1]
        if expired:
            state = [entry for entry in state if entry not in expired]
            _check_sum(arrays, [a for _, a, _ in expired], sum(v * a.size for _, a, v in expired),
                       f"state freed at step {step}")
            for _, array, _ in expired:
                arrays.free(array)
        arrays.checkpoint()
