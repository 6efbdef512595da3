"""Snapshots in PyTorch's format: their layout, their consistency with the
trace (what memory_viz replays), and the round trip through PyTorch's own
torch.cuda._memory_viz helpers."""

import base64
import contextlib
import io
import json
import pickle
import re

import pytest

import numba_alloc
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.observe.history import ALLOC, FREE, FREE_COMPLETED, MOVE, OOM, TraceEntry
from numba_alloc.observe.memory_viz import trace_entries

from viz_model import check_alloc_free_pairs, check_pickle_opcodes, check_replay
from workload import MiB, make_pool, mixed


def recorded_pool(stacks=False, max_entries=100_000, steps=300, seed=1):
    device, pool = make_pool()
    numba_alloc.record_history(device=pool, stacks=stacks, max_entries=max_entries)
    live = mixed(pool, device, steps=steps, seed=seed, oom_every=97)
    return device, pool, live


def test_layout_matches_pytorchs_snapshot():
    device, pool, live = recorded_pool(stacks=True)
    snap = numba_alloc.snapshot(pool)
    assert set(snap) == {"segments", "device_traces", "stats", "device_heaps", "nrt_heap"}
    assert snap["stats"]["allocated_bytes.all.current"] == compat.memory_allocated(pool)
    for seg in snap["segments"]:
        assert set(seg) >= {"device", "address", "total_size", "allocated_size", "active_size",
                            "requested_size", "stream", "segment_type", "segment_pool_id",
                            "is_expandable", "frames", "blocks"}
        assert seg["segment_pool_id"] == (0, 0) and seg["is_expandable"] is False
        for b in seg["blocks"]:
            assert set(b) >= {"address", "size", "requested_size", "state", "frames"}
    live_blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]
                   if b["state"] == "active_allocated"}
    assert set(live_blocks) == {b.address for b in live}
    for block in live:     # where each live block was allocated
        frames = live_blocks[block.address]["frames"]
        assert frames[0]["filename"].endswith("workload.py") and frames[0]["name"] == "mixed"
        assert any(f["name"] == "recorded_pool" for f in frames)
    inactive = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive"]
    assert inactive and all(b["frames"] == [] for b in inactive)


def test_trace_entries_are_pytorchs_actions():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    a = pool.malloc(1000)
    segment = a.segment                 # a handle names its segment while it is live
    pool.free(a)
    with pytest.raises(numba_alloc.OutOfMemoryError):
        pool.malloc(device.capacity + 1)
    pool.empty_cache()
    (trace,) = numba_alloc.snapshot(pool)["device_traces"]
    assert [e["action"] for e in trace] == ["segment_alloc", "alloc", "free_requested",
                                             "free_completed", "oom", "segment_free"]
    seg, alloc, requested, completed, oom, seg_free = trace
    assert (seg["addr"], seg["size"]) == (segment.address, 2 * MiB)
    assert a.segment is None                # and no longer once dead
    assert (seg_free["addr"], seg_free["size"]) == (seg["addr"], seg["size"])
    assert alloc["addr"] == requested["addr"] == completed["addr"] == a.address
    assert alloc["size"] == requested["size"] == 1000
    assert oom["size"] == device.capacity + 1 and oom["device_free"] == device.capacity - 2 * MiB
    assert "addr" not in oom
    assert all(e["stream"] == 0 and e["frames"] == [] and isinstance(e["time_us"], int)
               for e in trace)
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)


def test_a_move_is_a_free_at_the_old_address_and_an_alloc_at_the_new():
    def entry(action, address, old=0):
        return TraceEntry(action, address, 700, 1024, 5_000, 1, old, 0, 0, 0, 0, ())
    trace = trace_entries([entry(ALLOC, 0x1000), entry(MOVE, 0x400, old=0x1000),
                           entry(FREE, 0x400), entry(FREE_COMPLETED, 0x400), entry(OOM, 0)])
    assert [(e["action"], e.get("addr")) for e in trace] == [
        ("alloc", 0x1000), ("free_requested", 0x1000), ("free_completed", 0x1000),
        ("alloc", 0x400), ("free_requested", 0x400), ("free_completed", 0x400), ("oom", None)]
    assert {e["time_us"] for e in trace} == {5}


def test_device_traces_has_one_list_per_device_up_to_the_pools():
    pool = Pool(SimulatedDevice(64 * MiB, device_id=2))
    numba_alloc.record_history(device=pool)
    pool.malloc(10)
    snap = numba_alloc.snapshot(pool)
    assert [len(t) for t in snap["device_traces"]] == [0, 0, 2]
    assert all(s["device"] == 2 for s in snap["segments"])


