"""Exact counters in the manner of torch.cuda.memory_stats.

Every counter is updated by the pool under its lock, as the event happens;
nothing is recomputed by walking blocks. Each family keeps, per pool kind
(``SMALL_I``, ``LARGE_I``) and for both together (``ALL_I``), the current
value, its peak, and the total increase and decrease since the last reset.
The pool's hot paths call one method per event (:meth:`PoolStats.malloc`,
:meth:`free`, :meth:`retire`), each updating several families at once. Not
thread safe on its own.
"""

from .block import LARGE as LARGE_I
from .block import SMALL as SMALL_I

ALL_I = 2
_KEYS = ((ALL_I, "all"), (LARGE_I, "large_pool"), (SMALL_I, "small_pool"))
FAMILIES = ("allocation", "allocated_bytes", "segment", "reserved_bytes",
            "active", "active_bytes", "inactive_split", "inactive_split_bytes",
            "requested_bytes")
EVENTS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
          "num_device_alloc", "num_device_free",
          "num_single_reclaims", "num_full_reclaims", "bytes_reclaimed",
          "num_defragmentations", "bytes_defragged")
SIZE_MAX = (1 << 64) - 1  # what PyTorch reports as max_split_size when unset


class Family:
    """One counter, per kind and in all: lists indexed by SMALL_I, LARGE_I, ALL_I."""

    __slots__ = ("cur", "peak", "inc", "dec")

    def __init__(self):
        self.cur, self.peak, self.inc, self.dec = [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]

    def up(self, k, amount):
        cur, peak = self.cur, self.peak
        cur[k] += amount
        cur[ALL_I] += amount
        self.inc[k] += amount
        self.inc[ALL_I] += amount
        if cur[k] > peak[k]:
            peak[k] = cur[k]
        if cur[ALL_I] > peak[ALL_I]:
            peak[ALL_I] = cur[ALL_I]

    def down(self, k, amount):
        self.cur[k] -= amount
        self.cur[ALL_I] -= amount
        self.dec[k] += amount
        self.dec[ALL_I] += amount


class PoolStats:
    """Counters of one pool: a :class:`Family` per name in FAMILIES, two
    oversize families (index ALL_I only), and plain event counts."""

    def __init__(self):
        for family in FAMILIES:
            setattr(self, family, Family())
        self.oversize_allocations = Family()
        self.oversize_segments = Family()
        for name in EVENTS:
            setattr(self, name, 0)
        self.largest_alloc_size = 0

    # -- the hot-path events (unrolled: they run on every malloc and free) ----
    def malloc(self, k, allocated, requested):
        """A block of ``allocated`` bytes handed out for ``requested``."""
        a = ALL_I
        for family, amount in ((self.allocation, 1), (self.active, 1),
                               (self.allocated_bytes, allocated), (self.active_bytes, allocated),
                               (self.requested_bytes, requested)):
            cur, peak, inc = family.cur, family.peak, family.inc
            cur[k] += amount
            cur[a] += amount
            inc[k] += amount
            inc[a] += amount
            if cur[k] > peak[k]:
                peak[k] = cur[k]
            if cur[a] > peak[a]:
                peak[a] = cur[a]
        if allocated > self.largest_alloc_size:
            self.largest_alloc_size = allocated

    def free(self, k, allocated):
        """A block freed by its user (still active until retired)."""
        a = ALL_I
        for family, amount in ((self.allocation, 1), (self.allocated_bytes, allocated)):
            cur, dec = family.cur, family.dec
            cur[k] -= amount
            cur[a] -= amount
            dec[k] += amount
            dec[a] += amount

    def retire(self, k, allocated, requested):
        """A freed block whose GPU work has finished, now reusable."""
        a = ALL_I
        for family, amount in ((self.active, 1), (self.active_bytes, allocated),
                               (self.requested_bytes, requested)):
            cur, dec = family.cur, family.dec
            cur[k] -= amount
            cur[a] -= amount
            dec[k] += amount
            dec[a] += amount

    def split_free_added(self, k, nbytes):
        """A free block that shares its segment entered the free index."""
        self.inactive_split.up(k, 1)
        self.inactive_split_bytes.up(k, nbytes)

    def split_free_removed(self, k, nbytes):
        """A free block that shares its segment left the free index."""
        a = ALL_I
        for family, amount in ((self.inactive_split, 1), (self.inactive_split_bytes, nbytes)):
            cur, dec = family.cur, family.dec
            cur[k] -= amount
            cur[a] -= amount
            dec[k] += amount
            dec[a] += amount

    # -- reading and resetting ----------------------------------------------
    def _families(self):
        for family in FAMILIES:
            yield family, getattr(self, family)

    def current(self, family):
        """Current value of a family over both pools."""
        return getattr(self, family).cur[ALL_I]

    def peak(self, family):
        """Peak of a family over both pools."""
        return getattr(self, family).peak[ALL_I]

    def reset_peak(self):
        for _, family in self._families():
            family.peak[:] = family.cur
        for family in (self.oversize_allocations, self.oversize_segments):
            family.peak[:] = family.cur

    def reset_accumulated(self):
        for _, family in list(self._families()) + [(None, self.oversize_allocations),
                                                   (None, self.oversize_segments)]:
            family.inc[:] = family.dec[:] = [0, 0, 0]
        for name in EVENTS:
            setattr(self, name, 0)

    def as_dict(self, max_split_size):
        """The flat dict torch.cuda.memory_stats returns, plus our event
        counters. ``max_split_size`` in bytes, or None when unlimited."""
        out = {}

        def emit(prefix, family, i):
            out[f"{prefix}.current"] = family.cur[i]
            out[f"{prefix}.peak"] = family.peak[i]
            out[f"{prefix}.allocated"] = family.inc[i]
            out[f"{prefix}.freed"] = family.dec[i]

        for name, family in self._families():
            for i, key in _KEYS:
                emit(f"{name}.{key}", family, i)
        emit("oversize_allocations", self.oversize_allocations, ALL_I)
        emit("oversize_segments", self.oversize_segments, ALL_I)
        for name in EVENTS:
            out[name] = getattr(self, name)
        out["max_split_size"] = SIZE_MAX if max_split_size is None else max_split_size
        out["largest_alloc_size"] = self.largest_alloc_size
        return dict(sorted(out.items()))
