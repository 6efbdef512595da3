"""Where a device's used memory goes: one table that adds up to what its
driver reports used (total minus free).

From a pool's snapshot (its ``device`` figures, read at the same instant as
its counters): the pool's allocated blocks (numba-cuda's staged copies of
host arrays among them) and cached ones, its backend's scratch, and the rest
of the device's used memory: with NVML's per-process figures, this process
outside the pool (the CUDA context, loaded modules, NRT's device malloc
heap unless NRT is served by the pool's heap (nrt_heap_size, a part of its
allocated blocks), managed memory, other libraries) and the other processes, the
remainder unaccounted (the driver's own); without them, one row for all of
that. The pool's pinned host cache is host memory: a row apart, outside the
sum.
"""

import textwrap

from ..plugin.registry import resolve_pool
from ..policy.backend import CONTEXT_CLOSED
from ..units import format_bytes
from .nvml import process_usage

# what "outside the pool" holds, besides other processes without NVML
OUTSIDE = "the CUDA context, modules, NRT heap, managed memory, libraries"
_LABEL = 60                 # characters of a row's label in format_ledger
_WIDTH = 84                 # characters of a line of text (a row is _LABEL + 12)


def ledger_rows(snapshot, processes=None):
    """[(label, bytes)], the rows that add up to ``device used``, which comes
    last. ``snapshot``: a Pool.snapshot(); ``processes``: (this process's
    bytes, the other processes' bytes) as :func:`~numba_alloc.observe.nvml.
    process_usage` returns them, or None."""
    stats, device = snapshot["stats"], snapshot["device"]
    used = device["total"] - device["free"]
    allocated = stats["allocated_bytes.all.current"]
    reserved = stats["reserved_bytes.all.current"]
    pool = reserved + device["scratch_bytes"]
    rows = [("pool: allocated blocks", allocated),
            ("pool: cached blocks", reserved - allocated),
            ("pool: its scratch", device["scratch_bytes"])]
    if processes is None:
        rows.append(("outside the pool, other processes included", used - pool))
    else:
        mine, others = processes
        rows += [("this process, outside the pool", mine - pool),
                 ("other processes", others),
                 ("unaccounted (the driver's own)", used - mine - others)]
    rows.append(("device used", used))
    return rows


def format_ledger(snapshot, processes=None, nrt_on=False):
    """The ledger as text lines: the rows, the staged bytes and NRT's heap
    (nrt_heap_size) among the allocated, the size of CUDA's device malloc
    heap when kernels use NRT on it (``nrt_on``), and the host cache
    apart; one line saying the device's figures are unavailable, and why,
    when the snapshot has none (its pool's context was closed)."""
    if snapshot["device"] is None:
        return textwrap.wrap(f"Device memory: unavailable: {CONTEXT_CLOSED}", _WIDTH,
                             subsequent_indent="  ")
    rows = ledger_rows(snapshot, processes)
    stats = snapshot["stats"]
    parts = [("  of which staged for kernel launches", stats["staged_bytes.current"]),
             ("  of which NRT's heap (np.empty in kernels)", stats.get("nrt.reserved_bytes", 0))]
    lines = [f"Device memory, {format_bytes(snapshot['device']['total'])} total: the rows "
             "add up to the driver's used"]
    for label, nbytes in rows[:-1]:
        lines.append(f"  {label:<{_LABEL}}{format_bytes(nbytes):>12}")
        if label == "pool: allocated blocks":
            lines += [f"  {part:<{_LABEL}}{format_bytes(n):>12}" for part, n in parts if n]
    lines.append(f"  {'= ' + rows[-1][0]:<{_LABEL}}{format_bytes(rows[-1][1]):>12}")
    lines.append(f"  (outside the pool: {OUTSIDE})")
    heap = snapshot["device"].get("malloc_heap_size")
    if heap is not None and nrt_on:
        lines.append(f"  {'NRT (np.empty in kernels): CUDA device malloc heap':<{_LABEL}}"
                     f"{format_bytes(heap):>12}")
    host = sum(b["size"] for b in snapshot.get("host_blocks", ()))
    if host:
        lines.append(f"  {'host memory (not in the sum): pinned host cache':<{_LABEL}}"
                     f"{format_bytes(host):>12}")
    return lines


def processes_of(pool):
    """NVML's (this process, other processes) bytes on ``pool``'s GPU, or
    None (a simulated device, or no figures)."""
    return process_usage(pool.backend.device_id) if pool.backend.name == "cuda" else None


def memory_ledger(device=None) -> dict[str, int]:
    """{label: bytes}: where the device's used memory goes, rows that add up
    to ``"device used"`` (the driver's total minus free), read at one
    instant with the pool's counters (see the module docstring). ``device``
    as for memory_stats (a Pool on a simulated device too). RuntimeError
    when the pool's context was closed (cuda.close()): the device's figures
    are gone (Backend.check_alive)."""
    with resolve_pool(device) as pool:
        snapshot = pool.snapshot()
        if snapshot["device"] is None:      # the context is gone: this raises
            pool.backend.check_alive()
        return dict(ledger_rows(snapshot, processes_of(pool)))
