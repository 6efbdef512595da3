import functools
import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import shared_results  # noqa: E402 (from tests/)
import simulator_threads  # noqa: E402 (from tests/)

# pyproject.toml runs the suite with -n auto (pytest-xdist): a worker per CPU
# this process may use, at most MAX_WORKERS (a worker's subprocesses reach
# 3.3 GB: tests/test_ptx.py's compile of every kernel)
MAX_WORKERS = 4

# NUMBA_ALLOC_STANDIN=1: numba-cuda's real driver layer over the checking
# driver stand-in (tests/standin), installed before any test imports CUDA,
# so that the GPU tests run without a GPU
STANDIN = None
if os.environ.get("NUMBA_ALLOC_STANDIN") == "1":
    import standin
    STANDIN = standin.install()
    # the processes tests start install it at start-up (its sitecustomize)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "standin", "startup"),
         os.environ.get("PYTHONPATH", "")])

# the simulator's blocks here (SimulatedDevice's copy kernel) poll their
# threads letting go of the GIL
simulator_threads.install()


@pytest.fixture(autouse=True)
def _no_standin_errors():
    """Under the stand-in, a test fails on any refused driver call or failed
    piece of GPU work it caused (unless it takes them with
    ``standin_errors``)."""
    if STANDIN is None:
        yield
        return
    before = len(STANDIN.errors)
    yield
    errors = STANDIN.errors[before:]
    assert not errors, "the driver stand-in recorded:\n" + "\n".join(
        f"  {call}: {message}" for call, message in errors)


@pytest.fixture(scope="session")
def once(tmp_path_factory):
    """``once(name, compute)``: shared_results.once in a folder all of this
    run's processes share: a module-scoped fixture runs again on each
    pytest-xdist worker that runs one of the module's tests, and again each
    time worksteal brings a worker back to the module."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent                  # the workers' base folders' parent
    return functools.partial(shared_results.once, shared)


@pytest.hookimpl(optionalhook=True)            # pytest-xdist's
def pytest_xdist_auto_num_workers(config):
    """How many workers -n auto starts: none (the tests run in this process)
    in a pytest run a test starts (the stand-in tier, the GPU marks' tests)
    and where a GPU is present (the GPU tests need it to themselves); else
    PYTEST_XDIST_AUTO_NUM_WORKERS where set, or one per CPU, MAX_WORKERS at
    most."""
    if os.environ.get("NUMBA_ALLOC_PYTEST_RUNNING") == "1":
        return 0
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None                             # xdist's own hook reads it
    from gpu_marks import HAVE_GPU
    if HAVE_GPU:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, MAX_WORKERS))


def pytest_configure(config):
    os.environ["NUMBA_ALLOC_PYTEST_RUNNING"] = "1"    # for the pytest runs tests start


def pytest_collection_finish(session):
    """What collecting imported (NumPy, Numba, numba-cuda, Hypothesis, the
    test modules) is moved out of the collector's sight (gc.freeze): each
    full collection, the tests' own gc.collect() calls among them, then
    walks only what was made since (a gc.collect() took 70 ms, a fifth of
    test_activity_stress's time). Objects made by tests are collected as
    before; refcounting frees frozen objects as before."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the tests marked slow first, so that they start
    early and no worker is left running one alone at the end."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
