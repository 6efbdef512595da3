"""Running one of the tests' scripts under the CUDA simulator in a fresh
process and reading the JSON it prints."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_under_simulator(script, timeout=600):
    """The JSON that tests/``script`` prints when run with
    NUMBA_ENABLE_CUDASIM=1; fails the test with its output when it exits
    with an error."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, os.path.join(HERE, script)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)
