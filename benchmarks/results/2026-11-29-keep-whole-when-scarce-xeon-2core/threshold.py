"""keep whole only while the pool has reserved at least FRACTION of its limit."""
import sys, os, runpy
HERE = os.path.dirname(os.path.abspath(__file__)); ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks")); sys.path.insert(0, ROOT)
from numba_alloc.policy import segments as S, core as C, pool as P
FRACTION = float(sys.argv.pop(1))

def update(self):
    on = self._settings.keep_whole_segments and \
        self.stats.current("reserved_bytes") >= FRACTION * self._limit
    self._core.mv[C.H_KEEP_WHOLE] = int(on)

oa, orl = S.Segments._add_segment, S.Segments._release_segment
def add(self, *a):
    r = oa(self, *a); update(self); return r
def rel(self, *a):
    r = orl(self, *a); update(self); return r
S.Segments._add_segment, S.Segments._release_segment = add, rel
okw = P.Pool._kept_whole_above
def kwa(self, size, kind):
    if not self._core.mv[C.H_KEEP_WHOLE]:
        return None
    return okw(self, size, kind)
P.Pool._kept_whole_above = kwa
sys.argv[1] = "base"
runpy.run_path(os.path.join(HERE, "variants.py"), run_name="__main__")
