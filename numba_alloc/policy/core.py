"""The pool's compiled core: block table, free index and counters in one
NumPy int64 array, operated on by ``@njit(cache=True)`` functions that the
pool calls with the array's address (one integer argument, not an array:
unboxing an array costs more than the work).

Layout:

* a header (free-row stack, capacity, max_split_size, growth off, free-index
  bytes and counts per kind, heads of the lists of huge free blocks, the
  list of open frees, the last carve's record (for untake), the block
  generation, the batch size);
* the counters: per family (numba_alloc.policy.counters.FAMILIES), current, allocated and
  freed per kind, and the peak per kind and for both;
* the free index per kind: exact-size bins (doubly linked through the rows,
  newest first) for sizes below 32 MiB with a two-level bitmap over them,
  and one list for larger free blocks (scanned: they are few);
* the block table: one row of NF int64 fields per block (a row's fields
  share a cache line), rows linked by index in address order within their
  segment, and pending rows linked by PNEXT in the order they were freed.

Three files: core_layout.py (where everything lies in the array; making
and growing one), core_blocks.py (the compiled internals: counters, rows,
the free index, carving and coalescing) and this one, the entry points the
pool calls (take, release, untake, retire, rebuild, ...), and the layout's
names for everyone else. Block surgery and every free-index change go
through core_blocks.py's gateways ``_index_add``/``_index_remove``, which
also keep the split-block counters. A segment's first row never changes except when
defragmentation rebuilds it: carving keeps the free row for the handed-out
block and puts the rest in a new row; coalescing keeps the lower row.

Compiled lazily (at a pool's first use, never at import), cached on disk:
Numba writes the cache next to this file, or when the package's folder is
read-only in its user-wide fallback (``$NUMBA_CACHE_DIR``, else
``~/.cache/numba``). Not thread safe: the pool calls it under its lock.
"""

import os

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import leading_zeros

from .core_layout import *  # noqa: F403 (the core's layout: numba_alloc.policy.core.TABLE, ...)
from .core_blocks import (_best_fit, _carve, _coalesce, _down, _index_add, _index_remove,
                          _kill_row, _max_run, _new_row, _rows, _unup, _up, _view)


def _compile_after_edits():
    """Numba keys a cached function by its own file only, and this file's
    functions are compiled with core_blocks.py's and core_layout.py's (and
    core_blocks.py's with core_layout.py's): when one of those is newer than
    a file compiled with it, touch that file, so that its cached functions
    are compiled again. Where the files cannot be written (an installed
    copy, never edited) nothing changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = {name: os.path.join(here, f"{name}.py") for name in ("core", "core_blocks",
                                                                 "core_layout", "sizes")}
    for name, sources in (("core_blocks", ("core_layout", "sizes")),
                          ("core", ("core_blocks", "core_layout", "sizes"))):
        try:
            newest = max(os.stat(path[s]).st_mtime for s in sources)
            if os.stat(path[name]).st_mtime < newest:
                os.utime(path[name], (newest, newest))
        except OSError:
            pass


_compile_after_edits()


# -- what the pool calls (p: the core array's address) ----------------------
@njit(cache=True)
def _take(a, nbytes, reuse_first):
    size = _rounded(nbytes)
    k = LARGE if a[H_GROWTH_OFF] or size > SMALL_SIZE else SMALL
    return _take_of(a, nbytes, size, k, reuse_first)


@njit(cache=True)
def _rounded(nbytes):
    """Bytes of the block a request of ``nbytes`` gets (ROUND for 0)."""
    size = (nbytes + ROUND - 1) // ROUND * ROUND
    return size if size else ROUND


@njit(cache=True)
def _take_of(a, nbytes, size, k, reuse_first):
    if a[H_AVAIL] < 1:
        return -2
    row = _best_fit(a, size, k, _max_run(a, size))
    if row < 0:
        return -1
    r = TABLE + row * NF
    if size > SMALL_SIZE and reuse_first and a[H_OPEN_COUNT] and a[r + SIZE] != size:
        return -3
    if _kept_whole(a, row, size, k):
        return -1
    _index_remove(a, row)
    return _carve(a, row, size, k, nbytes)


@njit(cache=True)
def _kept_whole(a, row, size, k):
    """Whether free ``row`` stays whole rather than serve ``size`` bytes of
    kind k: while H_KEEP_WHOLE is set (growth on), a wholly free large
    segment more than LARGE_SEGMENT bytes larger than the request's own
    (_own_segment)."""
    if k != LARGE or not a[H_KEEP_WHOLE] or a[H_GROWTH_OFF]:
        return False
    r = TABLE + row * NF
    return a[r + PREV] < 0 and a[r + NEXT] < 0 and a[r + SIZE] > _own_segment(size) + LARGE_SEGMENT


@njit(cache=True)
def _own_segment(size):
    """Bytes of the segment a large request of ``size`` bytes would reserve
    under PyTorch's rule (sizes.segment_size(size, fitted=False) for sizes
    above SMALL_SIZE): what keep-whole's slack is counted from."""
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


