"""The Numba plugin's parts that run without a GPU."""

import os
import subprocess
import sys

from numba_alloc import Pool, SimulatedDevice


def test_manager_constructs_without_a_context_or_cuda_call():
    import numba_alloc
    from numba.cuda.cudadrv.driver import HostOnlyCUDAMemoryManager
    manager_class = numba_alloc._numba_memory_manager
    assert issubclass(manager_class, HostOnlyCUDAMemoryManager)
    manager = manager_class(context=None)
    assert manager.interface_version == 1
    assert manager.pool is None


def test_numba_selects_the_plugin_from_the_environment():
    code = ("from numba.cuda.cudadrv import driver\n"
            "driver._ensure_memory_manager()\n"
            "import numba_alloc\n"
            "assert driver._memory_manager is numba_alloc._numba_memory_manager\n"
            "print('selected')\n")
    env = {**os.environ, "NUMBA_CUDA_MEMORY_MANAGER": "numba_alloc"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "selected" in out.stdout


def test_finalizer_is_harmless_after_reset_and_frees_before():
    from numba_alloc.emm import _free_block
    pool = Pool(SimulatedDevice(1 << 30))
    a, b = pool.malloc(100), pool.malloc(100)
    _free_block(pool, a)()
    assert pool.memory_allocated() == 512
    pool.reset()
    _free_block(pool, b)()          # after reset: no error, nothing changes
    assert pool.memory_allocated() == 0


def test_package_imports_under_the_cuda_simulator():
    code = ("import numba_alloc\n"
            "pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(1 << 20))\n"
            "print(pool.malloc(10).allocated_size)\n"
            "try:\n    numba_alloc.install()\nexcept RuntimeError as e:\n    print(e)\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "512"
    assert "simulator" in out.stdout
