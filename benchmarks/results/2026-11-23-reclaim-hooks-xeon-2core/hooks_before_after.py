"""The reclaim hooks' host cost per stand-in launch (bench_reclaim's
_launch_hooks: best of 41 interleaved rounds of 300 launches) for the
package found at ROOT: python hooks_before_after.py ROOT (run from the
repository root; ROOT a checkout's folder holding numba_alloc/)."""
import sys
root = sys.argv[1]
sys.path.insert(0, 'benchmarks'); sys.path.insert(0, root)
import numba_alloc; assert numba_alloc.__file__.startswith(root)
import bench_reclaim
h = bench_reclaim._launch_hooks(300)
print(root, {k: round(v, 1) for k, v in h.items()}, round(h['with'] - h['without'], 1), round(h['with'] / h['without'], 3))
