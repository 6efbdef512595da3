"""The evacuation of a compaction plan: which segments to empty, and where
their blocks go.

compaction_plan's first phase (policy/compaction.py), compiled: segments
and their live blocks as the arrays of a Layout, best fit from a set of
free ranges (policy/free_ranges.py). Sizes and addresses are int64 bytes.
Not thread safe; the pool plans under its lock.
"""

import numpy as np
from numba import njit

from . import free_ranges


@njit(cache=True)
def _usable_gaps(layout_start, layout_end, address, size, lo, hi, max_free, out_size, out_start):
    """The free ranges between blocks lo..hi of a segment (layout_start to
    layout_end) shorter than ``max_free`` (-1: any), written to the
    outputs; returns how many."""
    count, cursor = 0, layout_start
    for i in range(lo, hi + 1):
        edge = address[i] if i < hi else layout_end
        if edge > cursor and (max_free < 0 or edge - cursor < max_free):
            out_size[count], out_start[count] = edge - cursor, cursor
            count += 1
        if i < hi:
            cursor = address[i] + size[i]
    return count


@njit(cache=True)
def evacuate(segment_address, segment_size, first, address, size, max_free, live, any_fixed,
             most, moves, emptied, gone, arrival_owner, arrival_address, arrival_size):
    """Phase one of compaction_plan. The candidates (segments with live blocks,
    none pinned), the least live bytes first, are emptied into the smallest
    fitting free ranges of the receivers: the segments with pinned blocks,
    those with no live block (a smaller one may take a larger one's blocks)
    and the fullest candidates. So a candidate's free space is never filled
    by the evacuation of another. The fullest candidates start as receivers
    where the candidates' live bytes, from the least, meet the receivers'
    free bytes (a free segment's only when it is smaller than a candidate:
    filling one as large gives nothing back); one more becomes a receiver
    while a candidate's live bytes exceed the free bytes left. A candidate
    whose largest block fits no receiver's range stays; one whose blocks do
    not all fit ends the phase (the rest hold more live bytes). Writes (0,
    src, dst, size) move rows, emptied segments' addresses, ``gone`` and the
    arrivals (owner, address, size); returns (moves, emptied, arrivals)
    counts."""
    nseg, n = len(segment_address), len(address)
    # every segment's usable free ranges, in address order (so by start)
    gap_size = np.empty(n + nseg, np.int64)
    gap_start = np.empty(n + nseg, np.int64)
    gap_owner = np.empty(n + nseg, np.int64)
    gap_from = np.empty(nseg, np.int64)         # segment s's ranges: gap_from[s]..gap_to[s]
    gap_to = np.empty(nseg, np.int64)
    usable = np.zeros(nseg, np.int64)           # bytes of each segment's ranges
    ngaps = 0
    for s in np.argsort(segment_address):
        got = _usable_gaps(segment_address[s], segment_address[s] + segment_size[s], address,
                           size, first[s], first[s + 1], max_free,
                           gap_size[ngaps:], gap_start[ngaps:])
        gap_owner[ngaps:ngaps + got] = s
        usable[s] = gap_size[ngaps:ngaps + got].sum()
        gap_from[s], gap_to[s] = ngaps, ngaps + got
        ngaps += got
    by_live = np.argsort(live, kind="mergesort")
    candidate = by_live[(first[by_live + 1] > first[by_live]) & ~any_fixed[by_live]]
    ncand = len(candidate)
    empty = first[1:] == first[:-1]
    receives = any_fixed | empty
    # the first receivers: those, and candidate[hi:], where candidate[:k]'s
    # live bytes meet the free bytes of the pinned segments, of the free
    # ones smaller than a candidate, and their own
    above = usable[any_fixed].sum()
    if ncand:
        above += usable[empty & (segment_size < segment_size[candidate].max())].sum()
    below = k = 0
    hi = ncand
    while k < hi:
        if below + live[candidate[k]] <= above:
            below += live[candidate[k]]
            k += 1
        else:
            hi -= 1
            above += usable[candidate[hi]]
    receives[candidate[hi:]] = True
    keep = receives[gap_owner[:ngaps]]
    # adds over the set's life: later receivers' ranges, one remainder a take
    free = free_ranges.make(gap_size[:ngaps][keep], gap_start[:ngaps][keep],
                            gap_owner[:ngaps][keep], ngaps + n)
    free_bytes = usable[receives].sum()         # in the set
    taken = np.empty((most, 3), np.int64)       # (start, owner, block)
    count = nemptied = narrivals = 0
    for c in range(ncand):
        if c >= hi:
            break
        s = candidate[c]
        b_lo, b_hi = first[s], first[s + 1]
        if size[b_lo:b_hi].max() > free_ranges.largest(free):
            continue                            # no receiver takes its largest block: it stays
        while hi - 1 > c and free_bytes < live[s]:
            hi -= 1
            d = candidate[hi]
            for g in range(gap_from[d], gap_to[d]):
                free_ranges.add(free, gap_size[g], gap_start[g], d)
            free_bytes += usable[d]
        ntaken = 0
        for i in b_lo + np.argsort(-size[b_lo:b_hi], kind="mergesort"):   # largest first
            got_size, got_start, got_owner = free_ranges.take_at_least(free, size[i])
            if got_size < 0:
                break
            if got_size > size[i]:
                free_ranges.add(free, got_size - size[i], got_start + size[i], got_owner)
            taken[ntaken, 0], taken[ntaken, 1], taken[ntaken, 2] = got_start, got_owner, i
            ntaken += 1
        if ntaken < b_hi - b_lo:                # the set is not used again
            break
        gone[s] = True
        free_bytes -= live[s]
        emptied[nemptied] = segment_address[s]
        nemptied += 1
        for t in range(ntaken):
            i = taken[t, 2]
            moves[count, 0], moves[count, 1] = 0, address[i]
            moves[count, 2], moves[count, 3] = taken[t, 0], size[i]
            count += 1
            arrival_owner[narrivals] = taken[t, 1]
            arrival_address[narrivals], arrival_size[narrivals] = taken[t, 0], size[i]
            narrivals += 1
    return count, nemptied, narrivals
