"""Exact counters in the manner of torch.cuda.memory_stats.

The counters are declared in :mod:`numba_alloc.policy.counters`. The families are
updated by the pool's compiled core (numba_alloc.policy.core) under the pool's
lock, as the event happens, in the core's array; nothing is recomputed by
walking blocks. A family keeps, per pool kind (``SMALL_I``, ``LARGE_I``),
the current value and the total increase and decrease since the last reset;
the values for both kinds together are sums. The event counters are plain
integers here. :class:`PoolStats` reads both.

Peaks are exact but settled lazily: a current value only rises between two
decreases, so its maximum over that stretch is its value just before the next
decrease. Each decrease therefore first settles the peaks (per kind and for
both together), and so does every read; increases, which every malloc
makes, touch no peak. Not thread safe on its own.
"""

from . import core as _core
from .block import LARGE as LARGE_I
from .block import SMALL as SMALL_I
from .counters import EVENTS, FAMILIES, POOL

ALL_I = 2
_KEYS = ((ALL_I, "all"), (LARGE_I, "large_pool"), (SMALL_I, "small_pool"))
_BASE = {c.name: _core.CBASE + i * _core.NFIELD for i, c in enumerate(FAMILIES)}
_CUR, _INC, _DEC, _PEAK = _core.CUR, _core.INC, _core.DEC, _core.PEAK
SIZE_MAX = (1 << 64) - 1  # what PyTorch reports as max_split_size when unset
# PyTorch counts in num_oom_rejections the requests its throw_on_cudamalloc_oom
# policy refuses before any retry; numba_alloc has no such policy (every
# failing request goes through the retries and counts in num_ooms), so the
# key is there, as PyTorch users expect, and is always 0.
NUM_OOM_REJECTIONS = 0


class PoolStats:
    """Counters of one pool: the families in the core's array ``core``
    (a :class:`numba_alloc.policy.pool.Core`), plain event counts here."""

    def __init__(self, core):
        self._core = core
        for name in EVENTS:
            setattr(self, name, 0)
        # how many times reset_accumulated ran: a reader comparing increases
        # across one sees that they restarted from zero
        self.accumulated_resets = 0
        # TensorFlow's ClearStats (clear): the largest block handed out before
        # the last clear (the core's H_LARGEST holds the largest since), and
        # allocation's total increase at the last clear (0 once
        # reset_accumulated has zeroed the totals since)
        self.largest_before_clear = 0
        self.allocations_at_clear = 0

    @property
    def largest_alloc_size(self):
        """The largest block handed out, in bytes."""
        return max(int(self._core.a[_core.H_LARGEST]), self.largest_before_clear)

    def since_clear(self):
        """(allocations since the last clear or reset_accumulated, the
        largest block handed out since the last clear): TensorFlow's
        num_allocs and largest_alloc_size."""
        return (self.accumulated("allocation")[0] - self.allocations_at_clear,
                int(self._core.a[_core.H_LARGEST]))

    def clear(self):
        """TensorFlow's BFCAllocator::ClearStats: :meth:`since_clear` restarts
        from nothing and allocated_bytes' peaks go to their current values;
        every other counter, peak and total stays."""
        a = self._core.a
        self.largest_before_clear = self.largest_alloc_size
        a[_core.H_LARGEST] = 0
        self.allocations_at_clear = self.accumulated("allocation")[0]
        base = _BASE["allocated_bytes"]
        cur0, cur1 = a[base + _CUR], a[base + _CUR + 1]
        a[base + _PEAK:base + _PEAK + 3] = (cur0, cur1, cur0 + cur1)

    @staticmethod
    def _settle(a, base):
        cur0, cur1 = a[base + _CUR], a[base + _CUR + 1]
        peak = base + _PEAK
        if cur0 > a[peak]:
            a[peak] = cur0
        if cur1 > a[peak + 1]:
            a[peak + 1] = cur1
        if cur0 + cur1 > a[peak + 2]:
            a[peak + 2] = cur0 + cur1

    def current(self, family):
        """Current value of a family over both pools."""
        base, mv = _BASE[family], self._core.mv
        return mv[base + _CUR] + mv[base + _CUR + 1]

    def peak(self, family):
        """Peak of a family over both pools."""
        base, a = _BASE[family], self._core.a
        self._settle(a, base)
        return int(a[base + _PEAK + 2])

    def accumulated(self, family):
        """(total increase, total decrease) of a family over both pools
        since the last reset."""
        base, a = _BASE[family], self._core.a
        return (int(a[base + _INC] + a[base + _INC + 1]),
                int(a[base + _DEC] + a[base + _DEC + 1]))

    def values(self, family, i):
        """(current, peak, allocated, freed) for a kind or ALL_I."""
        base, a = _BASE[family], self._core.a
        self._settle(a, base)
        cur, inc, dec = (a[base + field:base + field + 2].tolist()
                         for field in (_CUR, _INC, _DEC))
        if i == ALL_I:
            return sum(cur), int(a[base + _PEAK + 2]), sum(inc), sum(dec)
        return cur[i], int(a[base + _PEAK + i]), inc[i], dec[i]

    def up(self, family, amount, kind=LARGE_I):
        """Raise a family the pool keeps in Python (reclaim's), under its lock."""
        base, a = _BASE[family], self._core.mv
        a[base + _CUR + kind] += amount
        a[base + _INC + kind] += amount

    def down(self, family, amount, kind=LARGE_I):
        """Lower such a family, settling its peaks first."""
        base, a = _BASE[family], self._core.mv
        self._settle(a, base)
        a[base + _CUR + kind] -= amount
        a[base + _DEC + kind] += amount

    def reset_peak(self):
        a = self._core.a
        for i in range(len(FAMILIES)):
            base = _core.CBASE + i * _core.NFIELD
            cur0, cur1 = a[base + _CUR], a[base + _CUR + 1]
            a[base + _PEAK:base + _PEAK + 3] = (cur0, cur1, cur0 + cur1)

    def reset_accumulated(self):
        a = self._core.a
        for i in range(len(FAMILIES)):
            base = _core.CBASE + i * _core.NFIELD
            a[base + _INC:base + _DEC + 2] = 0
        for name in EVENTS:
            setattr(self, name, 0)
        self.allocations_at_clear = 0
        self.accumulated_resets += 1

    def as_dict(self, max_split_size):
        """The flat dict torch.cuda.memory_stats returns (num_oom_rejections
        always 0, see NUM_OOM_REJECTIONS), plus our event counters.
        ``max_split_size`` in bytes, or None when unlimited."""
        out = {}
        for family in FAMILIES:
            name = family.name
            keys = _KEYS if family.form == POOL else ((ALL_I, None),)
            for i, key in keys:
                prefix = f"{name}.{key}" if key else name
                values = self.values(name, i)
                for metric, value in zip(("current", "peak", "allocated", "freed"), values):
                    out[f"{prefix}.{metric}"] = int(value)
        for name in EVENTS:
            out[name] = getattr(self, name)
        out["num_oom_rejections"] = NUM_OOM_REJECTIONS
        out["max_split_size"] = SIZE_MAX if max_split_size is None else max_split_size
        out["largest_alloc_size"] = self.largest_alloc_size
        return dict(sorted(out.items()))
