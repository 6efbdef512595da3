"""Whether a CUDA GPU is here, and the marks of the tests that need one."""

import pytest

try:
    from numba import cuda
    HAVE_GPU = not cuda.config.ENABLE_CUDASIM and cuda.is_available()
except Exception:  # no driver at all
    HAVE_GPU = False

GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")]


def needs_gpu(test):
    """Mark a test ``gpu`` and skip it where there is no GPU."""
    for mark in GPU_MARKS:
        test = mark(test)
    return test
