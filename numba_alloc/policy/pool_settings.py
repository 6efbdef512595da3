"""The pool's settings: checking and committing them, and what the first
use resolves (the limit, the arena with growth off). A part of
:class:`~numba_alloc.policy.pool.Pool`; not thread safe on its own (the
pool's methods hold its lock)."""

from typing import NamedTuple

from . import core as _core
from .block import LARGE
from .config import ARENA_UNIT, Settings, parse_settings
from .sizes import CORE_NO_LIMIT, MOST_RESERVED, NO_LIMIT


def pool_limit(settings, total):
    """The most bytes a pool with ``settings`` may reserve on a device of
    ``total`` bytes: the limit setting, and at most MOST_RESERVED (just
    under 2**62), so that the core's int64 sizes and counts hold every
    block, segment and total (a simulated device may be larger)."""
    return min(settings.resolve_limit(total), MOST_RESERVED)


class PreparedSettings(NamedTuple):
    """Settings checked by :meth:`Pool.check_settings`, for :meth:`Pool.prepare`
    and :meth:`Pool.commit` (or :meth:`Pool.discard`): the settings, the
    limit in bytes they resolve to (None before the pool's first use), and
    the heap that is to serve NRT for a new nrt_heap_size (carved, not yet
    serving), if any."""
    settings: Settings
    limit: int | None
    nrt_heap: object = None
    malloc_heap_before: int | None = None   # the device's malloc heap size when checked


