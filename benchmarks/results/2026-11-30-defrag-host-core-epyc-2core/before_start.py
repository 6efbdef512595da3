"""CPU time (process_time) of defragment(release=False) over the stand-in,
section 4's layout at a quarter size, stand-in kernel runs no-ops: from the
call to the first start_copies, and in all. argv[1]: the checkout."""
import sys, time, statistics, json
import numpy as np
sys.path.insert(0, "/work/main/benchmarks")
import standin
from standin.kernels import LaunchPlan
from numba import cuda
import numba_alloc
assert numba_alloc.__file__.startswith(sys.argv[1]), numba_alloc.__file__
from numba_alloc.policy import defrag
numba_alloc.install()
LaunchPlan.run = lambda self, *a, **k: None
import bench_defrag as bd
sizes = (np.random.default_rng(0).integers(bd.SMALLEST, bd.LARGEST, bd.ARRAYS) * 0.25).astype(np.int64)
with numba_alloc.device_pool() as pool:
    backend = pool.backend
clock = time.process_time
mark = {}
orig = backend.start_copies
def start_copies(phases, first):
    mark.setdefault("t", clock())
    return orig(phases, first)
backend.start_copies = start_copies
def setup():
    cuda.current_context().memory_manager.deallocations.clear()
    numba_alloc.empty_cache()
    arrays = [cuda.device_array(int(n), np.uint8) for n in sizes]
    del arrays[::2]
    cuda.current_context().memory_manager.deallocations.clear()
    with numba_alloc.device_pool() as p:
        p.synchronize()
    return arrays
before, total = [], []
for r in range(14):
    arrays = setup()
    mark.clear()
    t0 = clock()
    res = numba_alloc.defragment(release=False)
    t1 = clock()
    if r >= 2:
        before.append(mark["t"] - t0); total.append(t1 - t0)
    del arrays
print(json.dumps({"moves": res.blocks_moved, "bytes": res.bytes_moved,
                  "before_ms": statistics.median(before) * 1e3, "total_ms": statistics.median(total) * 1e3}))
