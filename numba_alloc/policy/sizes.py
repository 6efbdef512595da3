"""The pool's size rules, after PyTorch's caching allocator: what a request
is rounded to, which pool serves it, and the segments each pool reserves."""

from ..units import MiB

ROUND = 512                 # every block is a multiple of this
SMALL_SIZE = 1 * MiB        # largest request of the small pool
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB    # segment for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB       # larger requests get a segment of their own, rounded to this
NO_LIMIT = 1 << 64           # no limit (above any device)
CORE_NO_LIMIT = 1 << 62      # NO_LIMIT as the core's int64 holds it
CORE_LIMIT = 1 << 62         # requests the core takes (its sizes are int64)
# the most a pool reserves, whatever the device: its counts stay within int64,
# and its blocks below CORE_NO_LIMIT (a free block that large is never split)
MOST_RESERVED = CORE_LIMIT - ROUND_LARGE


def segment_size(size, fitted=True):
    """Bytes of the segment the pool reserves for a ``size``-byte block. A
    request below MIN_LARGE_ALLOC gets room for as many blocks of its size
    as LARGE_SEGMENT holds, rounded up to ROUND_LARGE (7 MiB: 14 MiB, 3.5
    MiB: 18 MiB), so that a run of one size wastes under ROUND_LARGE a
    segment; ``fitted=False``: LARGE_SEGMENT, as PyTorch reserves (where 6
    MiB of 20 lie idle behind two 7 MiB blocks)."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        if not fitted:
            return LARGE_SEGMENT
        size *= LARGE_SEGMENT // size
    return own_segment(size)


def own_segment(size):
    """Bytes of a large segment of a ``size``-byte block's own: ``size``
    rounded up to ROUND_LARGE."""
    return -(-size // ROUND_LARGE) * ROUND_LARGE
