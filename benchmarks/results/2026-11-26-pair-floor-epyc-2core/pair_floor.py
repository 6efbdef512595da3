"""How far below the Pool's free+malloc pair its hot path can go while a
Python handle is made per block: the Pool, the minimal pool, and four
stripped variants, interleaved in the same rounds (bench_core's method),
ratios paired per round. Run from the repository root:

    python benchmarks/results/2026-11-26-pair-floor-epyc-2core/pair_floor.py LIVE [ROUNDS]

The variants break contracts the Pool keeps, on purpose: they are floors,
not candidates.

* ``no-keep``: free does not keep the address and allocated size in the
  handle (a dead handle's values are lost);
* ``no-registry``: no row -> handle registry (copies of a handle are not
  refused; defragmentation and reclaim cannot find a row's handle);
* ``neither``: both removed; free is one attribute read and one compiled
  call;
* ``core+handle``: no Pool method at all: the two compiled entry points
  called inline, plus a Block made per malloc and dropped per free;
* ``core``: the two compiled entry points inline over tickets in a list,
  no handle object.
"""
import random
import statistics
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
from bench_core import _pairs_runner, interleaved, paired  # noqa: E402
from bench_malloc import mixed_size  # noqa: E402
from minimal_pool import MinimalPool  # noqa: E402

from numba_alloc import Pool, SimulatedDevice  # noqa: E402
from numba_alloc import core as C  # noqa: E402
from numba_alloc.block import Block  # noqa: E402

_new = object.__new__
RM, RB, TABLE, NF, SIZE = C.ROW_MASK, C.ROW_BITS, C.TABLE, C.NF, C.SIZE


class NoKeep(Pool):
    def free(self, block):
        ticket = block._ticket
        row = ticket & RM
        handles = self._handles
        if handles[row] is block:
            handles[row] = None
            done = self._try_release(self._p, row, ticket >> RB)
            if done == 1:
                return
            if done == 2:
                return self._close_full_batch()
        raise RuntimeError("variant: slow path not modelled")


class NoRegistry(Pool):
    def malloc(self, nbytes):
        if type(nbytes) is not int or self._guarded or self._deferred:
            return self._malloc(nbytes)
        ticket = self._try_take(self._p, nbytes)
        if ticket < 0:
            return self._malloc(nbytes, ticket == -1)
        block = _new(Block)
        block._ticket = ticket
        block.pool = self
        block.size = nbytes
        block._address = block._allocated_size = None
        return block

    def free(self, block):
        ticket = block._ticket
        row = ticket & RM
        r, mv = TABLE + row * NF, self._mv
        block._address, block._allocated_size = mv[r], mv[r + SIZE]
        done = self._try_release(self._p, row, ticket >> RB)
        if done == 1:
            return
        if done == 2:
            return self._close_full_batch()
        raise RuntimeError("variant: slow path not modelled")


class Neither(NoRegistry):
    def free(self, block):
        ticket = block._ticket
        done = self._try_release(self._p, ticket & RM, ticket >> RB)
        if done == 1:
            return
        if done == 2:
            return self._close_full_batch()
        raise RuntimeError("variant: slow path not modelled")


def inline_runner(live, pairs, with_handles):
    """The compiled entry points called inline (no Pool method)."""
    pool = Pool(SimulatedDevice(1 << 50))
    rng = random.Random(live)
    blocks = [pool.malloc(mixed_size(rng)) for _ in range(live)]
    order = [(rng.randrange(live), mixed_size(rng)) for _ in range(pairs)]
    tickets = [b._ticket for b in blocks]
    for b in blocks:
        pool._handles[b._ticket & RM] = None
    take, release = pool._try_take, pool._try_release
    state = {"p": pool._p}

    def run():
        import time
        p = state["p"]
        start = time.perf_counter()
        for j, size in order:
            t = blocks[j]._ticket if with_handles else tickets[j]
            if release(p, t & RM, t >> RB) == 2:
                pool._close_full_batch()
            t = take(p, size)
            if t < 0:                      # grow: through the pool, then inline again
                b = pool.malloc(size)
                t = b._ticket
                pool._handles[t & RM] = None
                p = state["p"] = pool._p
            if with_handles:
                b = _new(Block)
                b._ticket = t
                b.pool = pool
                b.size = size
                b._address = b._allocated_size = None
                blocks[j] = b
            else:
                tickets[j] = t
        return (time.perf_counter() - start) / pairs * 1e6
    return run


def main():
    live = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 11
    pairs = 50_000

    def pool(cls):
        return _pairs_runner(cls(SimulatedDevice(1 << 50)), live, pairs, live)

    runners = {"Pool": pool(Pool), "minimal": _pairs_runner(MinimalPool(), live, pairs, live),
               "no-keep": pool(NoKeep), "no-registry": pool(NoRegistry),
               "neither": pool(Neither), "core+handle": inline_runner(live, pairs, True),
               "core": inline_runner(live, pairs, False)}
    times = interleaved(runners, rounds)
    print(f"{live:>7} live  " + "  ".join(
        f"{name} {statistics.median(t):.2f} us ({paired(times, name, 'minimal')[0]:.2f}x)"
        for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
