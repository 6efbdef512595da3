"""The compiled core's layout: where the header, the counters, the free
index and the block table lie in the core's int64 array (the positions
_core.pyx reads into its C globals when it is imported), and making or
growing an array. Python only. See core.py for the whole."""

import numpy as np

from .counters import FAMILIES, family_index
from .sizes import LARGE_SEGMENT, MIN_LARGE_ALLOC, ROUND, ROUND_LARGE, SMALL_SIZE

__all__ = ["SMALL", "LARGE", "ROUND", "SMALL_SIZE", "LARGE_SEGMENT", "MIN_LARGE_ALLOC",
           "ROUND_LARGE", "H_FREE_ROW",
           "H_CAP", "H_HIGH", "H_MAX_SPLIT", "H_GROWTH_OFF", "H_LARGEST", "H_NBYTES",
           "H_COUNT", "H_HUGE", "H_AVAIL", "H_OPEN_HEAD", "H_OPEN_TAIL", "H_OPEN_COUNT",
           "H_CARVED_FREE", "H_CARVED_REST", "H_GEN", "H_BATCH", "H_KEEP_WHOLE",
           "H_REUSE_FIRST", "H_FIT_SEGMENTS", "H_SPLIT_RESTS", "H_BIG_APART", "CBASE", "CUR",
           "INC", "DEC",
           "PEAK", "NFIELD", "NFAMILIES", "MAX_FAMILIES", "NCLS", "NW1", "NW2",
           "BM1", "BM2", "HEADS", "TABLE", "ADDR", "SIZE", "REQ", "PREV", "NEXT",
           "STATE", "SEG", "FPREV", "FNEXT", "KIND", "PIN", "PNEXT", "GEN", "BIG", "NF",
           "UNUSED", "ALLOCATED", "PENDING", "FREE", "BATCH", "ROW_BITS", "ROW_MASK",
           "GEN_MASK", "F_ALLOCATED_BYTES", "F_ACTIVE_BYTES", "F_REQUESTED_BYTES",
           "F_RESERVED_BYTES", "F_INACTIVE_SPLIT_BYTES", "F_ALLOCATION", "F_ACTIVE",
           "F_SEGMENT", "F_INACTIVE_SPLIT", "F_OVERSIZE_ALLOCATIONS",
           "F_OVERSIZE_SEGMENTS", "new_state", "grown"]

SMALL, LARGE = 0, 1

# header
H_FREE_ROW = 0        # head of the stack of unused rows (-1: none)
H_CAP = 1             # rows in the table
H_HIGH = 2            # rows ever used (rows >= H_HIGH are unused and not stacked)
H_MAX_SPLIT = 3       # max_split_size in bytes (1 << 62: none)
H_GROWTH_OFF = 4      # 1: every request comes from the large pool (one arena)
H_LARGEST = 5         # largest_alloc_size
H_NBYTES = 6          # + kind: bytes in the free index
H_COUNT = 8           # + kind: blocks in the free index
H_HUGE = 10           # + kind: head of the list of free blocks of >= 32 MiB
H_AVAIL = 12          # rows available without growing
H_OPEN_HEAD = 13      # the freed rows no event covers yet, linked by PNEXT
H_OPEN_TAIL = 14
H_OPEN_COUNT = 15
H_CARVED_FREE = 16    # the last carve: bytes of the free block it took out of the
                      # index when that block was split (counted in inactive_split), else 0
H_CARVED_REST = 17    # the last carve: bytes of the rest it indexed as a free block, else 0
H_GEN = 18            # blocks handed out so far: each block's generation
H_BATCH = 19          # open frees that fill a batch (release() then returns 2)
H_KEEP_WHOLE = 20     # 1: a wholly free segment more than LARGE_SEGMENT bytes above the
                      # segment PyTorch reserves for a large request does not serve it (see
                      # take); the pool sets it while keep_whole_segments is in force
                      # (Segments._update_scarce_rules)
H_REUSE_FIRST = 21    # 1: a request above SMALL_SIZE that would split a free block while
                      # frees are open gets -3 from take: the pool retires what has completed;
                      # the pool sets it while memory is scarce (Segments._update_scarce_rules)
H_FIT_SEGMENTS = 22   # 1: a segment for a request below MIN_LARGE_ALLOC holds a whole
                      # number of its blocks (sizes.segment_size); 0: LARGE_SEGMENT
