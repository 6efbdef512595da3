import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

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
