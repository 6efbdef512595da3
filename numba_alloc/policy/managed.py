"""Managed (unified) memory: not the pool's, counted beside it.

Under the Numba plugin, ``cuda.managed_array`` gets memory from Numba's own
cuMemAllocManaged; the plugin counts it here (``managed_bytes.*`` and
``managed.*`` in memory_stats, MANAGED_COUNTERS). Thread safe: :meth:`add`
and the reads take its lock; :meth:`drop_later` takes none (a finalizer
calls it), and is counted at the next read or add.
"""

import threading
from collections import deque

from .counters import MANAGED_COUNTERS
from .tally import Tally


class ManagedCounts:
    """Bytes and allocations of managed memory made and not yet freed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._dropped = deque()
        self._tallies = {c.name: Tally() for c in MANAGED_COUNTERS}

    def add(self, nbytes):
        """Count an allocation of ``nbytes``."""
        with self._lock:
            self._settle()
            self._change(nbytes, 1)

    def drop_later(self, nbytes):
        """Count the free of an allocation of ``nbytes`` (no lock, never raises)."""
        self._dropped.append(nbytes)

    def _settle(self):
        dropped = self._dropped
        while dropped:
            self._change(-dropped.popleft(), -1)

    def _change(self, nbytes, count):
        for name, amount in (("managed_bytes", nbytes), ("managed", count)):
            tally = self._tallies[name]
            if amount > 0:
                tally.up(amount)
            else:
                tally.down(-amount)

    def as_dict(self):
        """``managed_bytes.{current,peak,allocated,freed}`` and ``managed.*``."""
        with self._lock:
            self._settle()
            return {key: value for name, tally in self._tallies.items()
                    for key, value in tally.items(name)}

    def reset_peaks(self):
        with self._lock:
            self._settle()
            for tally in self._tallies.values():
                tally.reset_peak()

    def reset_accumulated(self):
        with self._lock:
            self._settle()
            for tally in self._tallies.values():
                tally.reset_accumulated()
