"""Round trips to memory that a crowd of warps takes to malloc from the
device heap, without a GPU: a model of what limits a GPU's fill, warps
waiting on each other's accesses to the same words.

The heap's own device functions (``heap_malloc``) run as Python, a thread
for each warp's leader, in lockstep rounds: every running warp makes one
access to the heap's bookkeeping (a load or an atomic) a round, and one
word serves at most ``--serve`` accesses a round (L2 serves an address's
requests one after another; the others ask again next round).
``--resident`` warps run at once (a GPU holds a few thousand; Python
threads, a few hundred: ``--serve`` a quarter of them stands for an H200,
whose L2 serves one word about once a nanosecond, some 700 times in a
round trip), ``--warps`` in all, on a fresh heap of ``--pages`` pages,
each of ``--lanes`` lanes (1 or 32, all asking ``--size`` bytes; the
leader makes the group's accesses). The floor is a bump allocator, one
atomic a warp on one word, in the same model. Prints, per size, the rounds
beside the floor's and the accesses a malloc, also by kind of word.
Counts, not times: the same on any machine; they rank designs, and a GPU
measures them (``numba-alloc bench --heap``).

    python benchmarks/bench_heap_crowd.py [--warps 4096] [--resident 512] [--serve 128]
        [--pages 2048] [--lanes 32] [--size 16 64 256]

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
        self.by_address = collections.Counter()   # address -> accesses

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


class SteppedAtomics:
    """The atomics the heap uses, each waiting for its round
    (:class:`Lockstep`), then done under one lock (so that an ``add`` and a
    ``cas`` on one word cannot interleave)."""

    def __init__(self, step):
        self._step = step
        self._lock = threading.Lock()

    def _apply(self, array, index, update):
        self._step.access(index)
        with self._lock:
            old = array[index]
            array[index] = update(old)
        return old

    def add(self, array, index, value):
        return self._apply(array, index, lambda old: old + value)

    def max(self, array, index, value):
        return self._apply(array, index, lambda old: max(old, value))

    def or_(self, array, index, value):
        return self._apply(array, index, lambda old: old | value)

    def and_(self, array, index, value):
        return self._apply(array, index, lambda old: old & value)

    def exch(self, array, index, value):
        return self._apply(array, index, lambda old: value)

    def cas(self, array, index, expected, value):
        return self._apply(array, index, lambda old: value if old == expected else old)


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
        self.atomic = SteppedAtomics(step)

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
    """(the :class:`Lockstep` run, the offsets) of ``warps`` warps,
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
    return step, offsets


def word_kind(index, pages):
    """What word ``index`` of a heap's ``meta`` (of ``pages`` pages) is."""
    from numba_alloc.device import heap_layout as layout
    if index in (layout.BYTES_IN_USE, layout.PEAK_BYTES_IN_USE):
        return ("bytes in use", "peak")[index]
    if layout.HINT_BASE <= index < layout.SIZE_BASE:
        return "hints"
    if index < layout.HEADER:
        return "other counters"
    if index < layout.HEADER + pages:
        return "page words"
    if index < layout.HEADER + 2 * pages:
        return "run lengths"
    return "bitmaps"


def heap_crowd(warps, resident, serve, lanes, size, pages):
    """:func:`crowd` of the heap's ``heap_malloc`` of ``size`` bytes on a
    fresh heap of ``pages`` pages: (rounds, accesses per malloc, failed
    mallocs, accesses per malloc by :func:`word_kind`); checks that no two
    warps got one block."""
    from numba_alloc.device import heap_kernels as hk
    from numba_alloc.device import heap_layout as layout
    meta = fresh_meta(pages)
    data = HeapBytes(pages * layout.PAGE)
    step, offsets = crowd(warps, resident, serve, lanes,
                          lambda lane, warp: hk.heap_malloc(data, meta, size))
    granted = offsets[offsets >= 0]
    assert len(np.unique(granted)) == len(granted), "two warps got one block"
    kinds = collections.Counter()
    for index, n in step.by_address.items():
        kinds[word_kind(index, pages)] += n
    return (step.rounds, step.accesses / warps, int((offsets < 0).sum()),
            {kind: round(n / warps, 2) for kind, n in sorted(kinds.items())})


def bump_crowd(warps, resident, serve):
    """:func:`crowd` of the floor, one ``atomic.add`` a warp on one word:
    its rounds."""
    counter = np.zeros(1, np.int64)
    step, _ = crowd(warps, resident, serve, 1, lambda lane, warp: lane.atomic.add(counter, 0, 1))
    return step.rounds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warps", type=int, default=4096)
    parser.add_argument("--resident", type=int, default=512)
    parser.add_argument("--size", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--pages", type=int, default=2048)
    parser.add_argument("--serve", type=int, default=128,
                        help="accesses to one word a round (default 128: a quarter of the "
                             "warps running)")
    parser.add_argument("--lanes", type=int, choices=(1, 32), default=32,
                        help="lanes of a warp, all asking the same size (default 32)")
    parser.add_argument("--checkout", help="the checkout whose heap runs (default: this one)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.checkout) if args.checkout else os.path.dirname(HERE))
    floor = bump_crowd(args.warps, args.resident, args.serve)
    for size in args.size:
        rounds, accesses, failed, by_word = heap_crowd(args.warps, args.resident, args.serve,
                                                       args.lanes, size, args.pages)
        print(json.dumps({"checkout": args.checkout or ".", "size": size, "warps": args.warps,
                          "lanes": args.lanes, "resident": args.resident, "pages": args.pages,
                          "serve": args.serve,
                          "rounds": rounds, "bump_rounds": floor,
                          "over_bump": round(rounds / floor, 2),
                          "accesses_per_malloc": round(accesses, 1), "failed": failed,
                          "accesses_by_word": by_word}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
