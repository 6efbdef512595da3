"""Whether a CUDA GPU is here, and the marks of the tests that need one.

``HAVE_GPU``: a GPU and its driver are present (not the CUDA simulator).
The GPU tests also need NVVM to compile kernels; where a GPU has none they
error, saying so, instead of skipping silently. A module marked with
``GPU_MARKS`` must import the ``gpu_toolchain`` fixture; single tests use
``needs_gpu``.
"""

import functools
import os

import pytest


def gpu_present():
    """True when Numba's real driver initializes (cuInit finds a device)."""
    from numba import cuda
    if cuda.config.ENABLE_CUDASIM:
        return False
    from numba.cuda.cudadrv.driver import CudaSupportError, driver
    try:
        return driver.is_available
    except CudaSupportError:        # no driver library, or no device
        return False


HAVE_GPU = gpu_present()

# NUMBA_ALLOC_STANDIN=1: the GPU tests run over the driver stand-in
# (tests/standin), which gpu_present() then sees as a GPU
STANDIN = os.environ.get("NUMBA_ALLOC_STANDIN") == "1"


def gpu_only(reason):
    """Skip a GPU test under the driver stand-in, saying why it needs a
    real GPU."""
    return pytest.mark.skipif(STANDIN, reason=f"needs a real GPU, not the driver stand-in: "
                                              f"{reason}")


def require_nvvm():
    """Raise RuntimeError where Numba cannot compile kernels (no NVVM)."""
    from numba.cuda.cudadrv import nvvm
    if not nvvm.is_available():
        raise RuntimeError(
            "this machine has a CUDA GPU but no NVVM (libnvvm), so Numba cannot compile "
            "kernels and the GPU tests cannot run: install it (pip install nvidia-nvvm, "
            "or numba-cuda[cu12]/[cu13], or a CUDA toolkit)")


@pytest.fixture
def gpu_toolchain():
    """Errors (never skips) a GPU test where NVVM is missing."""
    require_nvvm()


_SKIP = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
GPU_MARKS = [pytest.mark.gpu, _SKIP, pytest.mark.usefixtures("gpu_toolchain")]


def needs_gpu(test):
    """Mark a test ``gpu``, skip it where there is no GPU, and make it error
    where the GPU has no NVVM."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        require_nvvm()
        return test(*args, **kwargs)
    return pytest.mark.gpu(_SKIP(run))
