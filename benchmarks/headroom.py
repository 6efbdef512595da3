"""Headroom: what the best non-moving policy could do on a trace, bracketed.

A non-moving allocator places each block at an address it keeps until the
block is freed. Whatever it knows, it holds every live block at once, each
rounded up to the pool's 512 B, so it needs at least

    bound = the most bytes the live blocks hold at once, each rounded up to 512 B

(:func:`rounded_peak`; a moving one too). It may need more: at a request
the free bytes can suffice with no gap large enough. How much more depends
on the arrangement, not on a figure of the trace alone: an allocator that
knew every block's lifetime could keep a gap ready for each large request
(so the moment of the largest request bounds nothing beyond the live
bytes then), and such a clairvoyant offline planner often reaches the
bound. So the best non-moving policy is bracketed instead: at least the
bound, at most an arrangement one can build of the whole trace.
:func:`offline_placement` builds one: greedy by size, best fit (the largest
blocks first, each at the smallest gap that holds it among the blocks
already placed whose lifetimes overlap its own; Pisarchyk and Lee,
"Efficient memory management for deep neural net inference", 2020), and
three variants, keeping the smallest. When the two are close, a policy's
gap above them is the policy's, not the trace's; a policy between them
may or may not be beaten. Moving blocks (defragmentation) could reach the
bound itself.
"""

import numba
import numpy as np

from numba_alloc.observe.trace import ALLOCATE, DEALLOCATE

ROUND = 512         # the pool rounds every block to this (numba_alloc.policy.sizes.ROUND)


def lifetimes(events, rounding=ROUND):
    """(starts, ends, sizes), int64 arrays, one entry per allocation of
    ``events``: the indices of its allocate and of its free (len(events)
    if never freed) and its size rounded up to ``rounding``. A free of a
    pointer never allocated is skipped; an allocation at a pointer still
    live ends the older block there (its free was lost)."""
    starts, ends, sizes, live = [], [], [], {}
    for i, e in enumerate(events):
        if e.action == ALLOCATE:
            if e.pointer in live:
                ends[live.pop(e.pointer)] = i
            live[e.pointer] = len(starts)
            starts.append(i)
            ends.append(len(events))
            sizes.append(-(-e.size // rounding) * rounding)
        elif e.action == DEALLOCATE and e.pointer in live:
            ends[live.pop(e.pointer)] = i
    return (np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
            np.array(sizes, dtype=np.int64))


def rounded_peak(events, rounding=ROUND):
    """The most bytes ``events``' live blocks hold at once, each rounded
    up to ``rounding``: no non-moving policy needs less."""
    starts, ends, sizes = lifetimes(events, rounding)
    change = np.zeros(len(events) + 1, dtype=np.int64)
    np.add.at(change, starts, sizes)
    np.add.at(change, ends, -sizes)
    return int(np.cumsum(change).max(initial=0))


# the orders offline_placement tries, each with best fit and first fit where it helps
ORDERS = {
    "size": lambda starts, ends, sizes: np.lexsort((starts, -sizes)),
    "lifetime": lambda starts, ends, sizes: np.lexsort((starts, -sizes, -(ends - starts))),
    "area": lambda starts, ends, sizes: np.lexsort((starts, -sizes * (ends - starts))),
}
TRIES = (("size", True), ("size", False), ("lifetime", True), ("area", False))


def offline_placement(events, rounding=ROUND):
    """(bytes, offsets): an arrangement of ``events``' blocks (rounded up to
    ``rounding``) in one arena, no two blocks whose lifetimes overlap
    sharing a byte, and the arena's size, its highest block's end: the
    smallest of greedy placements in the orders of TRIES (largest first,
    longest-lived first, largest size x lifetime first), each block at the
    smallest gap that holds it among the blocks already placed whose
    lifetimes overlap its own (best fit) or the lowest (first fit), else
    above them all. O(blocks^2) time, compiled by Numba: about a second
    for 20,000 blocks on a 2-core VM."""
    starts, ends, sizes = lifetimes(events, rounding)
    best = None
    for order, best_fit in TRIES:
        offsets = np.zeros(len(sizes), dtype=np.int64)
        top = _place(starts, ends, sizes, ORDERS[order](starts, ends, sizes), best_fit, offsets)
        if best is None or top < best[0]:
            best = (int(top), offsets)
    return best if best else (0, np.zeros(0, dtype=np.int64))


@numba.njit(cache=False)
def _place(starts, ends, sizes, order, best_fit, offsets):
    """Place the blocks in ``order`` (their offsets into ``offsets``);
    the arena's size."""
    n = len(order)
    placed = np.empty(n, dtype=np.int64)        # blocks placed, in placing order
    lows, highs = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    top = 0
    for count in range(n):
        block = order[count]
        s, e, size = starts[block], ends[block], sizes[block]
        found = 0
        for i in range(count):
            other = placed[i]
            if starts[other] < e and ends[other] > s:
                lows[found], highs[found] = offsets[other], offsets[other] + sizes[other]
                found += 1
        offset = 0
        if found:
            by_low = np.argsort(lows[:found], kind="mergesort")
            covered, chosen, chosen_gap = 0, -1, 0
            for j in by_low:
                gap = lows[j] - covered
                if gap >= size and (chosen < 0 or (best_fit and gap < chosen_gap)):
                    chosen, chosen_gap = covered, gap
                    if not best_fit:
                        break
                covered = max(covered, highs[j])
            offset = chosen if chosen >= 0 else covered
        offsets[block] = offset
        placed[count] = block
        top = max(top, offset + size)
    return top
