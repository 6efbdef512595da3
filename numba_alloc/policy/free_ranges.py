"""A compiled set of free ranges in (size, start) order, for best fit: the
Python face of _planner.pyx's free_ranges.pxi (the compaction planner's
free space, compiled ahead of time by Cython).

:func:`make` builds a :class:`FreeRanges` from int64 arrays of sizes,
starts and owners; its ``add``, ``remove``, ``largest`` and
``take_at_least`` (the smallest range of at least n bytes, the lowest start
among equal sizes) each cost O(log n + LOAD): a sorted list of sorted
buckets, as sortedcontainers' SortedList, a bucket holding up to CAPACITY
ranges. :func:`stable_order` is the planner's radix argsort. Sizes and
starts are int64 bytes. Not thread safe.
"""

from ._planner import CAPACITY, LOAD, RADIX_BITS, FreeRanges, make, stable_order  # noqa: F401
