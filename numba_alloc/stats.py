"""Exact counters in the manner of torch.cuda.memory_stats.

Every counter is updated by the pool under its lock, as the event happens;
nothing is recomputed by walking blocks. Not thread safe on its own.
"""

from .block import LARGE, SMALL

ALL = "all"
FAMILIES = ("allocation", "allocated_bytes", "segment", "reserved_bytes",
            "active", "active_bytes", "inactive_split", "inactive_split_bytes",
            "requested_bytes")
EVENTS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
          "num_device_alloc", "num_device_free",
          "num_single_reclaims", "num_full_reclaims", "bytes_reclaimed",
          "num_defragmentations", "bytes_defragged")
SIZE_MAX = (1 << 64) - 1  # what PyTorch reports as max_split_size when unset


class Stat:
    """current/peak value and the total increase (allocated) and decrease
    (freed) since the last reset."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount):
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount):
        self.current -= amount
        self.freed += amount

    def reset_peak(self):
        self.peak = self.current

    def reset_accumulated(self):
        self.allocated = self.freed = 0

    def as_dict(self):
        return {"current": self.current, "peak": self.peak,
                "allocated": self.allocated, "freed": self.freed}


class PoolStats:
    """Counters of one pool. For each family, ``self.<family>`` maps
    ``"all"``, ``"small_pool"`` and ``"large_pool"`` to a :class:`Stat`;
    :meth:`add` and :meth:`sub` update one pool's stat and ``"all"``."""

    def __init__(self):
        for family in FAMILIES:
            setattr(self, family, {ALL: Stat(), SMALL: Stat(), LARGE: Stat()})
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        for name in EVENTS:
            setattr(self, name, 0)
        self.largest_alloc_size = 0

    @staticmethod
    def add(family, kind, amount):
        family[ALL].increase(amount)
        family[kind].increase(amount)

    @staticmethod
    def sub(family, kind, amount):
        family[ALL].decrease(amount)
        family[kind].decrease(amount)

    def _stats(self):
        for family in FAMILIES:
            yield from getattr(self, family).values()
        yield self.oversize_allocations
        yield self.oversize_segments

    def reset_peak(self):
        for stat in self._stats():
            stat.reset_peak()

    def reset_accumulated(self):
        for stat in self._stats():
            stat.reset_accumulated()
        for name in EVENTS:
            setattr(self, name, 0)

    def as_dict(self, max_split_size):
        """The flat dict torch.cuda.memory_stats returns, plus our event
        counters. ``max_split_size`` in bytes, or None when unlimited."""
        out = {}
        for family in FAMILIES:
            for kind, stat in getattr(self, family).items():
                for metric, value in stat.as_dict().items():
                    out[f"{family}.{kind}.{metric}"] = value
        for name in ("oversize_allocations", "oversize_segments"):
            for metric, value in getattr(self, name).as_dict().items():
                out[f"{name}.{metric}"] = value
        for name in EVENTS:
            out[name] = getattr(self, name)
        out["max_split_size"] = SIZE_MAX if max_split_size is None else max_split_size
        out["largest_alloc_size"] = self.largest_alloc_size
        return dict(sorted(out.items()))
