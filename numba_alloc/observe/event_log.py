"""The pools' rare events in Python's logging: logger ``"numba_alloc"``.

Every :class:`~numba_alloc.Pool` gets an :class:`EventLog` observer when it
is made (this module registers with ``policy.live_pools`` when numba_alloc
is imported). At INFO it logs out-of-memory errors, defragmentations,
blocks reclaimed to host memory and cache flushes (every free segment
returned to the device), one record each. It observes no block or segment
event, so the pool's request and free paths do not call it; a record is
made under the pool's lock, only when the logger is enabled for INFO.
"""

import logging

from ..policy.live_pools import when_pool_made
from ..policy.observers import PoolObserver
from ..units import format_bytes

logger = logging.getLogger("numba_alloc")


def _device(pool):
    return f"{pool.backend.name} device {pool.backend.device_id}"


def _count(number, noun):
    return f"{number} {noun}{'s' * (number != 1)}"


class EventLog(PoolObserver):
    """Logs a pool's out-of-memory errors, defragmentations, reclaims and
    cache flushes to :data:`logger` at INFO. Never raises (logging's
    handlers report their own errors)."""

    def on_out_of_memory(self, pool, nbytes):
        if logger.isEnabledFor(logging.INFO):
            logger.info("out of memory on %s: a request of %s failed",
                        _device(pool), format_bytes(nbytes))

    def on_defragment(self, pool, blocks_moved, bytes_moved):
        if logger.isEnabledFor(logging.INFO):
            logger.info("defragmentation on %s: moved %s, %s", _device(pool),
                        _count(blocks_moved, "block"), format_bytes(bytes_moved))

    def on_reclaim(self, pool, block):
        if logger.isEnabledFor(logging.INFO):
            logger.info("reclaim on %s: a block of %s moved to host memory",
                        _device(pool), format_bytes(block.allocated_size))

    def on_cache_flush(self, pool, segments, nbytes):
        if logger.isEnabledFor(logging.INFO):
            logger.info("cache flush on %s: returned %s, %s, to the device", _device(pool),
                        _count(segments, "segment"), format_bytes(nbytes))


def log_events(pool):
    """Attach an :class:`EventLog` to ``pool`` (the hook for every new pool)."""
    pool.add_observer(EventLog())


when_pool_made(log_events)
