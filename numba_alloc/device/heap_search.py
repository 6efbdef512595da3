"""Where a malloc of the device heap looks: the size class of a request,
the order in which a warp tries the heap's pages for it, and the bitmap
word it starts at on each. Plain reads and integer arithmetic: device
functions on a GPU (:func:`warp.device_function`) and Python under the
CUDA simulator."""

from .heap_layout import LARGE, NUM_CLASSES, SIZE_BASE
from .warp import device_function as _device

FRONT_PAGES = 32                    # most pages a class's warps spread over at once ...
FRONT_SHARE = 16                    # ... and at most this share (1/16) of the heap's pages


@_device
def class_of(meta, nbytes):
    """The smallest size class whose blocks hold ``nbytes`` >= 0 bytes, or
    LARGE: a binary search of the ascending class sizes (at most 7 steps)."""
    n = meta[NUM_CLASSES]
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if meta[SIZE_BASE + mid] < nbytes:
            lo = mid + 1
        else:
            hi = mid
    if lo == n:
        return LARGE
    return lo


@_device
def front_width(pages):
    """Over how many pages past a class's hint its warps spread once the
    hint's page is full: a crowd of warps all moving to the next page
    filled the heap a page at a time (each page's fill a few round trips
    to L2 that the whole crowd waited out: on an H200, 10^6 mallocs of 16 B
    took 5 us a page filled)."""
    return max(1, min(FRONT_PAGES, pages // FRONT_SHARE))


@_device
def search_page(pages, start, cursor, salt):
    """The page a warp (``salt``: its index in the grid) tries ``cursor``-th
    (0 to ``pages`` - 1) for a class whose hint is ``start``: the hint's,
    then every other page once, from the one ``salt`` picks among the
    :func:`front_width` after it."""
    if cursor == 0:
        return start
    return (start + 1 + (salt % front_width(pages) + cursor - 1) % max(pages - 1, 1)) % pages


@_device
def word_salt(pages, start, page, salt):
    """Where in ``page``'s bitmap the warp of index ``salt`` starts, so
    that warps on one page start at different words: on the hint's page
    by their index; past it by their index over the front's width (the
    warps whose first page past the hint is this one: consecutive) plus
    their place in the front (so that a warp that moved on from its own
    first page starts elsewhere than those whose first page this is)."""
    if page == start:
        return salt
    width = front_width(pages)
    return salt // width + salt % width
