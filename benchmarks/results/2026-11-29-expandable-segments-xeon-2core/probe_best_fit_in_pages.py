import sys, bisect, glob, os
import numpy as np
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/benchmarks')
from numba_alloc.observe.trace import read_rmm_log, ALLOCATE, DEALLOCATE
from headroom import rounded_peak
PAGE = 2 << 20
SMALL = 1 << 20
def run(events, page=PAGE):
    V = 1 << 44
    pools = {}
    def pool(k):
        if k not in pools:
            pools[k] = dict(free={0: V}, bysize=[(V, 0)], cnt={}, touched=[0])
        return pools[k]
    live = {}; live_bytes = 0; peak_live = 0; peak_phys = 0
    for e in events:
        if e.action == ALLOCATE:
            n = -(-e.size // 512) * 512
            k = 'small' if n <= SMALL else 'large'
            p = pool(k)
            i = bisect.bisect_left(p['bysize'], (n, -1))
            size, start = p['bysize'].pop(i)
            del p['free'][start]
            if size > n:
                p['free'][start + n] = size - n
                bisect.insort(p['bysize'], (size - n, start + n))
            for pg in range(start // page, (start + n - 1) // page + 1):
                c = p['cnt'].get(pg, 0)
                if c == 0: p['touched'][0] += 1
                p['cnt'][pg] = c + 1
            live[e.pointer] = (k, start, n)
            live_bytes += e.size
        elif e.action == DEALLOCATE and e.pointer in live:
            k, start, n = live.pop(e.pointer); p = pools[k]
            for pg in range(start // page, (start + n - 1) // page + 1):
                c = p['cnt'][pg] - 1
                if c == 0: p['touched'][0] -= 1; del p['cnt'][pg]
                else: p['cnt'][pg] = c
            # coalesce
            fr = p['free']
            # find left neighbour: need sorted starts; use linear search via dict of ends
            end = start + n
            if end in fr:
                sz = fr.pop(end); p['bysize'].remove((sz, end)); n += sz
            left = p.setdefault('ends', None)
            # build end map lazily
            lf = [s for s, z in fr.items() if s + z == start]
            if lf:
                s = lf[0]; sz = fr.pop(s); p['bysize'].remove((sz, s)); start = s; n += sz
            fr[start] = n; bisect.insort(p['bysize'], (n, start))
            live_bytes -= e.size if False else 0
        tot = sum(q['touched'][0] for q in pools.values()) * page
        peak_phys = max(peak_phys, tot)
    return peak_phys
for path in sys.argv[1:]:
    ev = read_rmm_log(path)
    # peak live as requested
    lv = {}; cur = 0; pk = 0
    for e in ev:
        if e.action == ALLOCATE: lv[e.pointer] = e.size; cur += e.size; pk = max(pk, cur)
        elif e.action == DEALLOCATE and e.pointer in lv: cur -= lv.pop(e.pointer)
    ph = run(ev)
    print(f"{os.path.basename(path):28s} peak_live {pk/2**20:8.1f} MiB  vmm {ph/pk:.3f}  bound {rounded_peak(ev)/pk:.3f}", flush=True)
