"""The most reserved with ample memory with numba_alloc's rules turned off one at a time, beside PyTorch's policy, on every trace. Run from the checkout's root."""
import json
import os
import sys

sys.path.insert(0, 'benchmarks')
from bench_traces import load, GROUPS, AMPLE, POLICIES, peak_live, as_pytorch, with_batch, NEVER
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.cli.replay import replay_trace
from numba_alloc.policy import core
def fit_off(p):
    p._core.mv[core.H_FIT_SEGMENTS] = 0; return p
def reuse_off(p):
    p._reuse_first = False; return p
V = {
  "ours": lambda d: Pool(d),
  "keep_whole off": lambda d: Pool(d, keep_whole_segments=False),
  "fitted off": lambda d: fit_off(Pool(d)),
  "both off": lambda d: fit_off(Pool(d, keep_whole_segments=False)),
  "both off, reuse-first off": lambda d: reuse_off(fit_off(Pool(d, keep_whole_segments=False))),
  "PyTorch's": POLICIES["PyTorch's"],
}
print(f"{'trace':<28}" + "".join(f"{k:>27}" for k in V))
for g, paths in GROUPS.items():
    print("==", g)
    for p in paths():
        ev = load(p); peak = peak_live(ev)
        row = [replay_trace(ev, f(SimulatedDevice(AMPLE * peak))).peak_reserved / peak for f in V.values()]
        print(f"{os.path.basename(p):<28}" + "".join(f"{r:>26.3f}x" for r in row), flush=True)
