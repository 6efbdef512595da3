"""The order in which a warp's malloc tries the device heap's pages for a
size class, and the bitmap word it starts at on each: plain integer
arithmetic, device functions on a GPU (:func:`warp.device_function`) and
Python under the CUDA simulator."""

from .warp import device_function as _device

FRONT_PAGES = 32                    # most pages a class's warps spread over at once ...
FRONT_SHARE = 16                    # ... and at most this share (1/16) of the heap's pages


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
    """Where in ``page``'s bitmap the warp of index ``salt`` starts: warps
    on one page at different words (those on the hint's page by their
    index, those spread over the front by their index over its width)."""
    if page == start:
        return salt
    return salt // front_width(pages)