@njit(cache=True)
def take(p, nbytes):
    """A block of ``nbytes`` (0 <= nbytes < 2**62) carved from the
    best-fitting free block: its ticket; -1 when none fits, -2 when the
    table needs more rows, -3 (with H_REUSE_FIRST set) when a request of
    more than SMALL_SIZE bytes (also in one arena, growth off) would split a
    free block while freed blocks are still open: blocks
    freed since, once their work has completed, may fit better, so the
    pool closes their batch, retires what has completed and takes again
    (on -2 and -3 nothing has changed). While H_KEEP_WHOLE is set, a wholly
    free segment more than LARGE_SEGMENT bytes larger than PyTorch's segment
    for a large request (_own_segment) does not serve it (-1):
    splitting it would leave its free rest stuck behind a live block, where
    a segment of the request's own size keeps the big one whole and
    returnable to the device (the slow path reserves one, returning cached
    free segments to the device first when it must)."""
    a = _view(p)
    return _take(a, nbytes, a[H_REUSE_FIRST])


@njit(cache=True)
def take_large(p, nbytes):
    """take() from the large pool's free blocks, for a small request (at
    most SMALL_SIZE bytes) the small pool can neither serve nor grow for:
    the block is the large pool's."""
    a = _view(p)
    return _take_of(a, nbytes, _rounded(nbytes), LARGE, a[H_REUSE_FIRST])


@njit(cache=True)
def take_now(p, nbytes, large):
    """take() (``large``: take_large()) that never answers -3: carves from
    the best fit found even while frees are open."""
    a = _view(p)
    if large:
        return _take_of(a, nbytes, _rounded(nbytes), LARGE, 0)
    return _take(a, nbytes, 0)


@njit(cache=True)
def take_row(p, row, size, k, nbytes):
    """Carve free ``row`` (still in the index) for a ``size``-byte block;
    its ticket (a spare row must exist)."""
    a = _view(p)
    _index_remove(a, row)
    return _carve(a, row, size, k, nbytes)


@njit(cache=True)
def _release(a, row, gen):
    r = TABLE + row * NF
    if a[r + STATE] != ALLOCATED or a[r + GEN] != gen:
        return 0
    a[r + STATE] = PENDING
    k = a[r + KIND]
    size = a[r + SIZE]
    _down(a, F_ALLOCATION, k, 1)
    _down(a, F_ALLOCATED_BYTES, k, size)
    if size >= a[H_MAX_SPLIT]:
        _down(a, F_OVERSIZE_ALLOCATIONS, LARGE, 1)
    a[r + PNEXT] = -1
    tail = a[H_OPEN_TAIL]
    if tail >= 0:
        a[TABLE + tail * NF + PNEXT] = row
    else:
        a[H_OPEN_HEAD] = row
    a[H_OPEN_TAIL] = row
    count = a[H_OPEN_COUNT] + 1
    a[H_OPEN_COUNT] = count
    return 2 if count >= a[H_BATCH] else 1


