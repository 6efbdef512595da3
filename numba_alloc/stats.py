"""Exact counters in the manner of torch.cuda.memory_stats.

Every counter is updated by the pool under its lock, as the event happens;
nothing is recomputed by walking blocks. A :class:`Family` keeps, per pool
kind (``SMALL_I``, ``LARGE_I``), the current value and the total increase and
decrease since the last reset; the values for both kinds together are sums.

Peaks are exact but settled lazily: a current value only rises between two
decreases, so its maximum over that stretch is its value just before the next
decrease. Each decrease therefore first settles the peaks (per kind and for
both together), and so does every read; increases, which the malloc fast path
makes, touch no peak. Not thread safe on its own.
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
# PyTorch counts in num_oom_rejections the requests its throw_on_cudamalloc_oom
# policy refuses before any retry; numba_alloc has no such policy (every
# failing request goes through the retries and counts in num_ooms), so the
# key is there, as PyTorch users expect, and is always 0.
NUM_OOM_REJECTIONS = 0


class Family:
    """One counter: ``cur``, ``inc``, ``dec`` indexed by kind; ``peak`` by
    kind and ALL_I (settled, see the module docstring)."""

    __slots__ = ("cur", "inc", "dec", "peak")

    def __init__(self):
        self.cur, self.inc, self.dec, self.peak = [0, 0], [0, 0], [0, 0], [0, 0, 0]

    def up(self, k, amount):
        self.cur[k] += amount
        self.inc[k] += amount

    def down(self, k, amount):
        cur, peak = self.cur, self.peak
        both = cur[0] + cur[1]
        if both > peak[2]:
            peak[2] = both
        if cur[k] > peak[k]:
            peak[k] = cur[k]
        cur[k] -= amount
        self.dec[k] += amount

    def settle(self):
        """Bring the peaks up to date."""
        cur, peak = self.cur, self.peak
        peak[0] = max(peak[0], cur[0])
        peak[1] = max(peak[1], cur[1])
        peak[2] = max(peak[2], cur[0] + cur[1])

    def values(self, i):
        """(current, peak, allocated, freed) for a kind or ALL_I; settle() first."""
        if i == ALL_I:
            return (self.cur[0] + self.cur[1], self.peak[2],
                    self.inc[0] + self.inc[1], self.dec[0] + self.dec[1])
        return self.cur[i], self.peak[i], self.inc[i], self.dec[i]


class PoolStats:
    """Counters of one pool: a :class:`Family` per name in FAMILIES, two
    oversize families (large pool only), and plain event counts."""

    def __init__(self):
        for family in FAMILIES:
            setattr(self, family, Family())
        self.oversize_allocations = Family()
        self.oversize_segments = Family()
        for name in EVENTS:
            setattr(self, name, 0)
        self.largest_alloc_size = 0

    # -- the hot-path events: one call each ------------------------------------
    def malloc(self, k, allocated, requested):
        """A block of ``allocated`` bytes handed out for ``requested``."""
        f = self.allocation
        f.cur[k] += 1
        f.inc[k] += 1
        f = self.active
        f.cur[k] += 1
        f.inc[k] += 1
        f = self.allocated_bytes
        f.cur[k] += allocated
        f.inc[k] += allocated
        f = self.active_bytes
        f.cur[k] += allocated
        f.inc[k] += allocated
        f = self.requested_bytes
        f.cur[k] += requested
        f.inc[k] += requested
        if allocated > self.largest_alloc_size:
            self.largest_alloc_size = allocated

    def free(self, k, allocated):
        """A block freed by its user (still active until retired)."""
        self.allocation.down(k, 1)
        self.allocated_bytes.down(k, allocated)

    def retire(self, k, allocated, requested):
        """A freed block whose GPU work has finished, now reusable."""
        self.active.down(k, 1)
        self.active_bytes.down(k, allocated)
        self.requested_bytes.down(k, requested)

    def split_free_added(self, k, nbytes):
        """A free block that shares its segment entered the free index."""
        self.inactive_split.up(k, 1)
        self.inactive_split_bytes.up(k, nbytes)

    def split_free_removed(self, k, nbytes):
        """A free block that shares its segment left the free index."""
        self.inactive_split.down(k, 1)
        self.inactive_split_bytes.down(k, nbytes)

    # -- reading and resetting ----------------------------------------------
    def _all_families(self):
        for family in FAMILIES:
            yield family, getattr(self, family)
        yield "oversize_allocations", self.oversize_allocations
        yield "oversize_segments", self.oversize_segments

    def current(self, family):
        """Current value of a family over both pools."""
        return sum(getattr(self, family).cur)

    def peak(self, family):
        """Peak of a family over both pools."""
        f = getattr(self, family)
        f.settle()
        return f.peak[ALL_I]

    def reset_peak(self):
        for _, f in self._all_families():
            f.peak[:] = [f.cur[0], f.cur[1], f.cur[0] + f.cur[1]]

    def reset_accumulated(self):
        for _, f in self._all_families():
            f.inc[:] = f.dec[:] = [0, 0]
        for name in EVENTS:
            setattr(self, name, 0)

    def as_dict(self, max_split_size):
        """The flat dict torch.cuda.memory_stats returns (num_oom_rejections
        always 0, see NUM_OOM_REJECTIONS), plus our event counters.
        ``max_split_size`` in bytes, or None when unlimited."""
        out = {}
        for name, f in self._all_families():
            f.settle()
            keys = _KEYS if name in FAMILIES else ((ALL_I, None),)
            for i, key in keys:
                prefix = f"{name}.{key}" if key else name
                for metric, value in zip(("current", "peak", "allocated", "freed"), f.values(i)):
                    out[f"{prefix}.{metric}"] = value
        for name in EVENTS:
            out[name] = getattr(self, name)
        out["num_oom_rejections"] = NUM_OOM_REJECTIONS
        out["max_split_size"] = SIZE_MAX if max_split_size is None else max_split_size
        out["largest_alloc_size"] = self.largest_alloc_size
        return dict(sorted(out.items()))
