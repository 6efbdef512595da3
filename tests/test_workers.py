"""How many pytest-xdist workers the suite starts (tests/conftest.py): a
worker per CPU, MAX_WORKERS at most; none where a GPU is present or in a
pytest run that a test starts."""

import os
import subprocess
import sys
from pathlib import Path

import conftest
from gpu_marks import HAVE_GPU

ROOT = Path(__file__).resolve().parent.parent


def test_auto_is_a_worker_per_cpu_at_most_four_and_none_with_a_gpu(monkeypatch):
    monkeypatch.delenv("NUMBA_ALLOC_PYTEST_RUNNING", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    expected = 0 if HAVE_GPU else min(cpus, conftest.MAX_WORKERS)
    assert conftest.pytest_xdist_auto_num_workers(None) == expected
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert conftest.pytest_xdist_auto_num_workers(None) is None     # xdist's hook reads it
    monkeypatch.setenv("NUMBA_ALLOC_PYTEST_RUNNING", "1")           # as in a run a test starts
    assert conftest.pytest_xdist_auto_num_workers(None) == 0


def test_a_pytest_run_a_test_starts_runs_in_one_process():
    """The stand-in tier's runs, for one, would otherwise each start workers."""
    assert os.environ["NUMBA_ALLOC_PYTEST_RUNNING"] == "1"         # set for this run's children
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "tests/test_layers.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout and "workers" not in proc.stdout, proc.stdout
