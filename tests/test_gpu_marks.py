"""How the GPU tests are gated: a GPU is a GPU with or without NVVM; GPU
tests on a GPU without NVVM error, saying so, rather than skip; the GPU
defragmentation tests skip, with the reason, where Numba's internals make
defragmentation refused."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from numba.cuda.cudadrv import driver, nvvm

import gpu_marks

TESTS = Path(__file__).parent

FAKE_GPU_WITHOUT_NVVM = textwrap.dedent("""
    from numba.cuda.cudadrv import driver, nvvm
    driver.Driver.is_available = property(lambda self: True)
    nvvm.is_available = lambda: False
""")

FAKE_GPU_REFUSING_DEFRAG = textwrap.dedent("""
    from numba.cuda.cudadrv import driver, nvvm
    import numba_alloc.plugin.relocation
    driver.Driver.is_available = property(lambda self: True)
    nvvm.is_available = lambda: True
    numba_alloc.plugin.relocation.unsupported_reason = lambda: "numba-cuda 9.9 is not supported: X"
""")


def run_pytest(tmp_path, plugin, *tests):
    """pytest on ``tests`` in a process where ``plugin`` (source) fakes the machine."""
    (tmp_path / "fake_machine.py").write_text(plugin)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    env.pop("NUMBA_ALLOC_STANDIN", None)        # the plugin fakes the machine instead
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fake_machine", "-p", "no:cacheprovider",
         "-q", "-rfEs", *(str(TESTS / test) for test in tests)],
        env=env, capture_output=True, text=True, timeout=600)


def test_a_gpu_whose_driver_initializes_is_a_gpu_without_nvvm_too(monkeypatch):
    monkeypatch.setattr(driver.Driver, "is_available", property(lambda self: True))
    monkeypatch.setattr(nvvm, "is_available", lambda: False)
    assert gpu_marks.gpu_present()
    monkeypatch.setattr(driver.Driver, "is_available", property(lambda self: False))
    assert not gpu_marks.gpu_present()


def test_needs_gpu_marks_the_test_and_errors_without_nvvm(monkeypatch):
    def a_test():
        return "ran"

    test = gpu_marks.needs_gpu(a_test)
    assert {mark.name for mark in test.pytestmark} == {"gpu", "skipif"}
    monkeypatch.setattr(nvvm, "is_available", lambda: True)
    assert test() == "ran"
    monkeypatch.setattr(nvvm, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no NVVM"):
        test()


def test_gpu_tests_error_on_a_gpu_without_nvvm(tmp_path):
    out = run_pytest(tmp_path, FAKE_GPU_WITHOUT_NVVM,
                     "test_gpu.py::test_kernels_copies_and_slices_are_correct",
                     "test_gpu_defrag.py::test_pinned_and_ipc_exported_arrays_do_not_move",
                     "test_nvml.py::test_the_real_driver_view_matches_numba")
    summary = out.stdout.splitlines()[-1]
    assert out.returncode == 1, out.stdout + out.stderr
    assert "skipped" not in summary and "1 failed" in summary and "2 errors" in summary, out.stdout
    assert out.stdout.count("no NVVM") >= 3, out.stdout


def test_gpu_defragmentation_tests_skip_with_the_reason_numba_is_unsupported(tmp_path):
    out = run_pytest(tmp_path, FAKE_GPU_REFUSING_DEFRAG, "test_gpu_defrag.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 skipped" in out.stdout.splitlines()[-1], out.stdout
    assert "defragmentation is refused on this Numba: numba-cuda 9.9 is not supported: X" \
        in out.stdout
