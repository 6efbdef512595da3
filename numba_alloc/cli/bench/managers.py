"""The memory managers ``numba-alloc bench`` compares, and how a run reads
what each one reserves.

Numba fixes its manager when it creates a CUDA context, so each run is a
process whose environment names its manager (:meth:`Manager.environment`);
inside it, :func:`set_up_manager` sets the manager up before CUDA is first used
and :func:`gpu_probe` gives the probe that watches it.

A probe is told after every allocation (:meth:`after_alloc`) and at every
workload step (:meth:`checkpoint`) and then gives ``peak_reserved`` (bytes
the manager held at most) and ``fragmentation`` (numba_alloc only: 1 -
largest free block / free bytes in the pool, averaged over the steps).
"""

import dataclasses
import importlib.util
import os

SIMULATED = ("numba_alloc", "numba_alloc-defrag")


@dataclasses.dataclass(frozen=True)
class Manager:
    """A manager as a run's environment selects it. ``module`` is the value
    of NUMBA_CUDA_MEMORY_MANAGER (None: Numba's default), ``conf`` what is
    appended to NUMBA_ALLOC_CONF, ``requires`` the module that must be
    installed, ``manager_class`` the class Numba must end up using."""

    name: str
    label: str
    module: str | None
    manager_class: str
    conf: str | None = None
    requires: str | None = None

    def available(self):
        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    def environment(self, base):
        """``base`` (a mapping) with this manager selected."""
        env = {k: v for k, v in base.items() if k != "NUMBA_CUDA_MEMORY_MANAGER"}
        if self.module:
            env["NUMBA_CUDA_MEMORY_MANAGER"] = self.module
        if self.conf:
            conf = (base.get("NUMBA_ALLOC_CONF"), self.conf)
            env["NUMBA_ALLOC_CONF"] = ",".join(filter(None, conf))
        return env


MANAGERS = {m.name: m for m in (
    Manager("default", "Numba's default", None, "NumbaCUDAMemoryManager"),
    Manager("numba_alloc", "numba_alloc", "numba_alloc", "NumbaAllocManager", conf="defrag:false"),
    Manager("numba_alloc-defrag", "numba_alloc, defrag on", "numba_alloc", "NumbaAllocManager",
            conf="defrag:true"),
    Manager("rmm", "RMM pool", "rmm.allocators.numba", "RMMNumbaManager", requires="rmm"),
    Manager("cupy", "CuPy MemoryPool", "numba_alloc.workloads.cupy_manager", "CuPyPoolManager",
            requires="cupy"),
)}


def pool_fragmentation(pool):
    """1 - largest free block / free bytes of a numba_alloc pool (0 when
    nothing is free)."""
    free = [block["size"] for segment in pool.snapshot()["segments"]
            for block in segment["blocks"] if block["state"] == "inactive"]
    total = sum(free)
    return 1 - max(free) / total if total else 0.0


class PoolProbe:
    """A numba_alloc pool's exact peak reserved bytes (counted from now) and
    its fragmentation at each step."""

    def __init__(self, pool):
        self.pool = pool
        self.samples = []
        pool.reset_peaks()

    def after_alloc(self):
        pass

    def checkpoint(self):
        self.samples.append(pool_fragmentation(self.pool))

    def figures(self):
        stats = self.pool.memory_stats()
        return {"peak_reserved": self.pool.peak("reserved_bytes"),
                "fragmentation": sum(self.samples) / len(self.samples) if self.samples else 0.0,
                "pool": {key: stats[key] for key in (
                    "num_device_alloc", "num_device_free", "num_sync_all_streams",
                    "num_alloc_retries", "num_defragmentations", "bytes_defragged")}}


class SampledProbe:
    """The peak of ``read()`` (bytes the manager reserves), read after every
    allocation: reserved memory grows only when something is allocated."""

    def __init__(self, read):
        self.read = read
        self.peak = read()

    def after_alloc(self):
        self.peak = max(self.peak, self.read())

    def checkpoint(self):
        pass

    def figures(self):
        return {"peak_reserved": self.peak, "fragmentation": None}


def default_manager_holds(manager):
    """Bytes Numba's default manager (``manager``) holds from the driver:
    its live device allocations (cuMemAlloc) and those whose cuMemFree it
    still defers.
    (The driver's free memory is no measure: it moves in pages of 2 MiB and
    more, and small allocations often leave it unchanged.) O(live arrays)."""
    from numba.cuda.cudadrv.driver import AutoFreePointer
    live = sum(m.size for m in list(manager.allocations.values())
               if type(m) is AutoFreePointer)       # not its mapped or managed subclasses
    return live + manager.deallocations._size


def set_up_manager(name):
    """Set up manager ``name`` in this process before CUDA is first used.
    RMM: a pool resource that starts empty and grows as RMM grows it
    (RMM's default would reserve half the GPU at once)."""
    if name == "rmm":
        import rmm
        resource = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=0)
        rmm.mr.set_current_device_resource(resource)


def gpu_probe(name, context):
    """Release what the manager caches, then the probe for the measured run.
    Checks that Numba uses the manager the environment asked for."""
    manager = context.memory_manager
    expected = MANAGERS[name].manager_class
    if type(manager).__name__ != expected:
        selected = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER")
        raise RuntimeError(f"Numba uses {type(manager).__name__}, not {expected}: "
                           f"NUMBA_CUDA_MEMORY_MANAGER={selected}")
    if name == "default":
        manager.deallocations.clear()
        baseline = default_manager_holds(manager)
        return SampledProbe(lambda: default_manager_holds(manager) - baseline)
    if name.startswith("numba_alloc"):
        from ...api.functions import device_pool
        with device_pool() as pool:
            pool.empty_cache()
        return PoolProbe(pool)
    if name == "rmm":
        import rmm
        return SampledProbe(rmm.mr.get_current_device_resource().pool_size)
    if name == "cupy":
        manager.initialize()
        manager.pool.free_all_blocks()
        return SampledProbe(manager.pool.total_bytes)
    raise ValueError(f"unknown manager {name!r}")
