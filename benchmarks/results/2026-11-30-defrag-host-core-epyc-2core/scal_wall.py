import sys, json
sys.path.insert(0, "/work/main/benchmarks")
import numba_alloc; assert numba_alloc.__file__.startswith(sys.argv[1]), numba_alloc.__file__
import bench_defrag as bd
out = bd.planner_scaling(False, 5)
print(json.dumps({k: v for k, v in out.items() if k != "blocks"}))
