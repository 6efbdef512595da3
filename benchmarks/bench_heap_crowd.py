"""Round trips to memory that a crowd of warps takes to malloc from the
device heap, without a GPU: the heap's own device functions
(``heap_malloc``) run as Python, one thread a warp of one lane, in lockstep
rounds: every running warp makes one access to ``meta`` (a load or an
atomic) a round, so the rounds a crowd takes stand for its round trips to
L2, what limits a GPU's fill when warps wait on each other.

``--resident`` warps run at once (a GPU holds a few thousand; Python
threads, a few hundred), ``--warps`` in all on a fresh heap, each asking
``--size`` bytes: one lane asking 512 B fills a 64 KiB page in 128 warps,
as a warp of 32 lanes asking 16 B does on a GPU. The floor is a bump
allocator, one atomic a warp (warps / resident rounds). Counts, not times:
the same on any machine, and a GPU runs the same source.

    python benchmarks/bench_heap_crowd.py [--warps 4096] [--resident 512] [--size 512]

``--checkout DIR`` runs another checkout's heap (its package first on the
path; this file's harness), to set a change beside the one before it.
"""

import argparse
import collections
import json
import os
import sys
import threading

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


class Lockstep:
    """Rounds of accesses: a thread's :meth:`access` returns once every
    running thread has asked for one in this round and at most ``serve``
    accesses to its address came before it in the round (L2 serves one
    address's requests one after another: a crowd on one word waits its
    turn; the others ask again next round). Served accesses then go on in
    any order, one at a time under the GIL and the atomics' lock."""

    def __init__(self, serve):
        self.serve = serve
        self.cond = threading.Condition()
        self.running = 0
        self.arrived = 0
        self.rounds = 0
        self.accesses = 0
        self.served = {}        # address -> accesses served this round
        self.by_address = collections.Counter()   # address -> accesses, waits included

    def _advance(self):
        self.rounds += 1
        self.arrived = 0
        self.served = {}
        self.cond.notify_all()

    def start(self):
        with self.cond:
            self.running += 1

    def stop(self):
        with self.cond:
            self.running -= 1
            if self.running and self.arrived == self.running:
                self._advance()

    def access(self, address):
        with self.cond:
            self.accesses += 1
            self.by_address[address] += 1
            while True:
                round_ = self.rounds
                self.arrived += 1
                if self.arrived == self.running:
                    self._advance()
                else:
                    while self.rounds == round_:
                        self.cond.wait()
                served = self.served.get(address, 0)
                if served < self.serve:
                    self.served[address] = served + 1
                    return


class WarpCuda:
    """``cuda`` for the heap's device functions, each thread the lowest lane
    of a warp (grid index 32 x its warp) whose ``lanes`` (1 or 32) all call
    together and ask the same: the lane that makes a group's accesses to
    memory (the others' loads of one word are the same request); every
    access waits for its round (:class:`Lockstep`)."""

    laneid = 0

    def __init__(self, step, lanes):
        self.mask = (1 << lanes) - 1
        self._local = threading.local()
        step_ = step

        class Atomics:
            def _op(fn):
                lock = threading.Lock()

                def call(self, array, index, *args):
                    step_.access(index)
                    with lock:
                        old = array[index]
                        array[index] = fn(old, *args)
                    return old
                return call
            add = _op(lambda old, v: old + v)
            max = _op(lambda old, v: max(old, v))
            or_ = _op(lambda old, v: old | v)
            and_ = _op(lambda old, v: old & v)
            exch = _op(lambda old, v: v)
            cas = _op(lambda old, expected, v: v if old == expected else old)
        self.atomic = Atomics()

    def set_warp(self, warp):
        self._local.warp = warp

    def grid(self, dim):
        return self._local.warp * 32

    def activemask(self):
        return self.mask

    @staticmethod
    def match_any_sync(mask, value):
        return mask

    @staticmethod
    def ballot_sync(mask, predicate):
        return mask if predicate else 0

    @staticmethod
    def shfl_sync(mask, value, src):
        return value

    @staticmethod
    def shfl_up_sync(mask, value, delta):
        return value

    @staticmethod
    def syncwarp(mask):
        pass

    @staticmethod
    def threadfence():
        pass

    @staticmethod
    def popc(x):
        return bin(int(x) & (2**64 - 1)).count("1")

    @staticmethod
    def ffs(x):
        return (int(x) & -int(x)).bit_length()


