"""A reclaimed block's bytes in pinned host memory: the chunks that hold
them, taken from the pool's host cache (host_cache.py, which the pinned
arrays of Numba share), and the copies between the block and them.

A block of ``n`` bytes is held by ``n // CHUNK`` chunks of CHUNK bytes and,
for the rest, one chunk the cache rounds up to a power of two (at least 512
bytes): :func:`host_bytes`. Chunks of one size serve blocks of any size,
so the cache's blocks are reused from one reclaim to the next (a
cuMemHostAlloc costs milliseconds, its cuMemFreeHost waits for the device)
and the rounding loses less than half of the last chunk.

Every chunk is page-locked memory from the backend's ``host_allocate``
(cuMemHostAlloc on CUDA), never pageable memory, so each copy is
asynchronous: one per chunk, each queued behind all work queued before it
(the backend's copy_to_host and copy_from_host; on CUDA the legacy default
stream). The copy of one chunk runs while the host takes the next chunk
(a new one is pinned then) and queues its copy; nothing waits between them.
A chunk given back is reused only once the work queued before the cache's
next operation has completed (HostCache.give_back), so no copy queued into
or out of it can still be running then.

Not thread safe: the pool calls these under its lock (the cache takes its
own).
"""

from .host_cache import block_size

CHUNK = 8 << 20     #: bytes of a whole chunk: a power of two


def host_bytes(nbytes):
    """Bytes of pinned host memory the chunks holding ``nbytes`` take."""
    whole, rest = divmod(nbytes, CHUNK)
    return whole * CHUNK + (block_size(rest) if rest else 0)


def _spans(nbytes):
    """(offset, length) of each chunk's part of ``nbytes`` bytes, in order."""
    return [(offset, min(CHUNK, nbytes - offset)) for offset in range(0, nbytes, CHUNK)]


def copy_out(cache, backend, address, nbytes):
    """The chunks (a tuple of host_cache.HostBlock, from ``cache``) that
    hold the ``nbytes`` at device ``address`` once the copies queued now
    have completed. Raises what taking a chunk raises (HostOutOfMemoryError
    over the host_cache_limit or when the host has no room; what the
    backend raised) or what queuing a copy raises; then the chunks taken
    are given back, reused once the copies queued into them have run."""
    chunks = []
    try:
        for offset, length in _spans(nbytes):
            chunk = cache.take(length)
            chunks.append(chunk)
            backend.copy_to_host(address + offset, chunk.buffer, length)
    except BaseException:
        give_back(cache, chunks)
        raise
    return tuple(chunks)


def copy_in(backend, chunks, address, nbytes):
    """Queue the copies of the first ``nbytes`` that ``chunks`` hold (from
    :func:`copy_out`) to device ``address``: work queued after them sees
    the bytes. Raises what queuing a copy raises (the copies queued before
    it still run)."""
    for chunk, (offset, length) in zip(chunks, _spans(nbytes)):
        backend.copy_from_host(chunk.buffer, address + offset, length)


def give_back(cache, chunks):
    """Return ``chunks`` to ``cache``, reused once the work queued before
    its next operation has completed. Never raises, takes no lock."""
    for chunk in chunks:
        cache.give_back(chunk)