def test_without_history_the_trace_is_empty_and_blocks_have_no_frames():
    device, pool = make_pool()
    mixed(pool, device, steps=50)
    snap = numba_alloc.snapshot(pool)
    assert snap["device_traces"] == [[]]
    assert all(b["frames"] == [] for s in snap["segments"] for b in s["blocks"])


def test_free_completed_is_written_when_the_pending_free_is_retired():
    """PyTorch writes free_completed when the freed block's memory becomes
    reusable (free_block, after its events): a free whose GPU work is still
    queued is a free_requested only, the block active_pending_free; the
    free_completed comes once the pool retires it. It was written at the
    free, while the snapshot still said pending."""
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    a = pool.malloc(4 * MiB)
    device.launch()                  # GPU work queued before the free
    pool.free(a)
    snap = numba_alloc.snapshot(pool)
    (block,) = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == a.address]
    assert block["state"] == "active_pending_free"
    assert [e["action"] for e in snap["device_traces"][0]] == [
        "segment_alloc", "alloc", "free_requested"]
    check_replay(snap)
    check_alloc_free_pairs(snap)
    device.complete()
    pool.synchronize()
    snap = numba_alloc.snapshot(pool)
    assert [(e["action"], e["addr"], e["size"]) for e in snap["device_traces"][0][3:]] == [
        ("free_completed", a.address, 4 * MiB)]
    assert all(b["state"] == "inactive" for s in snap["segments"] for b in s["blocks"])
    check_replay(snap)
    check_alloc_free_pairs(snap)


@pytest.mark.parametrize("max_entries", [100_000, 60])
def test_the_trace_replays_back_from_the_snapshot_as_memory_viz_does(max_entries):
    device, pool, _ = recorded_pool(max_entries=max_entries, steps=400, seed=5)
    pool.empty_cache()                       # segment frees too
    live = mixed(pool, device, steps=100, seed=6)   # and more after them
    device.launch()
    pool.free(live.pop())                    # pending: GPU work queued before its free
    snap = numba_alloc.snapshot(pool)
    assert any(b["state"] == "active_pending_free" for s in snap["segments"] for b in s["blocks"])
    actions = {e["action"] for e in snap["device_traces"][0]}
    if max_entries > 1000:
        assert actions == {"alloc", "free_requested", "free_completed", "segment_alloc",
                           "segment_free", "oom"}
    check_replay(snap)
    check_alloc_free_pairs(snap)


@pytest.mark.skipif(not hasattr(Pool, "defragment"), reason="defragmentation not built yet")
def test_the_trace_stays_consistent_through_a_defragmentation():
    device, pool = make_pool()
    numba_alloc.record_history(device=pool)
    mixed(pool, device, steps=300, seed=8)
    pool.synchronize()
    numba_alloc.defragment(pool)
    assert any(e.action == MOVE for e in numba_alloc.recorded_events(pool))
    snap = numba_alloc.snapshot(pool)
    check_replay(snap)
    check_alloc_free_pairs(snap)


def test_dump_snapshot_writes_a_pickle_the_viewer_can_read(tmp_path):
    _, pool, _ = recorded_pool(stacks=True, steps=100)
    path = tmp_path / "snapshot.pickle"
    numba_alloc.dump_snapshot(path, device=pool)
    data = path.read_bytes()
    check_pickle_opcodes(data)
    assert pickle.loads(data) == numba_alloc.snapshot(pool)


# -- PyTorch's own helpers --------------------------------------------------

@pytest.fixture(scope="module")
def memory_viz():
    pytest.importorskip("torch", reason="comparing with torch.cuda._memory_viz needs torch")
    from torch.cuda import _memory_viz
    return _memory_viz


@pytest.fixture
def dumped(tmp_path):
    device, pool, live = recorded_pool(stacks=True, steps=250, seed=11)
    path = tmp_path / "snapshot.pickle"
    numba_alloc.dump_snapshot(path, device=pool)
    with open(path, "rb") as f:
        return pool, live, pickle.load(f)


def _embedded_snapshot(html):
    """The pickle torch's plot helpers embed in their page, unpickled."""
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]).rstrip(b"\x00"))