class PoolSettings:
    """The settings in force, and changing them (every method takes the
    pool's lock)."""

    def prepare(self, prepared) -> None:
        """Do what putting settings from :meth:`check_settings` in force
        needs of the backend, the steps that can still fail once every
        check has passed (under the lock held since then, before
        :meth:`commit`; numba_alloc.configure prepares every pool before it
        commits any): return the cached pinned host blocks over a lower
        host_cache_limit, give the device malloc heap its new size, then
        point NRT at its new heap. Raises what the backend raises; then no
        setting has changed once :meth:`discard` has run (host blocks
        returned stay returned: the cache holds less, within both
        limits)."""
        old, settings = self._settings, prepared.settings
        if settings.host_cache_limit is not None and \
                settings.host_cache_limit != old.host_cache_limit:
            self.host_cache.return_over(settings.host_cache_limit)
        if settings.malloc_heap_size != old.malloc_heap_size:
            # checked: the driver still took its own value (only a kernel
            # launched since, by another thread, makes this raise)
            self.backend.set_malloc_heap_size(settings.malloc_heap_size)
        if prepared.nrt_heap is not None:
            self.nrt_heap.switch(prepared.nrt_heap)

    def commit(self, prepared) -> None:
        """Put settings from :meth:`check_settings`, once :meth:`prepare`
        has done its part, in force (under the lock held since then).
        Cannot fail: everything that could was done there."""
        old, settings = self._settings, prepared.settings
        self._settings = settings
        if self.relocator is not None and settings.reclaim != old.reclaim:
            self.relocator.reclaiming(self, settings.reclaim)
        if settings.host_cache_limit != old.host_cache_limit:
            self.host_cache.set_limit(settings.host_cache_limit)
        self._max_split = settings.max_split_size or NO_LIMIT
        self._growth_off = not settings.growth
        mv = self._core.mv
        mv[_core.H_MAX_SPLIT] = min(self._max_split, CORE_NO_LIMIT)
        mv[_core.H_GROWTH_OFF] = int(self._growth_off)
        if self._initialized:
            self._limit = prepared.limit
        self._update_scarce_rules()
        if prepared.nrt_heap is not None:
            self.nrt_heap.adopt(prepared.nrt_heap)

    def discard(self, prepared) -> None:
        """Drop settings from :meth:`check_settings` that will not be
        committed (preparing them, or another pool's, failed), under the
        lock held since then: the device malloc heap gets back the size it
        had when checked (a driver call, refused only where a kernel was
        launched since by another thread: then left as it is), and the heap
        carved for NRT goes back as if never carved, NRT pointed at the
        heap still serving."""
        settings = prepared.settings
        try:
            if settings.malloc_heap_size != self._settings.malloc_heap_size \
                    and prepared.malloc_heap_before is not None:
                self.backend.set_malloc_heap_size(prepared.malloc_heap_before)
        except Exception:       # noqa: BLE001 - the error being handled is the one raised
            pass
        finally:
            if prepared.nrt_heap is not None:
                self.nrt_heap.abandon(prepared.nrt_heap)

    def settings(self) -> Settings:
        """The :class:`~numba_alloc.policy.config.Settings` in force."""
        return self._settings

    def configure(self, **changes) -> None:
        """Change settings. Raises ValueError for an unknown key or bad value
        (a fraction of the device as limit that comes to fewer bytes than the
        smallest block, 512, or with growth off the arena's unit, 2 MiB) and
        RuntimeError for one that can no longer apply (growth or
        max_split_size_mb once the pool has reserved memory, a limit with
        growth off once the arena is reserved, a limit below the bytes
        already reserved, a host_limit below the host memory reclaimed
        blocks hold, a host_cache_limit below the pinned host memory in
        use, a malloc_heap_size once a kernel that uses the device's
        malloc heap has run, an nrt_heap_size once kernels that use NRT were
        linked with CUDA's heap, or an unset one once its heap serves
        kernels), and the pool's OutOfMemoryError for an nrt_heap_size its
        heap cannot be replaced with; on error nothing is changed (cached
        pinned host blocks returned for a lower host_cache_limit stay
        returned)."""
        parsed = parse_settings(changes)
        with self._lock:
            self._put_in_force(self.check_settings(parsed))

    def _put_in_force(self, prepared):
        """:meth:`prepare` and :meth:`commit` (under the lock); on an error
        of prepare, :meth:`discard`."""
        try:
            self.prepare(prepared)
        except BaseException:
            self.discard(prepared)
            raise
        self.commit(prepared)

    def check_settings(self, parsed) -> PreparedSettings:
        """The :class:`PreparedSettings` that ``parsed`` (from
        :func:`~numba_alloc.policy.config.parse_settings`) would put in force, with
        the limit resolved; raises as :meth:`configure` does, changing
        nothing. Hold the lock until :meth:`commit`."""
        with self._lock:
            old = self._settings
            new = Settings(**{**old.__dict__, **parsed})
            heap_before = None
            if isinstance(new.limit, float):
                new.check_limit_of(self.backend.memory_info()[1])
            if new.reclaim and not old.reclaim:
                if not self.backend.reclaims:
                    raise RuntimeError(f"reclaim: {self.backend!r} cannot copy blocks to host "
                                       "memory")
                refused = self.relocator and self.relocator.reclaim_refused()
                if refused:
                    raise RuntimeError(refused)
            if new.expandable_segments and not self.backend.page_size:
                raise ValueError(f"expandable_segments: {self.backend!r} cannot map pages "
                                 "(use auto or false)")
            if new.host_cache_limit != old.host_cache_limit:
                self.host_cache.check_limit(new.host_cache_limit)
            if new.malloc_heap_size != old.malloc_heap_size:
                if new.malloc_heap_size is None:
                    raise ValueError("malloc_heap_size cannot go back to unset: give the "
                                     "size, in bytes (CUDA's default is 8 MiB)")
                current = self.backend.malloc_heap_size()
                if current is None:
                    raise ValueError(f"malloc_heap_size: {self.backend!r} has no device "
                                     "malloc heap")
                if self._initialized and self._growth_off:
                    self._check_heap_beside_arena(new.malloc_heap_size)
                # the driver takes its own value back only while it can be changed
                self.backend.set_malloc_heap_size(current)
                heap_before = current
            if new.host_limit is not None and new.host_limit != old.host_limit:
                held = self._residency.host_bytes
                if new.host_limit < held:
                    raise RuntimeError(
                        f"host_limit {new.host_limit} is below the {held} bytes of pinned "
                        f"host memory the {len(self._residency.reclaimed)} reclaimed blocks "
                        "hold (use or free them first)")
            if new.nrt_heap_size is not None and old.nrt_heap_size is None:
                refused = self.relocator and self.relocator.nrt_heap_refused()
                if refused:
                    raise RuntimeError(refused)
            resize = new.nrt_heap_size != old.nrt_heap_size and self.nrt_heap is not None
            if resize and new.nrt_heap_size is None:
                raise RuntimeError("nrt_heap_size cannot go back to unset: the loaded kernels "
                                   "that use NRT allocate from the pool's heap (give a size)")
            if not self._initialized:
                return PreparedSettings(new, None, None, heap_before)
            for key in ("growth", "max_split_size_mb", "expandable_segments"):
                if getattr(new, key) != getattr(old, key):
                    raise RuntimeError(
                        f"{key} cannot be changed once the pool is initialized "
                        "(it has reserved device memory)")
            limit = self._limit
            if new.limit != old.limit:
                if self._growth_off:
                    raise RuntimeError(
                        "limit cannot be changed with growth off once the "
                        "arena is reserved")
                limit = pool_limit(new, self.backend.memory_info()[1])
                reserved = self.stats.current("reserved_bytes")
                if limit < reserved:
                    raise RuntimeError(
                        f"limit {limit} is below the {reserved} bytes the pool "
                        "already reserves; free memory and call empty_cache() first")
            # last, once nothing else can refuse: NRT's new heap, beside the old one
            heap = self.nrt_heap.replacement(new.nrt_heap_size) if resize else None
            return PreparedSettings(new, limit, heap, heap_before)

    def _check_heap_beside_arena(self, nbytes):
        """RuntimeError when the device has fewer than ``nbytes`` free beside
        the reserved arena (growth off), where the driver carves the malloc
        heap when a kernel using malloc loads."""
        free = self.backend.memory_info()[0]
        if nbytes > free:
            raise RuntimeError(
                f"malloc_heap_size {nbytes} is more than the {free} bytes the device has "
                "free beside the pool's arena (growth off), where the driver carves the "
                "heap when a kernel using malloc loads: set it before the pool's first "
                "allocation")

    @property
    def lock(self):
        """The pool's re-entrant lock: hold it to read several things (its
        snapshot, an observer's state) at one instant."""
        return self._lock

    @property
    def initialized(self):
        """True once the pool has reserved device memory or resolved its limit."""
        return self._initialized

    def _initialize(self):
        """Resolve the limit and, with growth off, reserve the arena. The
        pool stays uninitialized when this raises or the arena finds no
        memory, so the next request tries again."""
        free, total = self.backend.memory_info()
        settings = self._settings
        if settings.expandable_segments is not False and settings.growth \
                and settings.max_split_size_mb is None and self.backend.page_size \
                and self._range is None:
            self._reserve_range(total)
        self._limit = pool_limit(self._settings, total)
        self._update_scarce_rules()
        if self._growth_off:
            if self._settings.limit is None:
                nbytes = min(free - self.backend.headroom(free), self._limit)
            else:
                nbytes = min(self._limit, free)
            if not self._reserve_arena(nbytes):
                return
        self._initialized = True

    def _reserve_arena(self, nbytes):
        """Reserve the largest arena of at most ``nbytes`` the device gives
        (trying 5% less each time); False when not even one unit fits."""
        nbytes = nbytes // ARENA_UNIT * ARENA_UNIT
        while nbytes >= ARENA_UNIT:
            if self._add_segment(nbytes, LARGE, False) is not None:
                return True
            nbytes = int(nbytes * 0.95) // ARENA_UNIT * ARENA_UNIT
        return False