@njit(cache=True)
def release(p, row, gen):
    """A user's free of the block of ``row`` handed out as generation
    ``gen``: it becomes pending, joins the open frees, and its allocation
    counters drop; 1, or 2 when the open frees now fill a batch. 0 (nothing
    changed) when that block is not allocated."""
    return _release(_view(p), row, gen)


@njit(cache=True)
def untake(p, row, gen, carved_free, carved_rest, largest):
    """Give back the block of ``row`` handed out as generation ``gen`` and
    never freed, as if it had never been taken: it joins its free
    neighbours and the index at once; the allocation counters and their
    running totals drop back, the split-block running totals lose what its
    carve added (``carved_free``, ``carved_rest``: H_CARVED_FREE and
    H_CARVED_REST read right after that carve) and gain nothing from the
    coalescing (exactly so when nothing changed its neighbours since; else
    they count the difference), largest_alloc_size becomes ``largest``. No
    peak is settled.
    1, or 0 (nothing changed) when that block is not allocated."""
    a = _view(p)
    r = TABLE + row * NF
    if a[r + STATE] != ALLOCATED or a[r + GEN] != gen:
        return 0
    k = a[r + KIND]
    size = a[r + SIZE]
    _unup(a, F_ALLOCATION, k, 1)
    _unup(a, F_ACTIVE, k, 1)
    _unup(a, F_ALLOCATED_BYTES, k, size)
    _unup(a, F_ACTIVE_BYTES, k, size)
    _unup(a, F_REQUESTED_BYTES, k, a[r + REQ])
    if size >= a[H_MAX_SPLIT]:
        _unup(a, F_OVERSIZE_ALLOCATIONS, LARGE, 1)
    a[H_LARGEST] = largest
    a[r + REQ] = 0
    a[r + PIN] = 0
    split = CBASE + F_INACTIVE_SPLIT * NFIELD
    split_bytes = CBASE + F_INACTIVE_SPLIT_BYTES * NFIELD
    n = NFIELD - INC                     # the running totals and peaks (after the currents)
    kept = np.empty(2 * n, np.int64)
    for i in range(n):
        kept[i] = a[split + INC + i]
        kept[n + i] = a[split_bytes + INC + i]
    _coalesce(a, row)
    for i in range(n):
        a[split + INC + i] = kept[i]
        a[split_bytes + INC + i] = kept[n + i]
    if carved_free:
        a[split + DEC + k] -= 1
        a[split_bytes + DEC + k] -= carved_free
    if carved_rest:
        a[split + INC + k] -= 1
        a[split_bytes + INC + k] -= carved_rest
    for base in (split, split_bytes):   # what another operation changed meanwhile
        drift = a[base + CUR + k] - (a[base + INC + k] - a[base + DEC + k])
        if drift > 0:                   # (its free neighbours were indexed otherwise
            a[base + INC + k] += drift  # than they would have been without the block)
        else:
            a[base + DEC + k] -= drift
    return 1


@njit(cache=True)
def close_open(p):
    """The open frees' first row (their count is H_OPEN_COUNT), which now
    form a batch; the open list is empty again."""
    a = _view(p)
    head = a[H_OPEN_HEAD]
    a[H_OPEN_HEAD] = a[H_OPEN_TAIL] = -1
    a[H_OPEN_COUNT] = 0
    return head


@njit(cache=True)
def retire(p, head, count):
    """Make the ``count`` pending rows linked from ``head`` reusable."""
    a = _view(p)
    row = head
    for _ in range(count):
        r = TABLE + row * NF
        following = a[r + PNEXT]
        k = a[r + KIND]
        _down(a, F_ACTIVE, k, 1)
        _down(a, F_ACTIVE_BYTES, k, a[r + SIZE])
        _down(a, F_REQUESTED_BYTES, k, a[r + REQ])
        a[r + REQ] = 0
        a[r + PIN] = 0
        _coalesce(a, row)
        row = following


@njit(cache=True)
def fits(p, size, k):
    """Whether take() would find a free block for ``size`` bytes of kind k
    (the best fit, and one keep-whole does not keep whole)."""
    a = _view(p)
    row = _best_fit(a, size, k, _max_run(a, size))
    return row >= 0 and not _kept_whole(a, row, size, k)


