"""Pinned host memory from a cache, as PyTorch's caching host allocator.

A request is rounded up to a power of two (at least 512 bytes) and served
by a cached block of that size and the same allocation flags (the driver's
cuMemHostAlloc flags: mapped, portable, write-combined); when none is
cached but one is waiting for its GPU work, by that one after waiting for
the devices (Numba knows no stream a pinned array is used on, and its own
cuMemFreeHost waits for the device at every free); else by a new one from
the backend. A block given back is reusable once the GPU work queued
before then has finished, on every device: pinned host memory serves every
device's work, whichever pool's cache it came from. The blocks given back
are covered by one event over every device (the backend's
event_all_devices, recorded at the cache's next operation) and join the
cache when it has completed, as the pool's frees do; every wait of the
cache waits for every device (synchronize, then synchronize_other_devices). ``limit`` (the ``host_cache_limit``
setting) caps the bytes held, in use and cached together: a request over it
first returns cached blocks, then raises :class:`HostOutOfMemoryError`, as
does a request the host cannot meet even with the cache emptied.

Thread safe: every method takes the cache's own lock but
:meth:`HostCache.give_back`, which takes none (garbage-collector finalizers
call it) and defers the block to the next operation.
"""

import contextlib
import threading
import time
from collections import deque

from ..validate import request_size
from .backend import HostOutOfMemory
from .tally import Tally

MIN_BLOCK = 512
# torch.cuda.host_memory_stats()'s families: (current, peak, allocated, freed); and
# ours, mapped_bytes: the bytes of the blocks in use that are mapped (cuda.mapped_array)
FAMILIES = ("allocations", "allocated_bytes", "active_requests", "active_bytes",
            "mapped_bytes")
TIMERS = ("host_alloc_time", "host_free_time")      # microseconds


class HostOutOfMemoryError(MemoryError):
    """A request for pinned host memory refused: by the host_cache_limit, or
    by the host (with the cache emptied)."""


def block_size(nbytes):
    """The bytes a request of ``nbytes`` gets: the next power of two, at least 512."""
    return max(MIN_BLOCK, 1 << (max(nbytes, 1) - 1).bit_length())


class HostBlock:
    """A pinned host block: ``buffer`` (what the backend's host_allocate
    returned: on CUDA the address), ``size`` (bytes, a power of two) and
    ``flags``; ``mapped``: whether it is mapped into the device's address
    space (counted in mapped_bytes while in use)."""

    __slots__ = ("buffer", "size", "flags", "mapped", "given_back")

    def __init__(self, buffer, size, flags, mapped):
        self.buffer, self.size, self.flags, self.mapped = buffer, size, flags, mapped
        self.given_back = False     # since it was last taken