def test_torch_segment_and_trace_plots_embed_our_snapshot(memory_viz, dumped):
    _, _, data = dumped
    for html in (memory_viz.segment_plot(data), memory_viz.trace_plot(data),
                 memory_viz.trace_plot(data, plot_segments=True)):
        assert "add_local_files" in html
        assert _embedded_snapshot(html) == data
    segment_view = memory_viz.segment_plot(data)
    assert "'Allocator State History'" in segment_view


def test_torch_segment_summary_accounts_for_every_byte(memory_viz, dumped):
    pool, _, data = dumped
    text = memory_viz.segsum(data)   # raises on any accounting mismatch
    assert f"segments: {len(data['segments'])}" in text
    reserved = sum(s["total_size"] for s in data["segments"])
    assert reserved == compat.memory_reserved(pool)
    assert f"total_reserved: {memory_viz.Bytes(reserved)}" in text


def test_torch_trace_printout_names_each_event(memory_viz, dumped):
    _, _, data = dumped
    text = memory_viz.trace(data)
    entries = data["device_traces"][0]
    assert f"{len(entries)} entries" in text
    counts = {action: sum(e["action"] == action for e in entries)
              for action in ("alloc", "free_requested", "segment_alloc", "oom")}
    assert text.count(" = cudaMalloc(") == counts["segment_alloc"]
    assert text.count("\ndel ") == counts["free_requested"]
    assert text.count("raise OutOfMemoryError") == counts["oom"] > 0
    assert len(re.findall(r"^\w+ = (seg_\d+|[a-z]+\d*)\[", text, re.M)) == counts["alloc"]


def test_torch_flamegraph_lines_attribute_live_bytes_to_our_frames(memory_viz, dumped):
    _, live, data = dumped
    lines = memory_viz.memory(data, format_flamegraph=lambda text: text).splitlines()
    attributed = sum(int(line.rsplit(" ", 1)[1]) for line in lines
                     if line.startswith("stream_0;active_allocated;") and "<gaps>" not in line)
    assert attributed == sum(b.size for b in live)
    assert any("workload.py" in line and ":mixed" in line for line in lines)
    per_segment = memory_viz.segments(data, format_flamegraph=lambda text: text)
    assert per_segment.count(";seg_") >= len(data["segments"])


def test_torch_filter_of_alloc_free_pairs_finds_every_pair(memory_viz, dumped):
    _, live, data = dumped
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        filtered = memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(data)))
    assert out.getvalue() == ""           # it prints any free_completed without its request
    allocs = [e for e in filtered["device_traces"][0] if e["action"] == "alloc"]
    assert {e["addr"] for e in allocs} == {b.address for b in live}


# -- on a GPU -------------------------------------------------------------------

from gpu_marks import needs_gpu
from numba import cuda


@needs_gpu
def test_history_and_snapshot_of_numbas_arrays_on_the_gpu():
    import numpy as np
    numba_alloc.install()
    numba_alloc.record_history(device=0, stacks=True)
    try:
        array = cuda.device_array(1 << 20, dtype=np.uint8)
        address = array.__cuda_array_interface__["data"][0]
        snap = numba_alloc.snapshot(0)
        (block,) = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == address]
        assert block["state"] == "active_allocated"
        assert any(f["name"] == "test_history_and_snapshot_of_numbas_arrays_on_the_gpu"
                   for f in block["frames"])
        del array
        snap = numba_alloc.snapshot(0)
        check_replay(snap)
        check_alloc_free_pairs(snap)
    finally:
        numba_alloc.record_history(False, device=0)


@pytest.mark.parametrize("path", [None, 1, 2.5])
def test_dump_snapshot_needs_a_path(path):
    """Not a file descriptor: open(1, "wb") would have written the pickle to
    stdout and closed it."""
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(64 * MiB))
    with pytest.raises(TypeError, match="path must be a str or path-like"):
        numba_alloc.dump_snapshot(path, device=pool)


def test_a_saved_snapshot_keeps_the_device_heaps_the_summary_lists(tmp_path):
    from numba_alloc.observe.memory_viz import load_snapshot
    from numba_alloc.observe.summary import format_saved_summary
    pool = Pool(SimulatedDevice(1 << 30))
    pool.malloc(5 << 20)
    heap = numba_alloc.DeviceHeap("1MiB", pool=pool)
    with pool.lock:
        live = numba_alloc.memory_summary(pool)
        numba_alloc.dump_snapshot(tmp_path / "s.pickle", device=pool)
    saved = format_saved_summary(load_snapshot(tmp_path / "s.pickle"), "s.pickle")
    line = f"heap at {heap.address:#x}, 1.00 MiB: empty"
    assert line in live and line in saved


