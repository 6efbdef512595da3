"""The handle variants measured on 2026-11-23 (see README.md): the free+malloc
pair of bench_core.py's section 1 in thread CPU time (11 rounds
interleaved, median and min), for the pool as it was ("pool"), a handle
without address and allocated size ("noaddr": not a valid pool, dead
handles lose them), those kept at free instead of read at malloc ("snap":
what was adopted), two micro-changes ("micro": range check in the core, the
ticket passed whole) and the two compiled calls alone ("bare").

    PYTHONPATH=. python benchmarks/results/2026-11-23-lazy-import-handles-xeon-2core/handle_variants.py LIVE [KINDS]

Written against the pool before the change (its Block had address and
allocated_size slots).
"""
import os, sys, time, random, statistics, gc
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from bench_malloc import mixed_size
from minimal_pool import MinimalPool
from numba_alloc import Pool, SimulatedDevice, pool as P
from numba_alloc.block import Block
from numba_alloc.core import TABLE, NF

_new = object.__new__
_ROW_MASK, _ROW_BITS, _SIZE, _FAST_LIMIT = P._ROW_MASK, P._ROW_BITS, P._SIZE, P._FAST_LIMIT

class NoAddr(Pool):
    def malloc(self, nbytes):
        if (type(nbytes) is not int or not 0 <= nbytes < _FAST_LIMIT or self._guarded
                or self._deferred):
            return self._malloc(nbytes)
        ticket = self._try_take(self._p, nbytes)
        if ticket < 0:
            return self._malloc(nbytes)
        block = _new(Block)
        block._ticket = ticket
        block.pool = self
        block.size = nbytes
        self._handles[ticket & _ROW_MASK] = block
        return block

_TABLE_NF = None
class Snap(Pool):
    def malloc(self, nbytes):
        if (type(nbytes) is not int or not 0 <= nbytes < _FAST_LIMIT or self._guarded
                or self._deferred):
            return self._malloc(nbytes)
        ticket = self._try_take(self._p, nbytes)
        if ticket < 0:
            return self._malloc(nbytes)
        block = _new(Block)
        block._ticket = ticket
        block.pool = self
        block.size = nbytes
        block.address = None
        block.allocated_size = None
        self._handles[ticket & _ROW_MASK] = block
        return block
    def free(self, block):
        if not self._guarded:
            try:
                ticket = block._ticket
                row = ticket & _ROW_MASK
                handles = self._handles
                mine = handles[row] is block
            except (AttributeError, TypeError, IndexError):
                mine = False
            if mine:
                r, mv = TABLE + row * NF, self._mv
                block.address = mv[r]
                block.allocated_size = mv[r + _SIZE]
                handles[row] = None
                done = self._try_release(self._p, row, ticket >> _ROW_BITS)
                if done == 1:
                    return
                if done == 2:
                    self._close_full_batch()
                    return
        return Pool.free(self, block)

from numba import njit, types
from numba_alloc import core as C
@njit
def try_release_t(p, row, ticket):
    a = C._view(p)
    if a[C.H_BUSY]:
        return -1
    return C._release(a, row, ticket >> C.ROW_BITS)
_trt = try_release_t.compile((types.int64, types.int64, types.int64))
class Micro(Pool):
    def malloc(self, nbytes):
        if type(nbytes) is not int or self._guarded or self._deferred:
            return self._malloc(nbytes)
        ticket = self._try_take(self._p, nbytes)
        if ticket < 0:
            return self._malloc(nbytes)
        row = ticket & _ROW_MASK
        r, mv = TABLE + row * NF, self._mv
        block = _new(Block)
        block._ticket = ticket
        block.pool = self
        block.address = mv[r]
        block.allocated_size = mv[r + _SIZE]
        block.size = nbytes
        self._handles[row] = block
        return block
    def free(self, block):
        if not self._guarded:
            try:
                ticket = block._ticket
                row = ticket & _ROW_MASK
                handles = self._handles
                mine = handles[row] is block
            except (AttributeError, TypeError, IndexError):
                mine = False
            if mine:
                handles[row] = None
                done = _trt(self._p, row, ticket)
                if done == 1:
                    return
                if done == 2:
                    self._close_full_batch()
                    return
        return Pool.free(self, block)

class Bare(Pool):
    def malloc(self, nbytes):
        if (type(nbytes) is not int or not 0 <= nbytes < _FAST_LIMIT or self._guarded
                or self._deferred):
            return self._malloc(nbytes)
        ticket = self._try_take(self._p, nbytes)
        if ticket < 0:
            return self._malloc(nbytes)
        return ticket
    def free(self, ticket):
        if type(ticket) is not int:
            return Pool.free(self, ticket)
        done = self._try_release(self._p, ticket & _ROW_MASK, ticket >> _ROW_BITS)
        if done == 2:
            self._close_full_batch()

def runner(pool, live, pairs, seed):
    rng = random.Random(seed)
    blocks = [pool.malloc(mixed_size(rng)) for _ in range(live)]
    order = [(rng.randrange(live), mixed_size(rng)) for _ in range(pairs)]
    free, malloc = pool.free, pool.malloc
    for j, size in order[: pairs // 4]:
        free(blocks[j]); blocks[j] = malloc(size)
    def run():
        start = time.thread_time()
        for j, size in order:
            free(blocks[j]); blocks[j] = malloc(size)
        return (time.thread_time() - start) / pairs * 1e6
    return run

live = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else ["pool", "noaddr", "bare", "minimal"]
make = {"pool": lambda: Pool(SimulatedDevice(1 << 50)), "noaddr": lambda: NoAddr(SimulatedDevice(1 << 50)),
        "snap": lambda: Snap(SimulatedDevice(1 << 50)), "micro": lambda: Micro(SimulatedDevice(1 << 50)), "bare": lambda: Bare(SimulatedDevice(1 << 50)), "minimal": MinimalPool}
runners = {k: runner(make[k](), live, 100_000, live) for k in kinds}
times = {k: [] for k in kinds}
for r in range(11):
    for k in (kinds if r % 2 == 0 else kinds[::-1]):
        times[k].append(runners[k]())
for k in kinds:
    print(f"{k:8s} {statistics.median(times[k]):.2f} us  (min {min(times[k]):.2f})")
