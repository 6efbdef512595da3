"""memory_summary, short_summary and their pieces."""

import pytest

import numba_alloc
from numba_alloc.observe.summary import free_space, occupancy_bar, occupancy_line, short_summary
from numba_alloc.units import format_bytes

from workload import GiB, MiB, make_pool


def segment(sizes_and_states, address=0x1000, kind="large"):
    blocks, offset = [], 0
    for size, state in sizes_and_states:
        blocks.append({"address": address + offset, "size": size, "requested_size": size,
                       "state": state, "pinned": False})
        offset += size
    return {"address": address, "total_size": offset, "segment_type": kind, "blocks": blocks,
            "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive")}


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 3 * MiB // 2, 5 << 30)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 MiB", "5.00 GiB"]


def test_fragmentation_is_one_minus_largest_free_over_total_free():
    segs = [segment([(4, "inactive"), (4, "active_allocated"), (2, "inactive")]),
            segment([(2, "active_pending_free"), (8, "inactive")], address=0x9000)]
    assert free_space(segs) == (14, 8, pytest.approx(1 - 8 / 14))
    assert free_space([segment([(10, "active_allocated")])]) == (0, 0, 0.0)


def test_occupancy_bar_marks_each_slice_by_the_bytes_in_use():
    seg = segment([(30, "active_allocated"), (10, "inactive"), (5, "active_pending_free"),
                   (35, "inactive")])
    # 8 slices of 10 bytes: 3 full, 1 free, 1 half used, 3 free
    assert occupancy_bar(seg, width=8) == "###.+..."
    assert occupancy_bar(segment([(80, "inactive")]), width=8) == "........"
    one_byte = segment([(1, "active_allocated"), (79, "inactive")])
    assert occupancy_bar(one_byte, width=8) == "+......."


def test_occupancy_line_says_share_in_use_free_blocks_and_pins():
    seg = segment([(3 * MiB, "active_allocated"), (MiB, "inactive")])
    seg["blocks"][0]["pinned"] = True
    line = occupancy_line(seg)
    assert line.startswith("0x1000    4.00 MiB large [")
    assert "75% in use, 1.00 MiB free in 1 block, 1 pinned" in line


def test_memory_summary_reports_counters_free_space_and_segments():
    device, pool = make_pool()
    keep = [pool.malloc(MiB // 2) for _ in range(4)]       # fills one small segment
    big = [pool.malloc(4 * MiB) for _ in range(3)]        # in one 20 MiB segment
    for block in keep[::2] + big[1:2]:
        pool.free(block)
    text = numba_alloc.memory_summary(pool)
    lines = text.splitlines()
    allocated = next(line for line in lines if line.startswith("Allocated memory"))
    assert allocated.split()[2:4] == ["9.00", "MiB"]          # current: 2 x 0.5 + 2 x 4 MiB
    assert next(line for line in lines if line.startswith("  from large pool")).split()[3:5] == \
        ["8.00", "MiB"]
    reserved = next(line for line in lines if line.startswith("Reserved memory"))
    assert reserved.split()[2:4] == ["22.00", "MiB"]
    assert "Largest free block: 8.00 MiB; free in blocks: 13.00 MiB;\n  fragmentation " \
           "(1 - largest free / total free): 0.385" in text
    segment_lines = [line for line in lines if line.startswith("  0x")]
    assert len(segment_lines) == 2
    small, large = segment_lines
    assert "small [" in small and "50% in use, 1.00 MiB free in 2 blocks" in small
    assert "large [" in large and "40% in use, 12.00 MiB free in 2 blocks" in large
    abbreviated = numba_alloc.memory_summary(pool, abbreviated=True)
    assert "from large pool" not in abbreviated and "  0x" not in abbreviated


def test_memory_summary_lists_at_most_32_segments():
    _, pool = make_pool(capacity=GiB)
    blocks = [pool.malloc(11 * MiB) for _ in range(30)]       # a segment each
    blocks += [pool.malloc(MiB) for _ in range(20)]           # two in each small segment
    text = numba_alloc.memory_summary(pool)
    assert sum(line.startswith("  0x") for line in text.splitlines()) == 32
    assert "  ... and 8 more" in text


def test_short_summary_ends_an_out_of_memory_message_in_a_few_lines():
    device, pool = make_pool(capacity=64 * MiB, separate_big_segments=False)   # 20 MiB segments
    blocks = [pool.malloc(4 * MiB) for _ in range(15)]
    for block in blocks[::2]:
        pool.free(block)
    text = short_summary(pool.snapshot()["segments"])
    lines = text.splitlines()
    assert lines[0] == ("Pool: 60.00 MiB reserved in 3 segments, 28.00 MiB allocated, 32.00 MiB "
                        "free in 8 blocks, largest free block 4.00 MiB, fragmentation 0.875.")
    assert lines[1].startswith("Segments (3 large, 0 small; most free first;")
    assert len(lines) == 5
    free_mib = [float(line.split("MiB free")[0].rsplit(",", 1)[1]) for line in lines[2:]]
    assert free_mib == sorted(free_mib, reverse=True)


def test_short_summary_of_an_empty_pool():
    _, pool = make_pool()
    assert short_summary(pool.snapshot()["segments"]) == (
        "Pool: 0 B reserved in 0 segments, 0 B allocated, 0 B free "
        "in 0 blocks, largest free block 0 B, fragmentation 0.000.")


def test_memory_summary_refuses_a_device_of_another_type():
    with pytest.raises(TypeError, match="device must be"):
        numba_alloc.memory_summary(1.5)


def test_every_line_but_the_segment_listing_fits_the_tables_width():
    """The Events line (210 characters) and the free-space line (110) were
    wider than the report's 84-character table, and so was the Jupyter
    block showing it; they wrap at 84, as the segment heading does."""
    from numba_alloc.observe.summary import _WIDTH
    device, pool = make_pool(capacity=64 * MiB)
    blocks = [pool.malloc(5 * MiB) for _ in range(12)]
    for block in blocks[::2]:
        pool.free(block)
    with pytest.raises(numba_alloc.OutOfMemoryError):
        pool.malloc(40 * MiB)
    text = numba_alloc.memory_summary(pool)
    lines = text.splitlines()
    assert [line for line in lines if len(line) > _WIDTH and not line.startswith("  0x")] == []
    events = lines.index(next(line for line in lines if line.startswith("Events: ")))
    assert lines[events].endswith(",") and lines[events + 1].startswith("  num_")
    joined = " ".join(line.strip() for line in lines[events:events + 4])
    stats = pool.memory_stats()
    for name in ("num_device_alloc", "num_ooms", "num_defragmentations"):
        assert f"{name}={stats[name]}" in joined
    heading = next(line for line in lines if line.startswith("Segments ("))
    assert heading.endswith("; by address;")
