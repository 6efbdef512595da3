"""One measured run: a workload under one memory manager, in this process.

    python -m numba_alloc.cli.bench.child '{"mode": "gpu"|"simulated",
        "manager": NAME, "workload": NAME, "scale": FLOAT}'

prints the run's figures as one JSON line (see :func:`measure`).

On a GPU the process's environment has already selected the manager; the
workload first runs once at its tiny size (compiling its kernels), the
manager's cache is emptied, and the measured run's own numeric check is
its self-check. On the simulated device the workload runs twice on fresh
numba_alloc pools: once at its tiny size with its kernels in Numba's CUDA
simulator (the self-check), then at the requested scale replaying only its
allocations (the figures).
"""

import json
import sys
import time

SIMULATED_CAPACITY = "80GiB"    # the simulated device is an 80 GiB GPU


def measure(module, arrays, scale):
    """Run ``module`` on ``arrays`` and return the figures: wall time
    (host checks left out), the allocation log's summary, the probe's
    figures, ``outcome`` ('completed' or why not) and ``self_check``
    ('passed', 'failed: ...', or 'not run' without data)."""
    from numba_alloc.workloads.arrays import OutOfMemory
    outcome, self_check = "completed", "passed" if arrays.computes else "not run"
    start = time.perf_counter_ns()
    try:
        module.run(arrays, scale)
        arrays.synchronize()
    except OutOfMemory as error:
        outcome, self_check = f"stopped: out of memory ({error})", "not reached"
    except AssertionError as error:
        outcome, self_check = "stopped: wrong result", f"failed: {error}"
    wall_ns = time.perf_counter_ns() - start - arrays.untimed_ns
    return {"wall_s": wall_ns / 1e9, **arrays.log.summary(), **arrays.probe.figures(),
            "outcome": outcome, "self_check": self_check}


def run_simulated(manager, module, scale):
    """Figures of ``module`` replayed on a simulated device, with the
    self-check of its tiny run through the CUDA simulator."""
    from numba_alloc.workloads import SIMULATOR_SCALE
    from numba_alloc.workloads.simulated import SimulatedArrays

    from ...policy.pool import Pool
    from ...backends.simulated import SimulatedDevice
    from .managers import PoolProbe
    defrag = manager == "numba_alloc-defrag"
    check = SimulatedArrays(Pool(SimulatedDevice(SIMULATED_CAPACITY), defrag=defrag), compute=True)
    start = time.perf_counter_ns()
    try:
        module.run(check, SIMULATOR_SCALE, module.SIMULATOR_STEPS)
        self_check = "passed"
    except AssertionError as error:
        self_check = f"failed: {error}"
    check_s = (time.perf_counter_ns() - start) / 1e9
    pool = Pool(SimulatedDevice(SIMULATED_CAPACITY), defrag=defrag)
    figures = measure(module, SimulatedArrays(pool, compute=False, probe=PoolProbe(pool)), scale)
    return {**figures, "self_check": self_check, "self_check_s": check_s,
            "device": f"simulated {SIMULATED_CAPACITY}"}


def run_gpu(manager, module, scale):
    """Figures of ``module`` on the GPU under the process's manager."""
    from . import managers
    managers.set_up_manager(manager)
    from numba import cuda
    from numba_alloc.workloads import SIMULATOR_SCALE
    from numba_alloc.workloads.gpu import CudaArrays
    module.run(CudaArrays(), SIMULATOR_SCALE, module.SIMULATOR_STEPS)     # compile, warm up
    cuda.synchronize()
    probe = managers.gpu_probe(manager, cuda.current_context())
    figures = measure(module, CudaArrays(probe), scale)
    from numba.cuda.cudadrv.driver import driver
    name = cuda.get_current_device().name
    return {**figures, "device": name.decode() if isinstance(name, bytes) else name,
            "cuda_driver": ".".join(map(str, driver.get_version()))}


def main(argv=None):
    spec = json.loads((argv or sys.argv[1:])[0])
    from numba_alloc.workloads import WORKLOADS
    module = WORKLOADS[spec["workload"]]
    run = run_simulated if spec["mode"] == "simulated" else run_gpu
    figures = run(spec["manager"], module, spec["scale"])
    print(json.dumps({**spec, **figures}))


if __name__ == "__main__":
    main()
