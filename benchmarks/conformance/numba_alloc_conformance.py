"""pytest plugin for the conformance run of numba-cuda's own test suite
(``bash benchmarks/gpu_session.sh conformance``), loaded with
``-p numba_alloc_conformance`` under both managers alike.

It applies numba_alloc's NumPy shim (``numba_alloc/numpy_compat.py``: under
NumPy >= 2.5 numba-cuda 0.30 cannot compile a kernel, since NumPy removed
``np.row_stack``) before any test module imports, so that the default
manager's run gets the same fix as numba_alloc's, which applies it when
Numba imports the plugin. Only the shim's file is loaded, not the
numba_alloc package, so the default manager's run imports nothing else of
numba_alloc. Where this checkout has no such file, nothing is applied. The
report header says which.

It also gives what numba-cuda's tests take from the conftest.py of its
source tree (``testing/conftest.py``, not shipped in the wheel): the
``--dump-failed-filechecks`` option and the class-scoped
``initialize_from_pytest_config`` fixture that every ``CUDATestCase``
uses; without them each such test errors at setup ("fixture
'initialize_from_pytest_config' not found"). Copied from numba-cuda 0.30.4
(BSD-2-Clause, Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES).

With ``NUMBA_ALLOC_CONFORMANCE_DEADLINE`` set (seconds since the epoch),
every test that would start after it is skipped at once, with the reason
:data:`TIME_LIMIT_REASON`, so that a part that runs out of time still ends
normally and pytest writes its JUnit XML (a run killed or interrupted
under pytest-xdist often writes none); the comparison counts such tests as
not run.
"""

import importlib.util
import os
import time

import pytest

_STATE = {"shim": "not looked for"}
DEADLINE_VARIABLE = "NUMBA_ALLOC_CONFORMANCE_DEADLINE"
TIME_LIMIT_REASON = "conformance: time limit reached, not run"


def _shim_path():
    spec = importlib.util.find_spec("numba_alloc")      # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "numpy_compat.py")
    return path if os.path.exists(path) else None


def apply_shim():
    """Load numba_alloc/numpy_compat.py on its own (it applies itself on
    import; a module-level ``apply()`` is called too, harmlessly, in case
    a later version stops doing so). Returns what was done, in words."""
    path = _shim_path()
    if path is None:
        return "none (this checkout has no numba_alloc/numpy_compat.py)"
    spec = importlib.util.spec_from_file_location("_numba_alloc_numpy_compat", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if callable(getattr(module, "apply", None)):
        module.apply()
    return f"applied ({path})"


def pytest_addoption(parser):
    parser.addoption("--dump-failed-filechecks", action="store_true",
                     help="Dump reproducers for FileCheck tests that fail.")


@pytest.fixture(scope="class")
def initialize_from_pytest_config(request):
    """numba-cuda's: set the test case's options from pytest's configuration."""
    request.cls._dump_failed_filechecks = request.config.getoption("dump_failed_filechecks")


def pytest_configure(config):
    try:
        _STATE["shim"] = apply_shim()
    except Exception as error:      # the same under both managers: reported, not fatal
        _STATE["shim"] = f"FAILED ({error!r})"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    deadline = float(os.environ.get(DEADLINE_VARIABLE) or 0)
    if deadline and time.time() > deadline:
        pytest.skip(TIME_LIMIT_REASON)


def pytest_report_header(config):
    import numpy as np
    manager = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") or "default"
    return [f"conformance: memory manager {manager}; NumPy {np.__version__} "
            f"(np.row_stack {'present' if hasattr(np, 'row_stack') else 'absent'}); "
            f"numba_alloc NumPy shim: {_STATE['shim']}"]
