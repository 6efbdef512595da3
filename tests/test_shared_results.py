"""Results computed once in a test run and shared by its processes
(tests/shared_results.py, conftest's ``once``)."""

import subprocess
import sys
from pathlib import Path

import pytest

from shared_results import once

READ_IN_ANOTHER_PROCESS = """
import sys
from pathlib import Path
from shared_results import once
print(once(Path(sys.argv[1]), "value", lambda: "computed again"))
"""


def test_the_first_caller_computes_and_every_later_one_in_any_process_reads(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"value": [1, 2]}
    assert once(tmp_path, "value", compute) == {"value": [1, 2]}
    assert once(tmp_path, "value", compute) == {"value": [1, 2]}
    assert once(tmp_path, "other", lambda: "other") == "other"
    assert calls == [1]
    proc = subprocess.run([sys.executable, "-c", READ_IN_ANOTHER_PROCESS, str(tmp_path)],
                          cwd=Path(__file__).parent, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "{'value': [1, 2]}", proc.stderr


def test_a_compute_that_fails_leaves_nothing_and_the_next_caller_computes(tmp_path):
    def fail():
        raise AssertionError("the subprocess failed")
    with pytest.raises(AssertionError, match="the subprocess failed"):
        once(tmp_path, "value", fail)
    assert once(tmp_path, "value", lambda: 7) == 7
