"""The text report of a pool (what ``numba-alloc run`` and ``demo`` print)."""

from .pool import _fmt

_ROWS = (("allocated_bytes", "Allocated memory"), ("active_bytes", "Active memory"),
         ("requested_bytes", "Requested memory"), ("reserved_bytes", "Reserved memory"),
         ("inactive_split_bytes", "Non-releasable memory"), ("allocation", "Allocations"),
         ("active", "Active allocs"), ("segment", "Device reserved segments"))


def format_report(pool, title=None):
    """A table of the pool's counters, per pool, in the manner of
    torch.cuda.memory_summary, with its free-memory fragmentation."""
    snap = pool.snapshot()
    stats = snap["stats"]
    free_blocks = [b["size"] for s in snap["segments"] for b in s["blocks"]
                   if b["state"] == "inactive"]
    total_free = sum(free_blocks)
    largest = max(free_blocks, default=0)
    fragmentation = 1 - largest / total_free if total_free else 0.0
    name = title or f"numba_alloc: {pool.backend.name} device {pool.backend.device_id}"
    width = 84
    lines = ["=" * width, name.center(width), "-" * width,
             f"{'Metric':<26}{'Cur Usage':>14}{'Peak Usage':>14}{'Tot Alloc':>15}{'Tot Freed':>15}"]
    for family, label in _ROWS:
        is_bytes = family.endswith("bytes")
        for kind, suffix in (("all", ""), ("large_pool", "  from large pool"),
                             ("small_pool", "  from small pool")):
            values = [stats[f"{family}.{kind}.{m}"] for m in ("current", "peak", "allocated", "freed")]
            cells = [_fmt(v) if is_bytes else str(v) for v in values]
            row = label if not suffix else suffix
            lines.append(f"{row:<26}{cells[0]:>14}{cells[1]:>14}{cells[2]:>15}{cells[3]:>15}")
        lines.append("-" * width)
    events = ", ".join(f"{k}={stats[k]}" for k in (
        "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_alloc_retries",
        "num_ooms", "num_single_reclaims", "num_full_reclaims"))
    lines += [f"Events: {events}",
              f"Largest free block: {_fmt(largest)}; free in blocks: {_fmt(total_free)}; "
              f"fragmentation (1 - largest free / total free): {fragmentation:.3f}",
              "=" * width]
    return "\n".join(lines)