H_SPLIT_RESTS = 23    # 1: the large pool splits off the rest of a free block it carves
                      # from when the rest is ROUND bytes or more (0: more than SMALL_SIZE,
                      # as PyTorch); the pool sets it while memory is scarce and defrag is on,
                      # so that a defragmentation can gather those rests (Segments.
                      # _update_scarce_rules)
H_BIG_APART = 24      # 1: a large-pool request below MIN_LARGE_ALLOC is not carved from a big
                      # segment's free blocks (take and fits pass them over); the pool sets it
                      # while memory is scarce and separate_big_segments is on, until its
                      # request path is past growing (Segments._update_scarce_rules)
# counters: per family NFIELD slots
CBASE = 32
CUR, INC, DEC, PEAK = 0, 2, 4, 6
NFIELD = 9
NFAMILIES = len(FAMILIES)
MAX_FAMILIES = 16                 # slots reserved: adding a family moves nothing below
# free index
NCLS = 1 << 16                    # size classes of 512 bytes: below 32 MiB
NW1 = NCLS >> 5                   # 32-bit bitmap words per kind
NW2 = NW1 >> 5
BM1 = CBASE + MAX_FAMILIES * NFIELD
BM2 = BM1 + 2 * NW1
HEADS = BM2 + 2 * NW2
TABLE = HEADS + 2 * NCLS
# block rows
ADDR, SIZE, REQ, PREV, NEXT, STATE, SEG, FPREV, FNEXT, KIND, PIN, PNEXT, GEN, BIG = range(14)
NF = 14
# BIG: 1 when the block lies in a big segment, one reserved for a request of
# MIN_LARGE_ALLOC bytes or more (every row of a segment holds its segment's)
UNUSED, ALLOCATED, PENDING, FREE = 0, 1, 2, 3      # STATE
BATCH = 64            # frees an event covers at most (see pending.py)
# a block's ticket (what its handle keeps): its row, and its generation above
# ROW_BITS, so that a handle of a row handed out again is told apart
ROW_BITS = 27
ROW_MASK = (1 << ROW_BITS) - 1
GEN_MASK = (1 << (63 - ROW_BITS)) - 1   # generations wrap: a ticket stays positive

# families: their positions in numba_alloc.policy.counters.FAMILIES, written
# out so that the core's code reads as the table (changing the order of the
# families there means changing these, which a check below enforces at
# import; families added after these need no change here).
F_ALLOCATED_BYTES, F_ACTIVE_BYTES, F_REQUESTED_BYTES, F_RESERVED_BYTES, \
    F_INACTIVE_SPLIT_BYTES, F_ALLOCATION, F_ACTIVE, F_SEGMENT, F_INACTIVE_SPLIT, \
    F_OVERSIZE_ALLOCATIONS, F_OVERSIZE_SEGMENTS = range(11)
_CORE_FAMILIES = ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes",
                  "inactive_split_bytes", "allocation", "active", "segment", "inactive_split",
                  "oversize_allocations", "oversize_segments")
if tuple(family_index(name) for name in _CORE_FAMILIES) != tuple(range(11)) \
        or NFAMILIES > MAX_FAMILIES:
    raise ImportError("numba_alloc.policy.core: its family positions disagree with "
                      "numba_alloc.policy.counters.FAMILIES (or there are more than MAX_FAMILIES)")


def new_state(rows=1024):
    """A fresh core array with room for ``rows`` block rows."""
    a = np.zeros(TABLE + rows * NF, dtype=np.int64)
    a[H_FREE_ROW] = -1
    a[H_CAP] = rows
    a[H_AVAIL] = rows
    a[H_HUGE] = a[H_HUGE + 1] = -1
    a[H_OPEN_HEAD] = a[H_OPEN_TAIL] = -1
    a[H_BATCH] = BATCH
    a[H_KEEP_WHOLE] = 1
    a[H_REUSE_FIRST] = 1
    a[H_FIT_SEGMENTS] = 1
    a[HEADS:TABLE] = -1
    return a


def grown(a, rows):
    """A copy of core array ``a`` with room for at least ``rows`` more rows.
    MemoryError past the ROW_MASK + 1 rows a ticket can name."""
    cap = int(a[H_CAP])
    new_cap = min(max(cap * 2, cap + rows), ROW_MASK + 1)
    if new_cap < cap + rows:
        raise MemoryError(f"the pool's block table is full: {cap} rows, the most a "
                          "block handle can name")
    b = np.zeros(TABLE + new_cap * NF, dtype=np.int64)
    b[:a.shape[0]] = a
    b[H_CAP] = new_cap
    b[H_AVAIL] = a[H_AVAIL] + new_cap - cap
    return b