class HeapBytes:
    """What heap_malloc reads of the heap's bytes: their size."""

    def __init__(self, size):
        self.size = size


def fresh_meta(pages):
    """A fresh heap's bookkeeping (as DeviceHeap.reset writes it), the
    default classes."""
    from numba_alloc.device import heap_layout as layout
    meta = np.zeros(layout.meta_size(pages), np.int64)
    meta[layout.HEADER:layout.HEADER + pages] = layout.UNASSIGNED << layout.STATE_SHIFT
    meta[layout.NUM_CLASSES] = len(layout.DEFAULT_CLASSES)
    meta[layout.SIZE_BASE:layout.SIZE_BASE + len(layout.DEFAULT_CLASSES)] = \
        layout.DEFAULT_CLASSES
    return meta


def crowd(warps, resident, serve, lanes, malloc):
    """(rounds, accesses per malloc, the offsets) of ``warps`` warps,
    ``resident`` at a time, each calling ``malloc(lane, warp)`` (``lane``:
    the :class:`WarpCuda` it runs with, warps of ``lanes``), ``serve``
    accesses to one word a round."""
    from numba_alloc.device import heap_kernels as hk
    from numba_alloc.device import warp as warp_functions
    step = Lockstep(serve)
    lane = WarpCuda(step, lanes)
    saved = hk.cuda, warp_functions.cuda, hk._load

    def stepped_load(array, index):
        step.access(index)
        return array[index]
    hk.cuda = warp_functions.cuda = lane
    hk._load = stepped_load
    offsets = np.full(warps, -2, np.int64)
    taken = iter(range(warps))
    taking = threading.Lock()

    def worker():
        while True:
            with taking:
                warp = next(taken, None)
            if warp is None:
                break
            lane.set_warp(warp)
            offsets[warp] = malloc(lane, warp)
        step.stop()

    threads = [threading.Thread(target=worker) for _ in range(resident)]
    for _ in threads:
        step.start()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        hk.cuda, warp_functions.cuda, hk._load = saved
    return step.rounds, step.accesses / warps, offsets


def heap_crowd(warps, resident, serve, lanes, size, pages):
    """:func:`crowd` of the heap's ``heap_malloc`` of ``size`` bytes on a
    fresh heap of ``pages`` pages: (rounds, accesses per malloc, failed
    mallocs); checks that no two warps got one block."""
    from numba_alloc.device import heap_kernels as hk
    from numba_alloc.device import heap_layout as layout
    meta = fresh_meta(pages)
    data = HeapBytes(pages * layout.PAGE)
    rounds, accesses, offsets = crowd(warps, resident, serve, lanes,
                                      lambda lane, warp: hk.heap_malloc(data, meta, size))
    granted = offsets[offsets >= 0]
    assert len(np.unique(granted)) == len(granted), "two warps got one block"
    return rounds, accesses, int((offsets < 0).sum())


def bump_crowd(warps, resident, serve):
    """:func:`crowd` of the floor, one ``atomic.add`` a warp on one word:
    its rounds."""
    counter = np.zeros(1, np.int64)
    rounds, _, _ = crowd(warps, resident, serve, 1,
                         lambda lane, warp: lane.atomic.add(counter, 0, 1))
    return rounds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warps", type=int, default=4096)
    parser.add_argument("--resident", type=int, default=512)
    parser.add_argument("--size", type=int, nargs="+", default=[512, 8192])
    parser.add_argument("--pages", type=int, default=1024)
    parser.add_argument("--serve", type=int, default=32,
                        help="accesses to one word a round (default 32)")
    parser.add_argument("--lanes", type=int, choices=(1, 32), default=32,
                        help="lanes of a warp, all asking the same size (default 32)")
    parser.add_argument("--checkout", help="the checkout whose heap runs (default: this one)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.checkout) if args.checkout else os.path.dirname(HERE))
    floor = bump_crowd(args.warps, args.resident, args.serve)
    for size in args.size:
        rounds, accesses, failed = heap_crowd(args.warps, args.resident, args.serve,
                                              args.lanes, size, args.pages)
        print(json.dumps({"checkout": args.checkout or ".", "size": size, "warps": args.warps,
                          "lanes": args.lanes, "resident": args.resident, "pages": args.pages,
                          "serve": args.serve,
                          "rounds": rounds, "bump_rounds": floor,
                          "over_bump": round(rounds / floor, 2),
                          "accesses_per_malloc": round(accesses, 1), "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
