"""Checks that a pool's block table and its counters agree, from an atomic
snapshot."""

from numba_alloc.policy import core
from numba_alloc.policy.counters import COUNTERS, POOL

KINDS = {"small": "small_pool", "large": "large_pool"}
LIVE = ("active_allocated", "active_pending_free")


def _counted(blocks, seg, block):
    """Whether ``block`` of snapshot segment ``seg`` counts among ``blocks``
    (a recount rule of numba_alloc.policy.counters)."""
    state = block["state"]
    if blocks == "allocated":
        return state == "active_allocated"
    if blocks == "active":
        return state in LIVE
    assert blocks == "split_free", blocks
    return state not in LIVE and len(seg["blocks"]) > 1


def recount(segments):
    """Counters recomputed from the block table, keyed as memory_stats, by
    the recount rule that numba_alloc.policy.counters declares for each family."""
    families = [c for c in COUNTERS if c.form == POOL]
    assert all(c.recount for c in families), "every pool family has a recount rule"
    counts = {f"{c.name}.{kind}.current": 0
              for c in families for kind in ("all", "small_pool", "large_pool")}

    def add(family, kind, amount):
        counts[f"{family}.{kind}.current"] += amount
        counts[f"{family}.all.current"] += amount

    for seg in segments:
        kind = KINDS[seg["segment_type"]]
        for c in families:
            blocks, amount = c.recount
            if blocks == "segment":
                add(c.name, kind, 1 if amount == 1 else seg[amount])
                continue
            for b in seg["blocks"]:
                if _counted(blocks, seg, b):
                    add(c.name, kind, 1 if amount == 1 else b[amount])
    return counts


def check(pool):
    """Assert every invariant of the pool; return the snapshot."""
    with pool.lock:
        snap = pool.snapshot()
        releasable = pool._releasable_bytes()
        mv = pool._core.mv
        for segment in pool._segments.values():
            assert all(mv[core.TABLE + row * core.NF + core.BIG] == segment.big
                       for row in pool._core.rows_of(segment)), \
                "every row of a segment holds whether it is big (separate_big_segments)"
        for k in (-1, core.SMALL, core.LARGE):
            assert sorted(map(tuple, core.segments(pool._p, k).tolist())) == sorted(
                (seg.address, seg.size, seg.row) for seg in pool._segments.values()
                if k < 0 or seg.kind == k), \
                "the core's segments (defragmentation's view) are the pool's"
        mapped = pool._range
        page = pool.backend.page_size
        # the pages the device maps: the simulated device's set in the range,
        # or the CUDA backend's handles
        pages = getattr(pool.backend, "_ranges", {}).get(mapped[0]) if mapped else None
        if mapped and hasattr(pool.backend, "_page_handles"):
            pages = pool.backend._page_handles
        device_pages = None if pages is None else len(pages)
    segments, stats = snap["segments"], snap["stats"]

    def in_range(seg):
        return mapped is not None and mapped[0] <= seg["address"] < mapped[0] + mapped[1]

    def free_pages(seg):
        return sum(max(0, (b["address"] + b["size"]) // page * page - -(-b["address"] // page) * page)
                   for b in seg["blocks"] if b["state"] == "inactive")

    assert releasable == sum(free_pages(s) if in_range(s) else s["total_size"] for s in segments
                             if in_range(s) or [b["state"] for b in s["blocks"]] == ["inactive"]), \
        "the releasable bytes are those of the fully free segments (with expandable " \
        "segments, and the whole pages inside the free blocks of mapped segments)"
    runs = sorted((s["address"], s["address"] + s["total_size"]) for s in segments if in_range(s))
    for start, end in runs:
        assert start % page == 0 and end % page == 0, "a mapped segment is whole pages"
        assert end <= mapped[0] + mapped[1], "a mapped segment lies inside the reserved range"
    for (_, end), (start, _) in zip(runs, runs[1:]):
        assert end < start, "mapped segments that touch must have been joined"
    if device_pages is not None:
        assert device_pages * page == sum(end - start for start, end in runs), \
            "the device maps exactly the pages of the mapped segments"
    assert stats["staged_bytes.current"] == sum(b["size"] for b in snap["staged"])
    assert stats["staged.current"] == len(snap["staged"])
    ranges = []
    for seg in segments:
        address = seg["address"]
        previous_state = None
        for b in seg["blocks"]:
            assert b["address"] == address, "blocks must tile their segment"
            assert b["size"] > 0 and b["size"] % 512 == 0
            assert not (b["state"] == "inactive" and previous_state == "inactive"), \
                "adjacent free blocks must have been coalesced"
            if b["state"] == "active_allocated":
                assert b["requested_size"] <= b["size"]
            previous_state = b["state"]
            address += b["size"]
        assert address == seg["address"] + seg["total_size"], "blocks must cover the segment"
        ranges.append((seg["address"], seg["address"] + seg["total_size"]))
    ranges.sort()
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end <= start, "segments must not overlap"
    reclaimed = snap["reclaimed"]        # live blocks in host memory (the reclaim setting)
    assert stats["reclaimed_bytes.current"] == sum(r["size"] for r in reclaimed)
    assert stats["reclaimed.current"] == len(reclaimed)
    assert stats["lms_active_bytes.current"] == sum(u["size"] for u in snap["in_use"])
    for key, value in recount(segments).items():
        assert stats[key] == value, f"{key}: counter {stats[key]} != recount {value}"
    for key, value in stats.items():
        assert value >= 0, f"{key} is negative"
        if key.endswith(".current"):
            base = key[:-len(".current")]
            assert stats[base + ".peak"] >= value
            assert stats[base + ".allocated"] - stats[base + ".freed"] == value, base
    return snap
