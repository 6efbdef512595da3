"""Every counter of a pool, declared once, with its meaning.

This table drives the stats (the compiled core's layout of the families),
the keys of ``memory_stats``, the rows of ``memory_summary``, the invariant
recount of the tests and the README's table (a test checks the README
against it), as mimalloc's ``MI_STAT_FIELDS`` and Go's ``MemStats`` do.

Forms:

* ``POOL``: a family kept per pool kind. ``memory_stats`` has
  ``NAME.{all,large_pool,small_pool}.{current,peak,allocated,freed}``.
* ``LARGE``: a family of the large pool only: ``NAME.{current,peak,allocated,freed}``.
* ``EVENT``: a plain count, or a sum of bytes: ``NAME``.

``DEVICE_HEAP_COUNTERS`` are the device heaps' (numba_alloc.DeviceHeap),
summed over a pool's open heaps: ``device_heap.NAME``; ``NRT_HEAP_COUNTERS``
those of the heap serving NRT (the nrt_heap_size setting): ``nrt.NAME``. Those the kernels
update live in device memory (heap_kernels.py lays them out); each heap's
``stats()`` has them under the same names.

``recount``, for the POOL families: what a walk of the block table adds up
to the current value, as (blocks, amount): blocks ``"segment"`` (each
segment), ``"allocated"``, ``"active"`` (allocated or pending) or
``"split_free"`` (free blocks that share their segment); amount ``1`` or the
name of a snapshot field (``"size"``, ``"requested_size"``,
``"total_size"``).
"""

from typing import NamedTuple

POOL, LARGE, EVENT = "pool", "large", "event"


class Counter(NamedTuple):
    name: str
    form: str
    meaning: str
    summary: str | None = None      # memory_summary's row (None: not shown)
    recount: tuple | None = None


COUNTERS = (
    Counter("allocated_bytes", POOL, "bytes of the blocks handed out and not freed, on "
            "the device (reclaim counts a block it moves to host memory as freed, and as "
            "allocated again when it comes back)",
            "Allocated memory", ("allocated", "size")),
    Counter("active_bytes", POOL, "bytes of the active blocks: allocated, or freed "
            "while GPU work queued before the free may still use them",
            "Active memory", ("active", "size")),
    Counter("requested_bytes", POOL, "bytes requested (before rounding) for the active "
            "blocks", "Requested memory", ("active", "requested_size")),
    Counter("reserved_bytes", POOL, "bytes of device memory the pool holds (its segments)",
            "Reserved memory", ("segment", "total_size")),
    Counter("inactive_split_bytes", POOL, "bytes of the free blocks that share their "
            "segment (PyTorch's non-releasable memory: empty_cache() cannot return them "
            "as whole segments; under expandable_segments it returns the whole pages "
            "inside them)", "Non-releasable memory", ("split_free", "size")),
    Counter("allocation", POOL, "blocks handed out and not freed, on the device (as "
            "allocated_bytes)", "Allocations",
            ("allocated", 1)),
    Counter("active", POOL, "active blocks", "Active allocs", ("active", 1)),
    Counter("segment", POOL, "segments reserved from the device", "Device reserved segments",
            ("segment", 1)),
    Counter("inactive_split", POOL, "free blocks that share their segment",
            "Non-releasable allocs", ("split_free", 1)),
    Counter("oversize_allocations", LARGE, "allocated blocks of max_split_size or more",
            "Oversize allocations"),
    Counter("oversize_segments", LARGE, "segments of max_split_size or more made for "
            "requests (as PyTorch counts them: by the segment's size)", "Oversize segments"),
    Counter("reclaimed_bytes", LARGE, "bytes of live blocks reclaimed to host memory (the "
            "reclaim setting): now, at most, moved there (allocated), brought back or freed "
            "there (freed)", "Reclaimed to host memory"),
    Counter("reclaimed", LARGE, "live blocks reclaimed to host memory", "Reclaimed blocks"),
    Counter("lms_active_bytes", LARGE, "bytes of the blocks in use (inside Pool.use; under the Numba "
            "plugin, the arrays of a kernel launch or copy while it is being issued): TensorFlow "
            "Large Model Support's active bytes, which reclaim never takes",
            "In use (LMS active)"),
    Counter("staged_bytes", LARGE, "bytes of the blocks staging work that a library queues "
            "(numba-cuda's device copies of the host arrays passed to a kernel, through "
            "cuda-core's memory resource): held until their buffer closes, never moved or "
            "reclaimed; also counted in allocated_bytes", "Staged for launches"),
    Counter("staged", LARGE, "blocks staging such work (as staged_bytes)", "Staged blocks"),
    Counter("num_device_alloc", EVENT, "segments reserved from the device (cuMemAlloc calls "
            "that succeeded)", "num_device_alloc"),
    Counter("num_device_free", EVENT, "segments returned to the device", "num_device_free"),
    Counter("num_sync_all_streams", EVENT, "waits for every pending free, as PyTorch's "
            "synchronize_and_free_events: each empty_cache() and each request served by the "
            "retry (counted whether frees were pending or not), and each device "
            "synchronization to make pending frees reusable (synchronize(), a failed "
            "request's retry, reclaim, defragmentation)", "num_sync_all_streams"),
    Counter("num_alloc_retries", EVENT, "requests served by the retry once growing failed "
            "(wait for pending frees, return cached segments, grow again), as PyTorch's "
            "alloc_block(isRetry=true); a request that fails counts only in num_ooms",
            "num_alloc_retries"),
    Counter("num_ooms", EVENT, "requests that raised OutOfMemoryError", "num_ooms"),
    Counter("num_cache_trims", EVENT, "times selected free segments were returned "
            "(pressure, garbage-collection threshold)", "num_cache_trims"),
    Counter("num_cache_flushes", EVENT, "times all free segments were returned "
            "(empty_cache, or pressure a single return did not relieve)", "num_cache_flushes"),
    Counter("bytes_released", EVENT, "bytes of cached segments returned to the device"),
    Counter("num_single_reclaims", EVENT, "requests met by reclaiming one inactive block to "
            "host memory", "num_single_reclaims"),
    Counter("num_full_reclaims", EVENT, "times every inactive block was reclaimed to host "
            "memory to meet a request", "num_full_reclaims"),
    Counter("num_defragmentations", EVENT, "defragmentations whose copies completed, as "
            "the copy kernels counted them in device memory", "num_defragmentations"),
    Counter("bytes_defragged", EVENT, "bytes of live blocks moved, as the copy kernels "
            "counted them"),
)

