"""Checks that a pool's block table and its counters agree, from an atomic
snapshot."""

KINDS = {"small": "small_pool", "large": "large_pool"}
LIVE = ("active_allocated", "active_pending_free")


def recount(segments):
    """Counters recomputed from the block table, keyed as memory_stats."""
    counts = {}
    for kind in ("all", "small_pool", "large_pool"):
        for family in ("allocation", "allocated_bytes", "segment", "reserved_bytes",
                       "active", "active_bytes", "inactive_split",
                       "inactive_split_bytes", "requested_bytes"):
            counts[f"{family}.{kind}.current"] = 0

    def add(family, kind, amount):
        counts[f"{family}.{kind}.current"] += amount
        counts[f"{family}.all.current"] += amount

    for seg in segments:
        kind = KINDS[seg["segment_type"]]
        add("segment", kind, 1)
        add("reserved_bytes", kind, seg["total_size"])
        split = len(seg["blocks"]) > 1
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                add("allocation", kind, 1)
                add("allocated_bytes", kind, b["size"])
            if b["state"] in LIVE:
                add("active", kind, 1)
                add("active_bytes", kind, b["size"])
                add("requested_bytes", kind, b["requested_size"])
            elif split:
                add("inactive_split", kind, 1)
                add("inactive_split_bytes", kind, b["size"])
    return counts


def check(pool):
    """Assert every invariant of the pool; return the snapshot."""
    snap = pool.snapshot()
    segments, stats = snap["segments"], snap["stats"]
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
    for key, value in recount(segments).items():
        assert stats[key] == value, f"{key}: counter {stats[key]} != recount {value}"
    for key, value in stats.items():
        assert value >= 0, f"{key} is negative"
        if key.endswith(".current"):
            base = key[:-len(".current")]
            assert stats[base + ".peak"] >= value
            assert stats[base + ".allocated"] - stats[base + ".freed"] == value, base
    return snap