@njit(cache=True)
def largest(p):
    """Bytes of the largest free block of either kind, 0 when none."""
    a = _view(p)
    best = 0
    for k in range(2):
        row = a[H_HUGE + k]
        while row >= 0:
            best = max(best, a[TABLE + row * NF + SIZE])
            row = a[TABLE + row * NF + FNEXT]
        for w2 in range(NW2 - 1, -1, -1):
            if a[BM2 + k * NW2 + w2]:
                for w in range((w2 << 5) + 31, (w2 << 5) - 1, -1):
                    word = a[BM1 + k * NW1 + w]
                    if word:
                        best = max(best, ((w << 5) + 63 - leading_zeros(word)) << 9)
                        break
                break
    return best


@njit(cache=True)
def add_segment(p, address, nbytes, k, oversize):
    """Index a new segment's one free block; its row (a spare must exist)."""
    a = _view(p)
    row = _new_row(a)
    r = TABLE + row * NF
    a[r + ADDR] = address
    a[r + SIZE] = nbytes
    a[r + REQ] = 0
    a[r + PREV] = -1
    a[r + NEXT] = -1
    a[r + SEG] = address
    a[r + KIND] = k
    _up(a, F_SEGMENT, k, 1)
    _up(a, F_RESERVED_BYTES, k, nbytes)
    if oversize:
        _up(a, F_OVERSIZE_SEGMENTS, LARGE, 1)
    _index_add(a, row)
    return row


@njit(cache=True)
def release_segment(p, row, k, nbytes, oversize):
    """Forget a fully free segment whose one free block is ``row``."""
    a = _view(p)
    _index_remove(a, row)
    _kill_row(a, row)
    _down(a, F_SEGMENT, k, 1)
    _down(a, F_RESERVED_BYTES, k, nbytes)
    if oversize:
        _down(a, F_OVERSIZE_SEGMENTS, LARGE, 1)


@njit(cache=True)
def drop_free(p, rp, m):
    """Take the ``m`` free rows at address ``rp`` out of the index and
    counters; the rows die."""
    a = _view(p)
    rows = _rows(rp, m)
    for i in range(m):
        _index_remove(a, rows[i])
        _kill_row(a, rows[i])


@njit(cache=True)
def rebuild(p, seg_address, seg_size, k, rp, m):
    """Relink a ``k``-kind segment from the ``m`` rows at address ``rp``,
    its non-free blocks sorted by address (their ADDR/SEG already set; its
    old free rows dropped by drop_free). New free rows fill the gaps
    (spares must exist). Returns the new first row."""
    a = _view(p)
    rows = _rows(rp, m)
    head, last, cursor = -1, -1, seg_address
    end = seg_address + seg_size
    for i in range(m + 1):
        if i < m:
            row = rows[i]
            start = a[TABLE + row * NF + ADDR]
        else:
            row = -1
            start = end
        if start > cursor:
            gap = _new_row(a)
            g = TABLE + gap * NF
            a[g + ADDR] = cursor
            a[g + SIZE] = start - cursor
            a[g + REQ] = 0
            a[g + SEG] = seg_address
            a[g + KIND] = k
            a[g + STATE] = FREE           # indexed below, once linked
            a[g + PREV] = last
            if last >= 0:
                a[TABLE + last * NF + NEXT] = gap
            else:
                head = gap
            last = gap
        if row >= 0:
            a[TABLE + row * NF + PREV] = last
            if last >= 0:
                a[TABLE + last * NF + NEXT] = row
            else:
                head = row
            last = row
            cursor = start + a[TABLE + row * NF + SIZE]
    a[TABLE + last * NF + NEXT] = -1
    row = head
    while row >= 0:
        if a[TABLE + row * NF + STATE] == FREE:
            _index_add(a, row)
        row = a[TABLE + row * NF + NEXT]
    return head


# compiled on a pool's first use
ENTRY_POINTS = (take, take_row, release, close_open, retire, fits, largest, add_segment,
                release_segment, drop_free, rebuild, untake)
