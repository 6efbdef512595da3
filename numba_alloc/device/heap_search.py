"""Where a malloc of the device heap looks: the size class of a request,
and the order in which a warp tries the heap's pages for it (where in a
page's bitmap it starts is its reservation's ticket, heap_kernels). Plain
reads and integer arithmetic: device functions on a GPU
(:func:`warp.device_function`) and Python under the CUDA simulator."""

from .heap_layout import LARGE, NUM_CLASSES, SIZE_BASE
from .warp import device_function as _device

FRONT_BLOCKS = 1 << 17              # most blocks a class's warps spread over at once (32
                                    # pages of 16 B blocks: 4096 warps of 32 lanes) ...
FRONT_PAGES = 128                   # ... on at most this many pages (8 MiB) ...
FRONT_SHARE = 16                    # ... and this share (1/16) of the heap's pages


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
def front_width(pages, capacity):
    """Over how many pages past a class's hint its warps spread once the
    hint's page is full (``capacity``: the class's blocks a page): a crowd
    of warps all moving to the next page filled the heap a page at a time
    (each page's fill a few round trips to L2 that the whole crowd waited
    out: on an H200, 10^6 mallocs of 16 B took 5 us a page filled), and a
    front of as many pages for every class left the crowds of a large class
    walking page by page behind each other (benchmarks/bench_heap_crowd.py:
    about 10x the bump floor's rounds at 256 B). At most FRONT_PAGES: a
    crowd of one-block mallocs of a large class leaves about a block on
    each page of the front, each page then its class's until emptied (512
    pages of one 8 KiB block each, on a heap of 8192, failed a run of 7700
    pages)."""
    return max(1, min(FRONT_BLOCKS // capacity, FRONT_PAGES, pages // FRONT_SHARE))


@_device
def search_page(pages, capacity, start, cursor, salt):
    """The page a warp (``salt``: its index in the grid) tries ``cursor``-th
    (0 to ``pages`` - 1) for a class (``capacity`` blocks a page) whose hint
    is ``start``: the hint's, then every other page once, from the one
    ``salt`` picks among the :func:`front_width` after it."""
    if cursor == 0:
        return start
    return (start + 1 + (salt % front_width(pages, capacity) + cursor - 1)
            % max(pages - 1, 1)) % pages