def test_a_pools_snapshot_with_stacks_reads_back_as_it_was_written(tmp_path):
    """load_snapshot's check (each dict and list written once, sizes and
    counters ints) accepts what a pool writes: history with stacks, OOMs,
    frees, a device heap."""
    from numba_alloc.observe.memory_viz import load_snapshot
    _, pool, _ = recorded_pool(stacks=True, steps=200)
    numba_alloc.DeviceHeap("1MiB", pool=pool)
    numba_alloc.dump_snapshot(tmp_path / "s.pickle", device=pool)
    written = pickle.loads((tmp_path / "s.pickle").read_bytes())
    assert any(block["frames"] for s in written["segments"] for block in s["blocks"])
    assert load_snapshot(tmp_path / "s.pickle") == written


def test_expandable_segments_trace_maps_and_unmaps_that_the_viewer_replays():
    """With expandable_segments, mapping pages beside a free block joins
    the runs it touches and unmapping pages cuts a run: the trace tells
    them as PyTorch's segment_map and segment_unmap, the snapshot marks the
    runs is_expandable, and memory_viz's replay of those actions (merge on
    map, trim or cut on unmap) holds every block inside a segment at every
    step, back to the start."""
    device = SimulatedDevice(256 * MiB)
    pool = Pool(device, expandable_segments=True)
    numba_alloc.record_history(device=pool)
    blocks = [pool.malloc(n) for n in (3 * MiB, 5 * MiB + 4096, 7 * MiB, 3 * MiB, 9 * MiB)]
    for block in blocks[1::2]:
        pool.free(block)
    pool.synchronize()
    pool.empty_cache()                      # whole free pages unmapped: runs cut
    blocks.append(pool.malloc(11 * MiB))    # mapped beside a free end: runs joined
    small = pool.malloc(1000)               # the small pool keeps its segments
    snap = numba_alloc.snapshot(pool)
    (trace,) = snap["device_traces"]
    actions = [e["action"] for e in trace]
    assert {"segment_map", "segment_unmap", "segment_alloc"} <= set(actions)
    assert "segment_free" not in actions
    runs = [s for s in snap["segments"] if s["is_expandable"]]
    assert len(runs) >= 2 and all(s["segment_type"] == "large" for s in runs)
    assert [s["is_expandable"] for s in snap["segments"] if s["segment_type"] == "small"] \
        == [False]
    check_replay(snap)
    check_alloc_free_pairs(snap)
    mapped = sum(e["size"] for e in trace if e["action"] == "segment_map") \
        - sum(e["size"] for e in trace if e["action"] == "segment_unmap")
    assert mapped == sum(s["total_size"] for s in runs)
    pool.free(small)


def test_runs_moved_by_remapping_their_pages_replay_as_maps_moves_and_unmaps(monkeypatch):
    """Defragmentation moves a run of pages down against another by
    remapping them: the trace tells it as a segment_map of the pages it
    takes, a move (free, then alloc) of each of its blocks, then a
    segment_unmap of the pages it leaves, which memory_viz replays back to
    the start; the bytes mapped add up to the runs the snapshot shows."""
    from numba_alloc.policy import room
    monkeypatch.setattr(room, "make_room", lambda pool, size, kind, nbytes: None)
    device = SimulatedDevice(10 * MiB)
    pool = Pool(device, expandable_segments=True, defrag=True)
    numba_alloc.record_history(device=pool)
    low, middle, high = (pool.malloc(3 * MiB) for _ in range(3))
    pool.free(middle)
    pool.synchronize()
    pool.empty_cache()                      # two runs of two pages
    old = high.address
    pool.malloc(4 * MiB)                    # the second run moves down, its block slides
    assert device.remappings == 1 and high.address != old
    snap = numba_alloc.snapshot(pool)
    (trace,) = snap["device_traces"]
    moved = [e["action"] for e in trace if e["addr"] == old and e["action"].startswith("free")]
    assert moved == ["free_requested", "free_completed"]
    check_replay(snap)
    check_alloc_free_pairs(snap)
    runs = [s for s in snap["segments"] if s["is_expandable"]]
    mapped = sum(e["size"] for e in trace if e["action"] == "segment_map") \
        - sum(e["size"] for e in trace if e["action"] == "segment_unmap")
    assert mapped == sum(s["total_size"] for s in runs) == 10 * MiB
