# The evacuation of a compaction plan (included by _planner.pyx): which
# segments to empty, and where their blocks go. compaction_plan's first
# phase over a Layout's arrays, best fit from a FreeRanges set
# (free_ranges.pxi). Sizes and addresses are int64 bytes. Not thread safe;
# the pool plans under its lock.


cdef int64_t _usable_gaps(int64_t layout_start, int64_t layout_end,
                          const int64_t[::1] address, const int64_t[::1] size,
                          int64_t lo, int64_t hi, int64_t max_free,
                          int64_t[::1] out_size, int64_t[::1] out_start,
                          int64_t at) noexcept nogil:
    """The free ranges between blocks lo..hi of a segment (layout_start to
    layout_end) shorter than ``max_free`` (-1: any), written to the outputs
    from index ``at``; returns how many."""
    cdef int64_t count = 0, cursor = layout_start, i, edge
    for i in range(lo, hi + 1):
        edge = address[i] if i < hi else layout_end
        if edge > cursor and (max_free < 0 or edge - cursor < max_free):
            out_size[at + count], out_start[at + count] = edge - cursor, cursor
            count += 1
        if i < hi:
            cursor = address[i] + size[i]
    return count


cdef (int64_t, int64_t, int64_t) _evacuate(
        const int64_t[::1] segment_address, const int64_t[::1] segment_size,
        const int64_t[::1] first, const int64_t[::1] address, const int64_t[::1] size,
        int64_t max_free, int64_t[::1] live, unsigned char[::1] any_fixed, int64_t most,
        bint charge_free, int64_t[:, ::1] moves, int64_t[::1] emptied, unsigned char[::1] gone,
        int64_t[::1] arrival_owner, int64_t[::1] arrival_address, int64_t[::1] arrival_size):
    """Phase one of compaction_plan. The candidates (segments with live blocks,
    none pinned), the least live bytes first, are emptied into the smallest
    fitting free ranges of the receivers: the segments with pinned blocks,
    those with no live block (a smaller one may take a larger one's blocks)
    and the fullest candidates. So a candidate's free space is never filled
    by the evacuation of another. The fullest candidates start as receivers
    where the candidates' live bytes, from the least, meet the receivers'
    free bytes (a free segment's only when it is smaller than a candidate:
    filling one as large gives nothing back); one more becomes a receiver
    while a candidate's live bytes exceed the free bytes left. With
    ``charge_free`` (the caller gives back the segments with no live block
    that receive nothing, or keeps them whole), such a segment costs its
    size once a block arrives, and its range is kept apart: a block goes
    into the other receivers' ranges when one fits, else into the smallest
    such segment that fits while their sizes together stay below the
    candidate's own, so that emptying it gives bytes back (passing every
    range of such segments for each block, as until 2026-11-30, took 37 ms
    for 1,190 blocks); a candidate that fits only so stays, its takes
    undone. A
    candidate whose largest block fits no receiver's range stays; one whose
    blocks do not all fit otherwise ends the phase (the rest hold more live
    bytes). Writes (0,
    src, dst, size) move rows, emptied segments' addresses, ``gone`` and the
    arrivals (owner, address, size); returns (moves, emptied, arrivals)
    counts."""
    cdef int64_t nseg = segment_address.shape[0], n = address.shape[0]
    # every segment's usable free ranges, in address order (so by start)
    cdef int64_t[::1] gap_size = np.empty(n + nseg, np.int64)
    cdef int64_t[::1] gap_start = np.empty(n + nseg, np.int64)
    cdef int64_t[::1] gap_owner = np.empty(n + nseg, np.int64)
    cdef int64_t[::1] gap_from = np.empty(nseg, np.int64)   # segment s's: gap_from[s]..gap_to[s]
    cdef int64_t[::1] gap_to = np.empty(nseg, np.int64)
    cdef int64_t[::1] usable = np.zeros(nseg, np.int64)     # bytes of each segment's ranges
    cdef int64_t ngaps = 0, got, s, g, k, i, c, d, t, hi, ncand, b_lo, b_hi, ntaken, largest
    cdef int64_t[::1] by_address = np.argsort(np.asarray(segment_address))
    for k in range(nseg):
        s = by_address[k]
        got = _usable_gaps(segment_address[s], segment_address[s] + segment_size[s], address,
                           size, first[s], first[s + 1], max_free, gap_size, gap_start, ngaps)
        for g in range(ngaps, ngaps + got):
            gap_owner[g] = s
            usable[s] += gap_size[g]
        gap_from[s], gap_to[s] = ngaps, ngaps + got
        ngaps += got
    # the candidates, least live bytes first (stable)
    cdef int64_t[::1] by_live = np.empty(max(nseg, 1), np.int64)
    cdef int64_t[::1] scratch = np.empty(max(nseg, most, 1), np.int64)
    for s in range(nseg):
        by_live[s] = s
    _argsort(&live[0] if nseg else NULL, &by_live[0], &scratch[0], nseg)
    cdef int64_t[::1] candidate = np.empty(max(nseg, 1), np.int64)
    ncand = 0
    for k in range(nseg):
        s = by_live[k]
        if first[s + 1] > first[s] and not any_fixed[s]:
            candidate[ncand] = s
            ncand += 1
    cdef unsigned char[::1] receives = np.zeros(max(nseg, 1), np.uint8)
    cdef int64_t above = 0, below = 0, largest_candidate = 0
    for s in range(nseg):
        if any_fixed[s] or first[s + 1] == first[s]:
            receives[s] = 1
        if any_fixed[s]:
            above += usable[s]
    # the first receivers: those, and candidate[hi:], where candidate[:k]'s
    # live bytes meet the free bytes of the pinned segments, of the free
    # ones smaller than a candidate, and their own
    if ncand:
        for c in range(ncand):
            largest_candidate = max(largest_candidate, segment_size[candidate[c]])
        for s in range(nseg):
            if first[s + 1] == first[s] and segment_size[s] < largest_candidate:
                above += usable[s]
    k = 0
    hi = ncand
    while k < hi:
        if below + live[candidate[k]] <= above:
            below += live[candidate[k]]
            k += 1
        else:
            hi -= 1
            above += usable[candidate[hi]]
    for c in range(hi, ncand):
        receives[candidate[c]] = 1
    # a segment with no live block nor arrival yet: its first arrival costs its size
    cdef unsigned char[::1] unopened = np.zeros(max(nseg, 1), np.uint8)
    for s in range(nseg):
        if charge_free and first[s + 1] == first[s]:
            unopened[s] = 1
    # the receivers' ranges, and apart those of the unopened ones (whole
    # segments: the smallest that fits costs least); adds over the sets'
    # lives: later receivers' ranges, a remainder a take, a take undone
    owners = np.asarray(gap_owner[:ngaps])
    keep = np.asarray(receives)[owners].astype(bool)
    apart = keep & np.asarray(unopened)[owners].astype(bool)
    keep &= ~apart
    cdef FreeRanges free = make(np.asarray(gap_size[:ngaps])[keep],
                                np.asarray(gap_start[:ngaps])[keep], owners[keep], ngaps + 2 * n)
    cdef FreeRanges spare = make(np.asarray(gap_size[:ngaps])[apart],
                                 np.asarray(gap_start[:ngaps])[apart], owners[apart], 2 * n)
    cdef int64_t free_bytes = 0                 # in the sets
    for s in range(nseg):
        if receives[s]:
            free_bytes += usable[s]
    cdef int64_t[::1] opened = np.empty(max(most, 1), np.int64)    # by this candidate's blocks
    cdef int64_t[::1] got_size = np.empty(max(most, 1), np.int64)  # each take's range size
    cdef int64_t nopened, cost
    cdef bint fits, dear
    # (start, owner, block, whether the range was a spare: an unopened segment's)
    cdef int64_t[:, ::1] taken = np.empty((max(most, 1), 4), np.int64)
    cdef int64_t[::1] negative = np.empty(max(most, 1), np.int64)       # -size, the sort key
    cdef int64_t[::1] order = np.empty(max(most, 1), np.int64)
    cdef int64_t got_range[3]
    cdef int64_t count = 0, nemptied = 0, narrivals = 0
    for c in range(ncand):
        if c >= hi:
            break
        s = candidate[c]
        b_lo, b_hi = first[s], first[s + 1]
        largest = 0
        for i in range(b_lo, b_hi):
            largest = max(largest, size[i])
        if largest > max(free.largest_range(), spare.largest_range()):
            continue                            # no receiver takes its largest block: it stays
        while hi - 1 > c and free_bytes < live[s]:
            hi -= 1
            d = candidate[hi]
            for g in range(gap_from[d], gap_to[d]):
                free.add_range(gap_size[g], gap_start[g], d)
            free_bytes += usable[d]
        for i in range(b_hi - b_lo):            # largest first, stably
            negative[i] = -size[b_lo + i]
            order[i] = i
        _argsort(&negative[0], &order[0], &scratch[0], b_hi - b_lo)
        ntaken, nopened, cost, dear = 0, 0, 0, False
        for t in range(b_hi - b_lo):
            i = b_lo + order[t]
            fits = free.take_range(size[i], got_range)
            taken[ntaken, 3] = not fits
            if not fits and spare.take_range(size[i], got_range):
                d = got_range[2]
                if cost + segment_size[d] >= segment_size[s]:
                    spare.add_range(got_range[0], got_range[1], d)    # any larger costs more
                    dear = True
                else:
                    fits = True
                    cost += segment_size[d]
                    unopened[d] = 0
                    opened[nopened] = d
                    nopened += 1
            if not fits:
                break
            if got_range[0] > size[i]:          # (its owner receives now)
                free.add_range(got_range[0] - size[i], got_range[1] + size[i], got_range[2])
            taken[ntaken, 0], taken[ntaken, 1], taken[ntaken, 2] = got_range[1], got_range[2], i
            got_size[ntaken] = got_range[0]
            ntaken += 1
        if ntaken < b_hi - b_lo:
            if not dear:                        # the sets are not used again
                break
            for t in range(ntaken - 1, -1, -1):     # it stays: its takes go back, last first
                i = taken[t, 2]
                if got_size[t] > size[i]:
                    free.remove_range(got_size[t] - size[i], taken[t, 0] + size[i])
                if taken[t, 3]:
                    spare.add_range(got_size[t], taken[t, 0], taken[t, 1])
                else:
                    free.add_range(got_size[t], taken[t, 0], taken[t, 1])
            for t in range(nopened):
                unopened[opened[t]] = 1
            continue
        gone[s] = 1
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
