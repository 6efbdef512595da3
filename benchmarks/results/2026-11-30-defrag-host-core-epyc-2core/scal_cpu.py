import sys, json, time, numpy as np
sys.path.insert(0, "/work/main/benchmarks")
import numba_alloc; assert numba_alloc.__file__.startswith(sys.argv[1]), numba_alloc.__file__
import bench_defrag as bd, types
bd.time = types.SimpleNamespace(perf_counter=time.process_time)
out = bd.planner_scaling(False, 5)
from numba_alloc.policy._planner import plan
d = np.load("/tmp/prof/layout1.npz"); lay = [d[f"arr_{i}"] for i in range(6)]
n = len(lay[3]); moves = np.empty((n, 4), np.int64); emptied = np.empty(len(lay[0]), np.int64)
ts = []
for _ in range(7):
    t = time.process_time()
    for _ in range(50): plan(*lay, -1, 8, True, moves, emptied)
    ts.append((time.process_time() - t) / 50)
out["quarter_layout"] = sorted(ts)[3]
print(json.dumps({k: v for k, v in out.items() if k != "blocks"}))
