"""What pytorch.org/memory_viz needs of a snapshot, checked in Python.

Its segment view lays each segment's blocks out from the segment's address
by their sizes, then replays the trace backwards from the snapshot's state:
a free re-creates the block, an alloc removes it, a segment_free re-creates
the segment, a segment_alloc removes it; undoing a segment_unmap maps its
range back, merged with the segments whose ends touch it, and undoing a
segment_map takes its range out of the segment holding it (trimming it, or
cutting it in two), as MemoryViz.js's map_segment and unmap_segment do;
every block must lie inside a segment at every step. Its trace view pairs each alloc with the next free
of that address. Its unpickler reads pickle protocols 2 to 4 and only the
opcodes below.
"""

import pickletools

LIVE = ("active_allocated", "active_pending_free")
VIEWER_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE",
    "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME",
    "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS",
    "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT"}
ENTRY_KEYS = {"alloc": {"addr", "size", "stream", "time_us", "frames"},
              "free_requested": {"addr", "size", "stream", "time_us", "frames"},
              "free_completed": {"addr", "size", "stream", "time_us", "frames"},
              "segment_alloc": {"addr", "size", "stream", "time_us", "frames"},
              "segment_free": {"addr", "size", "stream", "time_us", "frames"},
              "segment_map": {"addr", "size", "stream", "time_us", "frames"},
              "segment_unmap": {"addr", "size", "stream", "time_us", "frames"},
              "oom": {"size", "device_free", "stream", "time_us", "frames"}}


def check_pickle_opcodes(data):
    """Assert the viewer's unpickler can read ``data`` (bytes)."""
    protocol = None
    for op, arg, _ in pickletools.genops(data):
        assert op.name in VIEWER_OPCODES, f"memory_viz cannot unpickle opcode {op.name}"
        if op.name == "PROTO":
            protocol = arg
    assert protocol in (2, 3, 4)


def _inside(segments, address, size):
    return any(base <= address and address + size <= base + total
               for base, total in segments.items())


def check_replay(snap, device=0):
    """Assert the segment view can replay the trace back to its start."""
    segments, blocks = {}, {}
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        segments[seg["address"]] = seg["total_size"]
        address = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == address, "blocks must tile their segment in order"
            if b["state"] in LIVE:
                blocks[address] = b["size"]
            address += b["size"]
        assert address == seg["address"] + seg["total_size"]
    for entry in reversed(snap["device_traces"][device]):
        action = entry["action"]
        assert set(entry) >= ENTRY_KEYS[action] | {"action"}, entry
        if action == "free_completed":
            blocks[entry["addr"]] = entry["size"]
            assert _inside(segments, entry["addr"], entry["size"]), entry
        elif action == "free_requested":
            assert entry["addr"] in blocks, entry
        elif action == "alloc":
            assert blocks.pop(entry["addr"], None) is not None, entry
        elif action == "segment_free":
            assert entry["addr"] not in segments, entry
            segments[entry["addr"]] = entry["size"]
        elif action == "segment_alloc":
            assert segments.pop(entry["addr"]) == entry["size"], entry
            assert not any(entry["addr"] <= a < entry["addr"] + entry["size"] for a in blocks)
        elif action == "segment_unmap":
            _map_back(segments, entry["addr"], entry["size"])
        elif action == "segment_map":
            _take_out(segments, entry["addr"], entry["size"])
            assert not any(entry["addr"] <= a < entry["addr"] + entry["size"] for a in blocks)


def _map_back(segments, address, size):
    """Undo an unmap: the range is a segment again, merged with those whose
    ends touch it; it overlapped none."""
    assert not any(base < address + size and address < base + total
                   for base, total in segments.items()), (address, size)
    after = segments.pop(address + size, None)
    if after is not None:
        size += after
    before = next((base for base, total in segments.items() if base + total == address), None)
    if before is not None:
        segments[before] += size
    else:
        segments[address] = size


def _take_out(segments, address, size):
    """Undo a map: the range leaves the segment holding it, which is cut."""
    base = next((b for b, total in segments.items()
                 if b <= address and address + size <= b + total), None)
    assert base is not None, ("no segment holds the mapped range", address, size)
    total = segments.pop(base)
    if address > base:
        segments[base] = address - base
    if address + size < base + total:
        segments[address + size] = base + total - (address + size)


def check_alloc_free_pairs(snap, device=0):
    """Assert every free_completed follows a free_requested of its address
    (but one whose request the ring dropped: the first entry of its block),
    and the free_requested left without their free_completed are the
    snapshot's pending frees (active_pending_free): a free completes when
    its GPU work has ended, as the snapshot's states tell."""
    pending = {b["address"] for s in snap["segments"] if s["device"] == device
               for b in s["blocks"] if b["state"] == "active_pending_free"}
    requested, seen = set(), set()
    for entry in snap["device_traces"][device]:
        action, address = entry["action"], entry.get("addr")
        if action == "free_requested":
            requested.add(address)
        elif action == "free_completed":
            assert address in requested or address not in seen, entry
            requested.discard(address)
        if action in ("alloc", "free_requested", "free_completed"):
            seen.add(address)
    assert requested == pending