DEVICE_HEAP = "device_heap"
DEVICE_HEAP_COUNTERS = (
    Counter("count", DEVICE_HEAP, "open device heaps"),
    Counter("reserved_bytes", DEVICE_HEAP, "bytes of the pool blocks the heaps hold "
            "(their pages and bookkeeping)"),
    Counter("bytes_in_use", DEVICE_HEAP, "bytes of heap blocks handed out inside kernels "
            "and not freed (requests rounded up to their class, or to whole pages)"),
    Counter("peak_bytes_in_use", DEVICE_HEAP, "the peak of bytes_in_use since the heap's "
            "reset (a sum of the heaps' peaks)"),
    Counter("num_allocs", DEVICE_HEAP, "heap.malloc calls that returned a block"),
    Counter("num_frees", DEVICE_HEAP, "heap.free calls that gave a block back"),
    Counter("num_failed", DEVICE_HEAP, "heap.malloc calls that returned -1 (heap full, "
            "or a negative size)"),
    Counter("num_invalid_frees", DEVICE_HEAP, "heap.free calls with an offset that is not "
            "a live block (ignored)"),
)

NRT_HEAP = "nrt"
NRT_HEAP_COUNTERS = (
    Counter("size", NRT_HEAP, "bytes of the heap that serves NRT's allocations inside "
            "kernels (np.empty and the like) with the nrt_heap_size setting: that setting "
            "rounded up to 64 KiB pages; 0 before the first kernel that uses it is loaded"),
    Counter("reserved_bytes", NRT_HEAP, "bytes of the pool blocks NRT's heap holds (its "
            "pages, its bookkeeping and its descriptor), within the pool's limit"),
    Counter("bytes_in_use", NRT_HEAP, "bytes of NRT's heap handed out inside kernels and "
            "not freed (as device_heap.bytes_in_use)"),
    Counter("peak_bytes_in_use", NRT_HEAP, "the peak of bytes_in_use"),
    Counter("num_allocs", NRT_HEAP, "NRT's allocations the heap served (NRT_Allocate, "
            "NRT_Allocate_External: an array's MemInfo and data are one)"),
    Counter("num_frees", NRT_HEAP, "NRT_Free calls that gave a block back"),
    Counter("num_failed", NRT_HEAP, "NRT allocations the heap refused (full): NRT got the "
            "null pointer, as from CUDA's malloc"),
    Counter("num_invalid_frees", NRT_HEAP, "NRT_Free calls with a pointer that is not a "
            "live block of the heap (ignored)"),
)

MANAGED = "managed"
MANAGED_COUNTERS = (
    Counter("managed_bytes", MANAGED, "bytes of managed (unified) memory made under the "
            "plugin (cuda.managed_array, Numba's cuMemAllocManaged) and not freed: not the "
            "pool's, outside its limit"),
    Counter("managed", MANAGED, "such allocations"),
)

FAMILIES = tuple(c for c in COUNTERS if c.form != EVENT)     # the core's counters, in order
EVENTS = tuple(c.name for c in COUNTERS if c.form == EVENT)  # kept by the pool in Python


def family_index(name):
    """Position of a family in the compiled core's counters."""
    return next(i for i, c in enumerate(FAMILIES) if c.name == name)


def markdown_table():
    """The README's table of counters: key, and meaning."""
    lines = ["| key in `memory_stats` | meaning |", "| --- | --- |"]
    suffix = {POOL: ".{all,large_pool,small_pool}.{current,peak,allocated,freed}",
              LARGE: ".{current,peak,allocated,freed}", EVENT: ""}
    for c in COUNTERS:
        lines.append(f"| `{c.name}{suffix[c.form]}` | {c.meaning} |")
    for c in DEVICE_HEAP_COUNTERS:
        lines.append(f"| `{DEVICE_HEAP}.{c.name}` | {c.meaning} |")
    for c in NRT_HEAP_COUNTERS:
        lines.append(f"| `{NRT_HEAP}.{c.name}` | {c.meaning} |")
    for c in MANAGED_COUNTERS:
        lines.append(f"| `{c.name}.{{current,peak,allocated,freed}}` | {c.meaning} |")
    return "\n".join(lines)
