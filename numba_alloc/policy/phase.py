"""A phase of a defragmentation's moves, as :meth:`Backend.start_copies
<numba_alloc.policy.backend.Backend.start_copies>` takes it: columns, so
that a compaction of thousands of moves reaches the copy kernel's table
without Python work per move or per pair of segments.
"""

from typing import NamedTuple

import numpy as np


class Phase(NamedTuple):
    """Moves that copy together: no move's destination overlaps another's
    source. Each field an int64 array with a row per move:

    - ``moves``: (source address, destination address, length in bytes);
    - ``sources``: (address, size) of the segment the move reads;
    - ``destinations``: (address, size) of the segment it writes.

    Nothing here checks that a move lies within its segments: the backend
    that copies does (numba_alloc.device.kernels.phase_span)."""

    moves: np.ndarray
    sources: np.ndarray
    destinations: np.ndarray

    @classmethod
    def of_batches(cls, batches):
        """The phase of ``batches`` as :meth:`Backend.copy` takes them
        ((destination segment, source segment, rows of source offset,
        destination offset, length), each segment (address, size))."""
        tables = [np.asarray(rows, np.int64).reshape(-1, 3) for _, _, rows in batches]
        counts = [len(rows) for rows in tables]
        if not sum(counts):
            empty = np.empty((0, 2), np.int64)
            return cls(np.empty((0, 3), np.int64), empty, empty)
        destinations = np.repeat(np.array([dst for dst, _, _ in batches], np.int64).reshape(-1, 2),
                                 counts, axis=0)
        sources = np.repeat(np.array([src for _, src, _ in batches], np.int64).reshape(-1, 2),
                            counts, axis=0)
        moves = np.concatenate(tables)
        moves[:, 0] += sources[:, 0]
        moves[:, 1] += destinations[:, 0]
        return cls(moves, sources, destinations)

    def batches(self):
        """The moves as :meth:`Backend.copy` takes them: a batch per
        (destination, source) segment pair, in the order of their
        addresses, its rows offsets into the two segments (new arrays)."""
        moves, sources, destinations = self
        if not len(moves):
            return []
        order = np.lexsort((sources[:, 0], destinations[:, 0]))
        src, dst = sources[order], destinations[order]
        relative = moves[order]
        relative[:, 0] -= src[:, 0]
        relative[:, 1] -= dst[:, 0]
        starts = np.flatnonzero(np.concatenate(
            ([True], (src[1:, 0] != src[:-1, 0]) | (dst[1:, 0] != dst[:-1, 0])))).tolist()
        ends = starts[1:] + [len(order)]
        return [(tuple(dst[start].tolist()), tuple(src[start].tolist()), relative[start:end])
                for start, end in zip(starts, ends)]
