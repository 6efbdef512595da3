"""Making room by moving live blocks in segments of mapped pages (the
expandable_segments setting, expandable.py), with the ``defrag`` setting on:
the malloc path's try before room.py's plans. Sliding each segment's blocks
down to its start leaves its free bytes in whole pages at its end, which
go back to the device; the request then maps its own pages. Under the
pool's lock, as every function here.
"""

from . import defrag as _defrag
from .block import LARGE
from .compaction import Move
from .errors import DefragmentationRefused

# a block slides down only in at most this many copies (a slide by less than
# its size copies it piece by piece, each piece the distance moved)
MAX_SLIDE_PIECES = 16


def make_page_room(pool, size, kind, nbytes):
    """With expandable segments, the carved block for a large request of
    ``size`` bytes (``nbytes`` asked) once nothing but moving blocks can
    serve it, or None (nothing moved, nothing unmapped): slide the blocks
    of each mapped segment down to its start (those not movable stay, and
    so do those a slide would copy in more than MAX_SLIDE_PIECES pieces)
    when the pages the live blocks then touch, with the other segments
    that hold live blocks, leave room under the limit and on the device
    for the request's pages; then return every free page and free segment
    and map the request's. Raises what moving raises
    (DefragmentationError: the pool stays consistent)."""
    if kind != LARGE or pool._range is None:
        return None
    try:
        _defrag._quiesce_for_moves(pool)
    except DefragmentationRefused as refusal:
        pool._refusal = str(refusal)
        return None
    layout = _defrag._layout(pool, LARGE, frozen=[s.address for s in pool._segments.values()
                                                  if not pool._mapped(s)])
    page = pool.backend.page_size
    slides, touched = _page_slides(layout, page)
    if not slides:
        return None
    mapped = kept = 0
    for segment in pool._segments.values():
        if pool._mapped(segment):
            mapped += segment.size
        elif not pool._wholly_free(segment):
            kept += segment.size
    need = -(-size // page) * page
    reserved = pool.stats.current("reserved_bytes")
    # what the pool reserves once the slides are done and every free page
    # and free segment went back (_release_all_free): the pages the live
    # blocks touch, and the segments of its own with live blocks
    after = kept + touched
    if after + need > pool._limit or need > pool.backend.memory_info()[0] + reserved - after:
        return None
    moved = _defrag._slide(pool, slides)
    for observer in pool._observers:
        observer.on_defragment(pool, len(slides), moved)
    pool._release_all_free()
    return pool._grow(size, kind, nbytes)


def _page_slides(layout, page):
    """(the slides packing each segment of ``layout`` from its start, bytes
    of the pages its live blocks then touch): a fixed block stays, and the
    blocks after it pack from its end; a block that would slide in more
    than MAX_SLIDE_PIECES copies stays too."""
    slides, touched = [], 0
    address, sizes, fixed, first = (layout.address.tolist(), layout.size.tolist(),
                                    layout.fixed.tolist(), layout.first.tolist())
    for i, start in enumerate(layout.segment_address.tolist()):
        cursor, last_page = start, -1
        for b in range(first[i], first[i + 1]):
            at, n = address[b], sizes[b]
            step = at - cursor
            if step > 0 and not fixed[b] and -(-n // min(step, n)) <= MAX_SLIDE_PIECES:
                slides.append(Move(at, cursor, n))
                at = cursor
            low, high = at // page, (at + n - 1) // page
            touched += high - max(low, last_page + 1) + 1 if high > last_page else 0
            last_page = max(last_page, high)
            cursor = at + n
    return slides, touched * page
