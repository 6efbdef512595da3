"""Experiment: keep_whole variants on a group of traces."""
import sys, os, json, time
HERE = os.path.dirname(os.path.abspath(__file__)); ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks")); sys.path.insert(0, ROOT)
import bench_traces as bt
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.policy import segments as S, core as C
from numba_alloc.cli.replay import replay_trace

orig = S.Segments._reclaim_and_grow
def split_first(self, size, kind, nbytes):
    mv = self._core.mv
    keep = mv[C.H_KEEP_WHOLE]
    if kind == 1 and keep:
        mv[C.H_KEEP_WHOLE] = 0
        try:
            block = self._take(nbytes)
        finally:
            mv[C.H_KEEP_WHOLE] = keep
        if block is not None:
            return block
    return orig(self, size, kind, nbytes)

variant = sys.argv[1]
if variant == "split":
    S.Segments._reclaim_and_grow = split_first
kw = {"keep_whole_segments": False} if variant == "kwoff" else {}
bt.POLICIES["defrag"] = lambda d: Pool(d, defrag=True, **kw)
bt.POLICIES["no defrag"] = lambda d: Pool(d, **kw)
out = {}
for path in sys.argv[2:]:
    t = time.time()
    events = bt.load(path); peak = bt.peak_live(events)
    r = {}
    for pol in ("defrag", "no defrag"):
        ratio, _ = bt.smallest_ratio(events, pol, peak)
        r[pol] = ratio
    pool = bt.POLICIES["no defrag"](SimulatedDevice(bt.AMPLE * peak))
    rep = replay_trace(events, pool)
    r["ample"] = rep.peak_reserved / peak
    if r["defrag"]:
        pool = bt.POLICIES["defrag"](SimulatedDevice(round(r["defrag"] * peak)))
        rep = replay_trace(events, pool)
        r["tight_calls"] = pool.stats.num_device_alloc + pool.stats.num_device_free
        r["tight_us"] = rep.host_us_per_op - (rep.device_us_per_op or 0)
        pool = bt.POLICIES["defrag"](SimulatedDevice(bt.AMPLE * peak))
        rep = replay_trace(events, pool)
        r["ample_us"] = rep.host_us_per_op - (rep.device_us_per_op or 0)
    r["s"] = round(time.time() - t)
    out[os.path.basename(path)] = r
    print(variant, os.path.basename(path), json.dumps(r), flush=True)
