"""Running a small Numba program in a process of its own, for GPU tests
that need a fresh context whose pool has the settings they name."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def run(prelude, body, conf):
    """Run ``prelude`` then ``body`` (dedented) with NUMBA_ALLOC_CONF=``conf``
    and tests/ importable; assert it exits 0 and return its stdout."""
    tests = str(Path(__file__).parent)
    env = {**os.environ, "NUMBA_ALLOC_CONF": conf,
           "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