class HostCache:
    """The pinned host blocks of one ``backend`` (a Backend whose
    host_allocate takes flags), within ``limit`` bytes (None: no cap)."""

    def __init__(self, backend, limit=None):
        self._backend = backend
        self._limit = limit
        self._lock = threading.Lock()
        self._free = {}                 # (flags, size) -> cached blocks, the last given back last
        self._given = deque()           # blocks given back, not yet covered by an event
        self._pending = deque()         # (event, blocks), in record order
        self._taken = set()             # blocks in use (given back ones too, until cached)
        self._held = 0                  # > 0: blocks given back are not cached (hold)
        self._waiting = {}              # (flags, size) -> blocks given back, not yet cached
        self._tallies = {name: Tally() for name in FAMILIES}
        self._times = {name: [0, 0, None, 0] for name in TIMERS}    # total, max, min, count
        self.num_host_alloc = self.num_host_free = 0

    # -- requests ------------------------------------------------------------
    def take(self, nbytes, flags=0, mapped=False):
        """A :class:`HostBlock` of at least ``nbytes`` bytes with ``flags``
        (``mapped``: they map it into the device's address space):
        cached, or new. Raises HostOutOfMemoryError over the limit or when
        the host has no room even with the cache emptied (then only cached
        blocks have been returned), and TypeError or ValueError for an
        ``nbytes`` that is not a whole number of bytes, not negative."""
        size = block_size(request_size(nbytes))
        with self._lock:
            self._collect()
            key = (flags, size)
            if not self._free.get(key) and self._waiting.get(key) and not self._held:
                # one of this size waits for GPU work: wait for the devices rather
                # than pay a cuMemHostAlloc (milliseconds; Numba's own
                # cuMemFreeHost waits for the device at every free)
                self._synchronize()
                self._collect()
            cached = self._free.get(key)
            if cached:
                block = cached.pop()
            else:
                block = self._grow(size, flags, mapped)
            block.given_back, block.mapped = False, mapped
            self._taken.add(block)
            self._tallies["active_requests"].up(1)
            self._tallies["active_bytes"].up(size)
            if block.mapped:
                self._tallies["mapped_bytes"].up(size)
            return block

    def give_back(self, block):
        """Return a block from :meth:`take`; it is reused once the GPU work
        queued before the cache's next operation has finished. Takes no
        lock, never raises (for finalizers); a second return of one taking
        is ignored."""
        if not block.given_back:
            block.given_back = True
            self._given.append(block)

    @contextlib.contextmanager
    def hold(self):
        """While active (nestable, for all threads), blocks given back are
        not cached, so not handed out again (Numba's defer_cleanup: work on
        a stream no event of the cache covers may still use them)."""
        with self._lock:
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1

    def _grow(self, size, flags, mapped):
        limit = self._limit
        held = self._tallies["allocated_bytes"]
        if limit is not None and held.current + size > limit:
            self._release_cached(held.current + size - limit)
            if held.current + size > limit and self._wait_for_given_back():
                self._release_cached(held.current + size - limit)
            if size > limit:
                raise HostOutOfMemoryError(
                    f"pinned host memory: {size} bytes asked, more than the host_cache_limit "
                    f"of {limit} by itself; raise host_cache_limit")
            if held.current + size > limit:
                raise HostOutOfMemoryError(
                    f"pinned host memory: {size} bytes asked, {self.in_use_bytes} in use of "
                    f"the host_cache_limit of {limit}; free pinned arrays or raise "
                    "host_cache_limit")
        try:
            buffer = self._timed("host_alloc_time", self._backend.host_allocate, size, flags)
        except HostOutOfMemory as first:
            try:
                released = self._release_cached(None)
                if self._wait_for_given_back():
                    released += self._release_cached(None)
                if not released:
                    raise first
                buffer = self._timed("host_alloc_time", self._backend.host_allocate, size,
                                     flags)
            except HostOutOfMemory as e:
                raise HostOutOfMemoryError(
                    f"pinned host memory: {size} bytes asked, the host has no room "
                    f"(cache emptied; {self.in_use_bytes} bytes in use): {e}") from None
        self.num_host_alloc += 1
        self._tallies["allocations"].up(1)
        self._tallies["allocated_bytes"].up(size)
        return HostBlock(buffer, size, flags, mapped)

    def _wait_for_given_back(self):
        """When blocks given back wait for GPU work, wait for the devices and
        cache them (rather than refuse a request their room would serve);
        whether it waited."""
        self._collect()
        if not self._pending or self._held:
            return False
        self._synchronize()
        self._collect()
        return True

    def _synchronize(self):
        """Wait for every device's work (this backend's device first)."""
        self._backend.synchronize()
        self._backend.synchronize_other_devices()

    # -- what the cache holds ------------------------------------------------
    def _collect(self):
        """Cover the blocks given back with one event, and cache those whose
        event has completed (never blocks). When making or recording the
        event raises, the blocks stay given back for the next try. Does
        nothing while held, nor once the backend's context is gone
        (Backend.context_alive: cuda.close()), whose work and pinned memory
        went with it: the blocks given back stay in use, and the cache's
        readers still answer."""
        if self._held or not self._backend.context_alive:
            return
        given = self._given
        if given:
            # those given back by now: the event covers the work before their
            # returns, not that of a block another thread gives back meanwhile
            count = len(given)
            event = self._backend.event_all_devices()
            event.record()
            blocks = [given.popleft() for _ in range(count)]
            self._pending.append((event, blocks))
            for block in blocks:
                key = (block.flags, block.size)
                self._waiting[key] = self._waiting.get(key, 0) + 1
        pending, waiting = self._pending, self._waiting
        while pending and pending[0][0].query():
            blocks = pending.popleft()[1]
            for block in blocks:
                waiting[(block.flags, block.size)] -= 1
            self._cache(blocks)

    def _release_cached(self, nbytes):
        """Return cached blocks to the backend, the largest first, until
        ``nbytes`` (None: all) have gone; the bytes returned. When the
        backend raises, the block it refused stays cached."""
        released = 0
        for key in sorted(self._free, key=lambda k: -k[1]):
            blocks = self._free[key]
            while blocks and (nbytes is None or released < nbytes):
                block = blocks[-1]
                self._timed("host_free_time", self._backend.host_release, block.buffer)
                blocks.pop()
                self.num_host_free += 1
                self._tallies["allocations"].down(1)
                self._tallies["allocated_bytes"].down(block.size)
                released += block.size
            if not blocks:
                del self._free[key]
        return released

    @property
    def in_use_bytes(self):
        """Bytes of the blocks taken and not yet reusable."""
        return self._tallies["active_bytes"].current

    def empty(self):
        """Return every cached block to the backend (blocks in use, or
        waiting for their GPU work, stay); the bytes returned."""
        with self._lock:
            self._collect()
            return self._release_cached(None)

    def set_limit(self, limit):
        """Cap the bytes held at ``limit`` (None: no cap) from now on: a
        request over it first returns cached blocks. The pool's settings
        check it first (:meth:`check_limit`) and return the cached blocks
        over it (:meth:`return_over`); held bytes a request of another
        thread took meanwhile, under the old limit, go at the next request
        over the new one. Cannot fail."""
        with self._lock:
            self._limit = limit

    def return_over(self, limit):
        """Return cached blocks, the largest first, until at most ``limit``
        bytes are held (those in use stay); the limit in force is not
        changed. Raises what the backend raises: the block it refused, and
        those not reached, stay cached."""
        with self._lock:
            self._collect()
            held = self._tallies["allocated_bytes"].current
            if held > limit:
                self._release_cached(held - limit)

    def check_limit(self, limit):
        """RuntimeError, nothing changed, when the blocks in use alone hold
        more than ``limit`` (blocks given back count once the devices have
        finished the work queued before: they are waited for then)."""
        with self._lock:
            self._check_limit(limit)

    def _check_limit(self, limit):
        self._collect()
        if limit is not None and self.in_use_bytes > limit and self._pending:
            self._synchronize()                 # blocks given back wait for nothing else
            self._collect()
        if limit is not None and self.in_use_bytes > limit:
            raise RuntimeError(
                f"host_cache_limit {limit} is below the {self.in_use_bytes} bytes of pinned "
                "host memory in use (pinned and mapped arrays, and the copies of blocks "
                "reclaimed to host memory: free or use them first)")

    def wait_for_other_devices(self):
        """Before :meth:`forget_work`: when blocks given back may still be
        used by another device's work, wait for the other devices (with
        one device: no driver call). Raises what the backend raises,
        nothing changed."""
        with self._lock:
            if self._given or self._pending:
                self._backend.synchronize_other_devices()

    def forget_work(self):
        """Every device is idle as to the blocks given back (this one's
        context is being reset; :meth:`wait_for_other_devices` waited for
        the others): cache the blocks given back without waiting, then
        return every cached block (blocks still in use stay theirs)."""
        with self._lock:
            pending, self._pending = self._pending, deque()
            for _, blocks in pending:
                self._cache(blocks)
            self._waiting.clear()
            self._cache([self._given.popleft() for _ in range(len(self._given))])
            self._release_cached(None)

    def _cache(self, blocks):
        """Make ``blocks`` reusable (one given back twice counts once)."""
        for block in blocks:
            if block not in self._taken:
                continue
            self._taken.discard(block)
            self._free.setdefault((block.flags, block.size), []).append(block)
            self._tallies["active_requests"].down(1)
            self._tallies["active_bytes"].down(block.size)
            if block.mapped:
                self._tallies["mapped_bytes"].down(block.size)

    # -- counters ------------------------------------------------------------
    def records(self):
        """The snapshot's ``host_blocks``: each block's size, flags and
        state ("in_use": taken, or given back and waiting for its GPU work;
        "cached")."""
        with self._lock:
            self._collect()
            taken = [{"size": b.size, "flags": b.flags, "state": "in_use"} for b in self._taken]
            cached = [{"size": b.size, "flags": b.flags, "state": "cached"}
                      for blocks in self._free.values() for b in blocks]
            return sorted(taken + cached, key=lambda r: (r["state"], -r["size"]))

    def _timed(self, name, call, *args):
        """``call(*args)``, timed in timer ``name`` when it returns: a call
        that raises counts nowhere, as in num_host_alloc and num_host_free."""
        start = time.perf_counter_ns()
        result = call(*args)
        us = (time.perf_counter_ns() - start) // 1000
        t = self._times[name]
        t[0] += us
        t[1] = max(t[1], us)
        t[2] = us if t[2] is None else min(t[2], us)
        t[3] += 1
        return result

    def stats(self):
        """The counters keyed as torch.cuda.host_memory_stats():
        ``{allocations, allocated_bytes, active_requests,
        active_bytes}.{current,peak,allocated,freed}``, ``num_host_alloc``,
        ``num_host_free``, ``host_{alloc,free}_time.{total,max,min,count,avg}``
        (microseconds, of the calls that succeeded), and ours:
        ``cached_bytes`` (held, not in use) and ``host_cache_limit`` (-1:
        none)."""
        with self._lock:
            self._collect()
            out = {}
            for name, tally in self._tallies.items():
                out.update(tally.items(name))
            for name, (total, most, least, count) in self._times.items():
                out.update({f"{name}.total": total, f"{name}.max": most,
                            f"{name}.min": least or 0, f"{name}.count": count,
                            f"{name}.avg": total // count if count else 0})
            out["num_host_alloc"], out["num_host_free"] = self.num_host_alloc, self.num_host_free
            out["cached_bytes"] = self._tallies["allocated_bytes"].current - self.in_use_bytes
            out["host_cache_limit"] = -1 if self._limit is None else self._limit
            return dict(sorted(out.items()))

    def reset_peaks(self):
        """Set every peak to its current value."""
        with self._lock:
            self._collect()
            for tally in self._tallies.values():
                tally.reset_peak()

    def reset_accumulated(self):
        """Zero the allocated/freed totals, the counts and the timings."""
        with self._lock:
            self._collect()
            for tally in self._tallies.values():
                tally.reset_accumulated()
            for name in TIMERS:
                self._times[name] = [0, 0, None, 0]
            self.num_host_alloc = self.num_host_free = 0
