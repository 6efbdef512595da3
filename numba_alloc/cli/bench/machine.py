"""The machine a benchmark ran on, as its results record it."""

import os
import platform


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _version(name):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine():
    """Versions and host of the machine that runs the suite (the device and
    the CUDA driver come from the runs themselves)."""
    import numba
    import numpy
    return {"python": platform.python_version(), "numba": numba.__version__,
            "numba-cuda": _version("numba-cuda"), "numpy": numpy.__version__,
            "cuda-bindings": _version("cuda-bindings"), "cuda-core": _version("cuda-core"),
            "cpu": _cpu_name(), "cores": os.cpu_count()}
