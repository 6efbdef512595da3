"""Real Numba CUDA workloads for ``numba-alloc bench``, each a kernel
pipeline that checks its own numeric result.

Each workload module has ``NAME``, ``run(arrays, scale, steps)`` (written
against :class:`kernels.arrays.Arrays`, so the same code runs on a GPU and
on the simulated device), ``SIMULATOR_STEPS`` (the steps of its tiny run
through Numba's CUDA simulator) and ``ON_OUT_OF_MEMORY`` (what it does
when an allocation fails). Its allocation sequence depends only on the
scale and a fixed seed, never on device data.

``scale`` sizes a workload: 1.0 is the full size for an 80 GiB GPU.

``heap_suite`` is not a workload: it is the device heap's kernel-level
suite, which ``numba-alloc bench --heap`` runs.
"""

from . import cg, churn, ragged, stencil

WORKLOADS = {module.NAME: module for module in (cg, stencil, ragged, churn)}
SIZES = {"small": 1 / 256, "medium": 1 / 16, "large": 1.0}
SIMULATOR_SCALE = 1e-6          # every workload at its smallest dimensions


def parse_scale(size):
    """A scale from a size name (``small``, ``medium``, ``large``) or a
    positive number such as ``"0.25"``; ValueError otherwise."""
    if size in SIZES:
        return SIZES[size]
    try:
        scale = float(size)
    except ValueError:
        scale = 0.0
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"size must be one of {', '.join(SIZES)} or a positive number, "
                         f"got {size!r}")
    return scale
