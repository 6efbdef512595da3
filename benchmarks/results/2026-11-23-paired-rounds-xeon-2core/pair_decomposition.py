"""Where a Pool pair's time goes: the pool, the minimal pool, the compiled
core alone (its two entry points over tickets kept in a list, no handles),
and the core plus a Block handle made per malloc and dropped per free (as
malloc makes one), in the same interleaved rounds (11 of 50,000 pairs);
ratios paired per round. Run from the repository root:
python benchmarks/results/2026-11-23-paired-rounds-xeon-2core/pair_decomposition.py LIVE
"""
import sys, gc, time, random, statistics
sys.path.insert(0, 'benchmarks'); sys.path.insert(0, '.')
from bench_malloc import mixed_size
from bench_core import _pairs_runner, interleaved, paired
from minimal_pool import MinimalPool
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.block import Block
from numba_alloc import core as C
live = int(sys.argv[1]); pairs = 50000
def core_runner(with_objects):
    pool = Pool(SimulatedDevice(1 << 50))
    rng = random.Random(live)
    blocks = [pool.malloc(mixed_size(rng)) for _ in range(live)]
    order = [(rng.randrange(live), mixed_size(rng)) for _ in range(pairs)]
    tickets = [b._ticket for b in blocks]
    objs = list(blocks)
    for b in blocks: pool._handles[b._ticket & C.ROW_MASK] = None
    tt, tr = pool._try_take, pool._try_release
    st = {'p': pool._p}
    new = object.__new__
    def run():
        p = st['p']
        t0 = time.perf_counter()
        for j, size in order:
            t = tickets[j]
            if with_objects:
                b = objs[j]; t = b._ticket
            d = tr(p, t & C.ROW_MASK, t >> C.ROW_BITS)
            if d == 2:
                pool._close_full_batch()
            nt = tt(p, size)
            if nt < 0:
                b = pool.malloc(size); nt = b._ticket; pool._handles[nt & C.ROW_MASK] = None
                p = st['p'] = pool._p
            if with_objects:
                b = new(Block); b._ticket = nt; b.pool = pool; b.size = size; b._address = b._allocated_size = None
                objs[j] = b
            tickets[j] = nt
        return (time.perf_counter()-t0)/pairs*1e6
    return run
r = {"pool": _pairs_runner(Pool(SimulatedDevice(1 << 50)), live, pairs, live),
     "min": _pairs_runner(MinimalPool(), live, pairs, live), "core": core_runner(False), "core+obj": core_runner(True)}
t = interleaved(r, 11)
print(live, {k: round(statistics.median(v), 2) for k, v in t.items()}, 'pool/min', round(paired(t,'pool','min')[0],2), 'core+obj/min', round(paired(t,'core+obj','min')[0],2), 'core/min', round(paired(t,'core','min')[0],2))
