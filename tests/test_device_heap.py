"""numba_alloc.DeviceHeap: malloc, free and view inside kernels, run by the
CUDA simulator (tests/heap_sim.py in a subprocess), and the host API."""

import collections
import sys
import threading

import numpy as np
import pytest

from numba_alloc import DeviceHeap, Pool, SimulatedDevice
from numba_alloc.policy.block import ALLOCATED
from numba_alloc.plugin.device_heap import check_classes
from numba_alloc.device import heap_kernels as hk
from numba_alloc.device import heap_search
from numba_alloc.device import heap_layout as layout
from numba_alloc.device.heap_search import front_width

from simulator_scripts import run_under_simulator


def block_size(n, classes=layout.DEFAULT_CLASSES):
    """What the heap hands out for a request of ``n`` bytes."""
    fits = [c for c in classes if c >= n]
    return fits[0] if fits else -(-n // hk.PAGE) * hk.PAGE


@pytest.fixture(scope="module")
def sim(once):
    return once("heap_sim", lambda: run_under_simulator("heap_sim.py"))


def check_fill(run, heap_size, classes=layout.DEFAULT_CLASSES):
    """Live allocations are aligned, inside the heap, disjoint, intact, and
    the counters are exact; returns the offsets that were granted."""
    sizes, offsets = run["sizes"], run["offsets"]
    granted = [(off, block_size(n, classes)) for off, n in zip(offsets, sizes) if off >= 0]
    assert all(off % 16 == 0 and off + size <= heap_size for off, size in granted)
    spans = sorted(granted)
    for (a, size), (b, _) in zip(spans, spans[1:]):
        assert a + size <= b, f"allocations at {a} ({size} bytes) and {b} overlap"
    assert all(run["intact"]) and all(run["stored"])
    stats = run["stats"]
    assert stats["num_allocs"] == len(granted)
    assert stats["num_failed"] == offsets.count(-1)
    assert stats["bytes_in_use"] == sum(size for _, size in granted)
    assert stats["peak_bytes_in_use"] >= stats["bytes_in_use"]
    per_class = stats["classes"]
    assert sum(c["num_allocs"] for c in per_class.values()) == len(granted)
    assert sum(c["bytes_in_use"] for c in per_class.values()) == stats["bytes_in_use"]
    expected = collections.Counter(class_name(n, classes) for n, off in zip(sizes, offsets)
                                   if off >= 0)
    assert {name: c["num_allocs"] for name, c in per_class.items() if c["num_allocs"]} == \
        dict(expected)
    return granted


def class_name(n, classes=layout.DEFAULT_CLASSES):
    """The key of stats()["classes"] (as JSON has it) counting a request of ``n`` bytes."""
    return str(block_size(n, classes)) if n <= classes[-1] else "large"


def test_threads_in_several_blocks_get_disjoint_intact_memory(sim):
    granted = check_fill(sim["random"], 2 << 20)
    assert len(granted) > 48                        # most of them fit
    assert sim["random"]["offsets"].count(-1) > 0   # the 70000-byte runs exhaust it
    assert sim["random"]["stats"]["classes"]["large"]["num_failed"] > 0


def test_compact_stats_leave_out_the_classes_no_request_used(sim):
    full, compact = sim["random"]["stats"], sim["random_compact"]
    used = {name: c for name, c in full["classes"].items() if c["num_allocs"] or c["num_failed"]}
    assert compact["classes"] == used and "large" in used
    assert len(used) < len(full["classes"]) == len(layout.DEFAULT_CLASSES) + 1
    assert {k: v for k, v in compact.items() if k != "classes"} == \
        {k: v for k, v in full.items() if k != "classes"}


def test_free_then_reuse(sim):
    after = sim["after_free"]
    assert after["bytes_in_use"] == 0
    assert after["num_frees"] == after["num_allocs"] == sim["random"]["stats"]["num_allocs"]
    assert all(c["bytes_in_use"] == 0 for c in after["classes"].values())
    reuse = sim["reuse"]
    # the counters keep counting: check the second round on its own
    reuse["stats"] = dict(reuse["stats"], num_allocs=reuse["stats"]["num_allocs"]
                          - after["num_allocs"], num_failed=reuse["stats"]["num_failed"]
                          - after["num_failed"])
    reuse["stats"]["classes"] = {k: dict(c, num_allocs=c["num_allocs"]
                                         - after["classes"][k]["num_allocs"])
                                 for k, c in reuse["stats"]["classes"].items()}
    assert len(check_fill(reuse, 2 << 20)) == len(
        [o for o in sim["random"]["offsets"] if o >= 0])


def test_bad_frees_are_counted_and_ignored(sim):
    before, after = sim["reuse"]["stats"], sim["bad_frees"]
    # a live offset freed twice (one bad), 12345 is not
    # an allocation, -1 is ignored, an offset past the heap is bad
    assert after["num_frees"] == before["num_frees"] + 1
    assert after["num_invalid_frees"] == 3


def test_a_frees_bytes_come_off_before_its_block_is_free_for_another_malloc(sim):
    # else a block freed and taken at once by another thread counts twice in
    # the peak, which could then exceed the heap
    for name, (in_use, freed) in sim["free_order"].items():
        assert in_use < freed, name


def test_reset_and_views_of_floats_from_a_device_function(sim):
    reset = sim["reset"]
    assert reset["bytes_in_use"] == reset["num_allocs"] == reset["num_frees"] == 0
    assert reset["peak_bytes_in_use"] == 0
    floats = sim["floats"]
    offsets = floats["offsets"]
    assert len(set(offsets)) == 64 and all(o % 16 == 0 for o in offsets)
    assert max(offsets) < hk.PAGE                   # a fresh heap: all in its first page
    assert floats["values"] == [float(i) for i in range(64)]


def test_full_heap_returns_minus_one_without_corrupting(sim):
    full = sim["full"]
    granted = check_fill(full, hk.PAGE)
    assert len(granted) == hk.PAGE // 2048
    assert full["stats"]["num_failed"] == 64 - len(granted)
    assert full["stats"]["classes"]["2048"]["num_failed"] == 64 - len(granted)


def test_several_heaps_and_close(sim):
    assert sim["pool_after_close"] == 0
    check_fill(sim["other"], 128 << 10)
    assert sim["other"]["stats"]["num_allocs"] == 8
    assert sim["small_after_other"]["num_allocs"] == hk.PAGE // 2048   # untouched by the other


def test_warps_share_reservations_and_every_thread_gets_its_own_block(sim):
    granted = check_fill(sim["same_class"], 1 << 20)
    assert len(granted) == 256
    # lanes were grouped (the simulator's warps gather at activemask()), and
    # whole warps asked together
    assert max(int(n) for n in sim["group_sizes"]) == 32


def test_a_warp_group_spills_over_pages_until_the_heap_is_full(sim):
    spill = sim["spill"]
    granted = check_fill(spill, 4 * hk.PAGE)
    assert len(granted) == 4 * (hk.PAGE // 8192)          # every block of the 4 pages
    assert spill["stats"]["classes"]["8192"]["num_failed"] == 64 - len(granted)


def test_page_runs_search_from_the_last_run_and_wrap(sim):
    runs = sim["runs"]
    assert sorted(runs["first"]["offsets"]) == [0, 2 * hk.PAGE]
    again = runs["again"]                           # after freeing both: the hint is page 4
    assert sorted(again["offsets"]) == [-1, 0, 2 * hk.PAGE, 4 * hk.PAGE, 6 * hk.PAGE]
    assert all(again["intact"]) and all(again["stored"])
    stats = again["stats"]                          # counters since the heap's creation
    assert (stats["num_allocs"], stats["num_frees"], stats["num_failed"]) == (6, 2, 1)
    assert stats["bytes_in_use"] == 8 * hk.PAGE


def test_size_classes_are_a_setting(sim):
    classes = (48, 96, 4000)
    custom = sim["custom"]
    granted = check_fill(custom, 1 << 20, classes)
    assert len(granted) == 64
    per_class = custom["stats"]["classes"]
    assert set(per_class) == {"48", "96", "4000", "large"}
    assert [per_class[k]["num_allocs"] for k in ("48", "96", "4000", "large")] == [24, 16, 16, 8]


def test_every_default_class_serves_disjoint_blocks_and_frees_them_all(sim):
    classes = layout.DEFAULT_CLASSES
    many = sim["many"]
    granted = check_fill(many, (len(classes) + 12) * hk.PAGE)
    assert len(granted) == len(many["sizes"])               # room for all of them
    per_class = many["stats"]["classes"]
    assert all(per_class[str(c)]["num_allocs"] == 2 for c in classes[1:])
    assert per_class["16"]["num_allocs"] == 3               # 1, 16 and 0 bytes
    assert per_class["large"]["num_allocs"] == 7
    assert per_class["large"]["bytes_in_use"] == 6 * hk.PAGE + 3 * hk.PAGE
    freed = sim["many_freed"]
    assert freed["stats"]["bytes_in_use"] == 0
    assert freed["stats"]["num_frees"] == len(granted) and freed["stats"]["num_invalid_frees"] == 0
    assert all(c["live_blocks"] == c["bytes_in_use"] == 0
               for c in freed["stats"]["classes"].values())
    # every page empty (no block reserved, its bitmap clear), none a run's:
    # unassigned, or keeping its class until another class or a run takes it
    words = np.array(freed["page_words"], np.int64)
    assert not (words & hk.COUNT_MASK).any() and set(freed["run_lengths"]) == {0}
    assert set(words >> hk.STATE_SHIFT) <= {hk.UNASSIGNED, *range(len(classes))}
    assert freed["bitmaps_clear"]


def test_pages_change_class_under_concurrent_mallocs_and_frees(sim):
    """Four warps allocate two blocks a thread of 6 classes in a 4-page heap,
    check them, free them, three times in one kernel: no block handed out
    twice, and the counters exact after."""
    churn = sim["churn"]
    assert churn["bad"] == 0
    stats = churn["stats"]
    assert stats["num_allocs"] == stats["num_frees"] == churn["got"] > 0
    assert stats["num_failed"] == 128 * 3 * 2 - churn["got"] > 0      # more than 4 pages hold
    assert stats["bytes_in_use"] == 0 and stats["num_invalid_frees"] == 0
    assert all(c["live_blocks"] == 0 for c in stats["classes"].values())
    words = np.array(churn["page_words"], np.int64)
    assert not (words & hk.COUNT_MASK).any() and churn["bitmaps_clear"]


def test_a_heap_may_have_64_classes(sim):
    most = tuple(range(16, 16 * (layout.MAX_CLASSES + 1), 16))
    run = sim["most"]
    granted = check_fill(run, (layout.MAX_CLASSES + 8) * hk.PAGE, most)
    assert len(granted) == layout.MAX_CLASSES + 4
    per_class = run["stats"]["classes"]
    assert len(per_class) == layout.MAX_CLASSES + 1
    assert all(per_class[str(c)]["num_allocs"] == 1 for c in most)
    assert per_class["large"]["num_allocs"] == 4
    freed = sim["most_freed"]
    assert freed["bytes_in_use"] == 0 and freed["num_invalid_frees"] == 0
    assert freed["num_frees"] == layout.MAX_CLASSES + 4


class _Atomics:
    """The device functions' atomics in plain Python (one lock), with a hook
    called after each: ``hook(name, index, args, old)``."""

    def __init__(self, hook):
        self._lock, self.hook = threading.Lock(), hook

    def _apply(self, name, array, index, args, new):
        with self._lock:
            old = int(array[index])
            array[index] = new(old)
        self.hook(name, index, args, old)
        return old

    def add(self, array, index, value):
        return self._apply("add", array, index, (value,), lambda old: old + value)

    def max(self, array, index, value):
        return self._apply("max", array, index, (value,), lambda old: max(old, value))

    def exch(self, array, index, value):
        return self._apply("exch", array, index, (value,), lambda old: value)

    def cas(self, array, index, expected, value):
        return self._apply("cas", array, index, (expected, value),
                           lambda old: value if old == expected else old)

    def or_(self, array, index, value):
        return self._apply("or_", array, index, (value,), lambda old: old | value)

    def and_(self, array, index, value):
        return self._apply("and_", array, index, (value,), lambda old: old & value)


class _PlainCuda:
    """``cuda`` for calling the heap's device functions as Python, one
    thread standing for one GPU thread."""

    def __init__(self, hook):
        self.atomic = _Atomics(hook)

    @staticmethod
    def threadfence():
        pass


def plain_meta(pages, classes=(16,)):
    """A heap's bookkeeping as DeviceHeap.reset writes it."""
    meta = np.zeros(layout.meta_size(pages), np.int64)
    meta[hk.HEADER:hk.HEADER + pages] = hk.UNASSIGNED * hk.STATE_UNIT
    meta[layout.NUM_CLASSES] = len(classes)
    meta[hk.SIZE_BASE:hk.SIZE_BASE + len(classes)] = classes
    return meta


def page_word(state, grants=0, count=0):
    return state * hk.STATE_UNIT + grants * hk.GRANT_UNIT + count


def reserved(granted, before=0):
    """What _reserve returns: blocks granted, and the page's reserved before them."""
    return granted | before << hk.TICKET_SHIFT


def test_a_reservation_that_loses_its_page_to_a_run_backs_off(monkeypatch):
    """A warp's reservation reads page 0 as its class's, empty; a page run
    takes pages 0 and 1 (empty pages of a class: their grants go to the
    class's count) before the reservation's atomic lands, which then sees
    the run's state and undoes itself: the run's words are left exactly
    as the run set them, and the class's allocations are still counted."""
    from numba_alloc.plugin.heap_counters import heap_figures
    pages = 2
    meta = plain_meta(pages)
    meta[hk.HEADER] = page_word(0, grants=5)            # 5 blocks allocated, all freed
    meta[hk.HEADER + 1] = page_word(0, grants=3)
    before = heap_figures(meta[:hk.HEADER + pages], (16,))[1][16]
    read, taken = threading.Event(), threading.Event()

    def load(array, index):
        value = array[index]
        if index == hk.HEADER and threading.current_thread().name == "reserving":
            read.set()                  # the reservation read the page ...
            assert taken.wait(10)       # ... and a run takes it now
        return value
    monkeypatch.setattr(hk, "cuda", _PlainCuda(lambda *args: None))
    monkeypatch.setattr(hk, "_load", load)
    granted = []
    reserving = threading.Thread(name="reserving", target=lambda: granted.append(
        hk._reserve(meta, 0, hk.HEADER, 4, hk.PAGE // 16)))
    reserving.start()
    assert read.wait(10)
    assert hk._malloc_large(meta, pages, 2 * hk.PAGE) == 0
    taken.set()
    reserving.join(10)
    assert granted == [0]
    run = page_word(hk.LARGE)
    assert meta[hk.HEADER] == meta[hk.HEADER + 1] == run and meta[hk.HEADER + pages] == 2
    counters, classes = heap_figures(meta[:hk.HEADER + pages], (16,))
    assert classes[16] == before == {"num_allocs": 8, "num_frees": 8, "num_failed": 0,
                                       "bytes_in_use": 0, "live_blocks": 0}
    assert classes["large"]["num_allocs"] == 1 and counters["bytes_in_use"] == 2 * hk.PAGE


def test_a_warp_that_loses_a_fresh_page_to_another_shares_it(monkeypatch):
    """Two warps reach an unassigned page at once: both read it empty, one
    takes it for their class with its cas. The other's cas fails; it reads
    the word again, finds the page its class's with room, and reserves
    there, instead of passing a page with room by (on an H200, a crowd of
    warps reaching fresh pages together passed the heap by: mallocs failed
    with the heap mostly empty)."""
    meta = plain_meta(1)
    read, taken = threading.Event(), threading.Event()
    reads = collections.Counter()

    def load(array, index):
        value = array[index]
        name = threading.current_thread().name
        reads[name] += 1
        if name == "second" and reads[name] == 1:
            read.set()                  # the second warp read the page empty ...
            assert taken.wait(10)       # ... and the first takes it now
        return value
    monkeypatch.setattr(hk, "cuda", _PlainCuda(lambda *args: None))
    monkeypatch.setattr(hk, "_load", load)
    capacity = hk.PAGE // 16
    granted = []
    second = threading.Thread(name="second", target=lambda: granted.append(
        hk._reserve(meta, 0, hk.HEADER, 8, capacity)))
    second.start()
    assert read.wait(10)
    assert hk._reserve(meta, 0, hk.HEADER, 8, capacity) == reserved(8)
    taken.set()
    second.join(10)
    assert granted == [reserved(8, 8)]      # the blocks after the first warp's
    assert meta[hk.HEADER] == page_word(0, grants=16, count=16)


class _OneLane(_PlainCuda):
    """``cuda`` for a warp of one lane (lane 0): its warp primitives."""

    laneid = 0

    @staticmethod
    def shfl_sync(mask, value, src):
        return value

    @staticmethod
    def popc(x):
        return bin(int(x) & (2**64 - 1)).count("1")

    @staticmethod
    def ffs(x):
        return (int(x) & -int(x)).bit_length()

    @staticmethod
    def ballot_sync(mask, predicate):
        return int(bool(predicate))

    @staticmethod
    def activemask():
        return 1

    @staticmethod
    def match_any_sync(mask, value):
        return mask

    @staticmethod
    def syncwarp(mask):
        pass

    @staticmethod
    def grid(dim):
        return 0


def test_a_reservation_that_loses_every_race_but_one_still_gets_its_block(monkeypatch):
    """A page of 1 KiB blocks (64, two bitmap words) fully reserved: one
    block by this warp, 63 by warps: one took the block this warp's ticket
    names before its leader's first ``or``, 62 set their bits while the
    leader reads: each clear bit it reads is taken before its ``or`` lands,
    62 times. The reservation guarantees a clear bit, so the leader keeps
    trying and gets the last block (it gave up after 8 tries, and its
    lane's malloc failed on a heap with room)."""
    from numba_alloc.device import warp
    lane = _OneLane(lambda *args: None)
    monkeypatch.setattr(hk, "cuda", lane)
    monkeypatch.setattr(warp, "cuda", lane)
    size, pages = 1024, 1
    capacity = hk.PAGE // size
    meta = plain_meta(pages, (size,))
    meta[hk.HEADER] = page_word(0, grants=capacity, count=capacity)
    base = hk.HEADER + 2 * pages
    meta[base] = 1                  # the ticket's block, taken
    rivals = [capacity - 2]

    def load(array, index):
        value = array[index]
        if base <= index < base + 2 and rivals[0] and value != hk.FULL_WORD:
            array[index] = value | (~value & (value + 1))     # a rival's bit, set first
            rivals[0] -= 1
        return value
    monkeypatch.setattr(hk, "_load", load)
    off = hk._take_bits(meta, pages, 0, size, 1, 1, 0, 0, 0)
    # the ticket's word, then word 1 (32 rivals), then word 0 (30): its bit 31 is left
    assert rivals == [0] and off == (hk.BITS - 1) * size
    assert meta[base] == meta[base + 1] == hk.FULL_WORD
    assert meta[hk.HEADER] == page_word(0, grants=capacity, count=capacity)


def test_an_invalid_free_racing_a_malloc_leaves_the_peak_at_least_the_bytes_in_use(
        monkeypatch):
    """A free of a block never allocated (block 5 of a 16 B page) takes its
    bytes off BYTES_IN_USE first, as every free does (so that a freed block
    is never counted twice); a malloc that lands then raises the peak to
    the lowered sum; the free finds the bit clear and puts its bytes back,
    raising the peak as a malloc's bytes do (a plain add left the peak 16
    below the 32 bytes in use, live bytes that were never freed)."""
    from numba_alloc.device import warp
    paused, resume = threading.Event(), threading.Event()

    def hook(name, index, args, old):
        if (threading.current_thread().name == "freeing" and name == "add"
                and index == hk.BYTES_IN_USE and args[0] < 0):
            paused.set()                # the free's bytes are off ...
            assert resume.wait(10)
    lane = _OneLane(hook)
    monkeypatch.setattr(hk, "cuda", lane)
    monkeypatch.setattr(warp, "cuda", lane)
    monkeypatch.setattr(hk, "_load", lambda array, index: array[index])
    meta, data = plain_meta(1), np.zeros(hk.PAGE, np.uint8)
    assert hk.heap_malloc(data, meta, 16) == 0
    freeing = threading.Thread(name="freeing", target=hk.heap_free, args=(data, meta, 5 * 16))
    freeing.start()
    assert paused.wait(10)
    assert hk.heap_malloc(data, meta, 16) == 16         # ... a malloc meanwhile ...
    resume.set()
    freeing.join(10)                                    # ... the free puts them back
    assert meta[hk.BYTES_IN_USE] == 32 and meta[hk.NUM_INVALID_FREES] == 1
    assert meta[hk.PEAK_BYTES_IN_USE] == 32


def one_lane_heap(monkeypatch, pages, size):
    """A heap's bookkeeping of ``pages`` pages of class 0 (``size`` bytes),
    every page full, for calling malloc's device functions as one lane."""
    from numba_alloc.device import warp
    lane = _OneLane(lambda *args: None)
    monkeypatch.setattr(hk, "cuda", lane)
    monkeypatch.setattr(warp, "cuda", lane)
    monkeypatch.setattr(hk, "_load", lambda array, index: array[index])
    meta = plain_meta(pages, (size,))
    capacity = hk.PAGE // size
    meta[hk.HEADER:hk.HEADER + pages] = page_word(0, grants=capacity, count=capacity)
    return meta


def test_a_warp_tries_every_page_before_failing_wherever_its_front_starts(monkeypatch):
    """64 pages (a front of 4 past the hint), all full but one: a warp finds
    the free one from any hint, whatever page of the front it starts on
    (its index in the grid), makes it the hint, and fails only when no
    page has room."""
    pages, size = 64, 8192
    meta = one_lane_heap(monkeypatch, pages, size)
    assert front_width(pages, hk.PAGE // size) == 4
    full = meta.copy()
    for free in (0, 1, 5, 63):
        for hint in (0, 4, 62, 63):
            for salt in range(5):
                meta[:] = full
                meta[hk.HEADER + free] = page_word(0)
                meta[hk.HINT_BASE] = hint
                assert hk._malloc_small(meta, pages, 0, 1, salt) == free * hk.PAGE
                assert meta[hk.HINT_BASE] == free
    meta[:] = full
    assert hk._malloc_small(meta, pages, 0, 1, 3) == -1
    assert meta[hk.CLASS_BASE + hk.CLASS_FAILED] == 1


def test_warps_past_a_full_hint_page_spread_over_the_front(monkeypatch):
    """The hint's page full, the rest fresh, a crowd of warps that all read
    the hint before any moved it: warp i goes to page hint + 1 + i % width
    (the crowd fills pages side by side, not one at a time), to the block
    its reservation names there (the warps before it on the page took the
    blocks below)."""
    pages, size = 256, 16
    meta = one_lane_heap(monkeypatch, pages, size)
    width = front_width(pages, hk.PAGE // size)
    assert width == 16
    meta[hk.HEADER + 1:hk.HEADER + pages] = page_word(hk.UNASSIGNED)
    got = []
    for salt in range(2 * width):
        meta[hk.HINT_BASE] = 0          # a crowd: each warp read the hint before any moved it
        got.append(hk._malloc_small(meta, pages, 0, 1, salt))
    pages_got = [off // hk.PAGE for off in got]
    assert pages_got == [1 + salt % width for salt in range(2 * width)]
    blocks = [(off % hk.PAGE) // size for off in got]
    assert blocks == [salt // width for salt in range(2 * width)]


def test_a_class_spreads_over_pages_for_as_many_blocks_whatever_its_size():
    """The front past a full hint page holds about 2^17 blocks (a crowd of
    4096 warps of 32), on at most FRONT_PAGES (128) pages and a sixteenth
    of the heap: 32 pages of 16 B blocks, 128 of 64 B and of 256 B; it
    used to be 32 pages for every class, so that a crowd of 256 B warps, 8
    a page, walked page by page behind each other (9.6x the bump floor's
    rounds in bench_heap_crowd.py at 256 B, 2.9x now, with a front of 128
    pages)."""
    assert front_width(1 << 16, hk.PAGE // 16) == 32
    assert front_width(1 << 16, hk.PAGE // 64) == 128
    assert front_width(1 << 16, hk.PAGE // 256) == 128
    assert front_width(1 << 16, hk.PAGE // 8192) == 128
    assert front_width(1024, hk.PAGE // 256) == 64         # a sixteenth of the heap
    assert front_width(8, hk.PAGE // 16) == 1


def test_warps_filling_a_page_take_their_bits_with_one_atomic_each(monkeypatch):
    """Warps of 32, 7 and 32 lanes reserve on a fresh page of 16 B blocks
    one after another, then take their bits in the opposite order: each
    leader sets the bits its reservation names (the page's count before it:
    a ticket) with one ``atomic.or`` and reads no bitmap word (a crowd's
    leaders all started at the page's clear bits, found them taken by one
    another and read and tried again: about 6 accesses to the bitmap a
    warp, 1 now, in benchmarks/bench_heap_crowd.py); a word the ticket
    shares with another warp (7 lanes from block 32) takes two."""
    pages, size = 1, 16
    meta = one_lane_heap(monkeypatch, pages, size)
    meta[hk.HEADER] = page_word(hk.UNASSIGNED)
    capacity = hk.PAGE // size
    tickets = [hk._reserve(meta, 0, hk.HEADER, want, capacity) for want in (32, 7, 32)]
    assert tickets == [reserved(32, 0), reserved(7, 32), reserved(32, 39)]
    base = hk.HEADER + 2 * pages
    loads, ors = [], []
    load = hk._load
    monkeypatch.setattr(hk, "_load", lambda array, index: loads.append(index) or load(
        array, index))
    or_ = hk.cuda.atomic.or_
    monkeypatch.setattr(hk.cuda.atomic, "or_", lambda array, index, value: ors.append(
        (index - base, value)) or or_(array, index, value))
    for ticket in reversed(tickets):
        granted, first = ticket & hk.TICKET_MASK, ticket >> hk.TICKET_SHIFT
        offsets = [hk._take_bits(meta, pages, 0, size, granted, 1, 0, rank, first)
                   for rank in range(1)]
        assert offsets == [first * size]
    assert [i for i in loads if i >= base] == [base + 2]      # the 32 from block 39: two words
    assert ors == [(1, 0xFFFFFFFF << 7 & hk.FULL_WORD), (2, 0x7F), (1, 0x7F), (0, hk.FULL_WORD)]


def test_a_reservation_that_churn_starves_gives_up_within_its_bound(monkeypatch):
    """A page of 8 KiB blocks (8, one bitmap word) with room for one more,
    the other 7 held by warps that keep freeing a block and taking the bit
    this warp's leader just read as clear (each step as the heap's own code
    takes it; a reviewer's schedule): the leader stops after its bound of
    tries (each block taken twice over, and a pass over the word; the first
    try, at its ticket, whose block is taken, reads nothing), gives
    its reservation and its grant back, and counts the lane's failure; the
    next page is not tried (that cost the malloc 8 registers a thread)."""
    pages, size = 2, 8192
    meta = one_lane_heap(monkeypatch, pages, size)
    capacity = hk.PAGE // size
    meta[hk.HEADER] = page_word(0, grants=capacity - 1, count=capacity - 1)
    meta[hk.HEADER + 1] = page_word(hk.UNASSIGNED)
    base = hk.HEADER + 2 * pages
    meta[base] = (1 << capacity) - 2                    # the rivals' blocks: all but block 0
    churn = [0]

    def load(array, index):
        value = array[index]
        if index == base:
            clear = ~int(value) & ((1 << capacity) - 1)
            read = (clear & -clear).bit_length() - 1
            array[index] &= ~(1 << (read + 1) % capacity)   # a rival frees another block
            array[index] |= 1 << read                     # and one takes the bit read clear
            churn[0] += 1
        return value
    monkeypatch.setattr(hk, "_load", load)
    assert hk._malloc_small(meta, pages, 0, 1, 0) == -1
    assert churn[0] == 2 * capacity
    assert meta[hk.HEADER] == page_word(0, grants=capacity - 1, count=capacity - 1)
    assert meta[hk.HEADER + 1] == page_word(hk.UNASSIGNED)
    assert meta[hk.CLASS_BASE + hk.CLASS_FAILED] == 1


def test_a_run_that_rolls_back_leaves_the_pages_it_took_unassigned(monkeypatch):
    monkeypatch.setattr(hk, "cuda", _PlainCuda(lambda *args: None))
    monkeypatch.setattr(hk, "_load", lambda array, index: array[index])
    pages = 3
    meta = plain_meta(pages)
    meta[hk.HEADER] = page_word(0, grants=5)            # empty: may be taken
    meta[hk.HEADER + 1] = page_word(0, grants=2, count=1)   # a block in use: busy
    assert hk._malloc_large(meta, pages, 2 * hk.PAGE) == -1
    assert meta[hk.HEADER] == page_word(hk.UNASSIGNED)
    assert meta[hk.HEADER + 1] == page_word(0, grants=2, count=1)
    assert meta[hk.HEADER + 2] == page_word(hk.UNASSIGNED)
    assert meta[hk.CLASS_BASE + hk.CLASS_ALLOCS] == 5   # page 0's allocations, kept
    assert meta[hk.CLASS_BASE + hk.CLASS_FIELDS * hk.LARGE + hk.CLASS_FAILED] == 1


def test_a_pages_grants_are_flushed_to_its_class_before_they_overflow(monkeypatch):
    from numba_alloc.plugin.heap_counters import heap_figures
    monkeypatch.setattr(hk, "cuda", _PlainCuda(lambda *args: None))
    monkeypatch.setattr(hk, "_load", lambda array, index: array[index])
    meta = plain_meta(1)
    flush = hk.GRANT_FLUSH
    meta[hk.HEADER] = page_word(0, grants=2 * flush - 1, count=1)
    assert hk._reserve(meta, 0, hk.HEADER, 1, hk.PAGE // 16) == reserved(1, 1)    # below: kept
    assert meta[hk.HEADER] == page_word(0, grants=2 * flush, count=2)
    assert hk._reserve(meta, 0, hk.HEADER, 1, hk.PAGE // 16) == reserved(1, 2)    # flushed
    assert meta[hk.HEADER] == page_word(0, grants=flush + 1, count=3)
    assert meta[hk.CLASS_BASE + hk.CLASS_ALLOCS] == flush
    figures = heap_figures(meta[:hk.HEADER + 1], (16,))[1][16]
    assert (figures["num_allocs"], figures["live_blocks"]) == (2 * flush + 1, 3)


def header(classes):
    """A heap header holding ``classes`` (what DeviceHeap.reset writes)."""
    meta = np.zeros(hk.HEADER, np.int64)
    meta[layout.NUM_CLASSES] = len(classes)
    meta[hk.SIZE_BASE:hk.SIZE_BASE + len(classes)] = classes
    return meta


def smallest_fitting(classes, n):
    return next((k for k, c in enumerate(classes) if n <= c), hk.LARGE)


def test_class_lookup_maps_every_size_to_the_smallest_class_that_fits():
    for classes in (layout.DEFAULT_CLASSES, (16,), tuple(range(16, 16 * 65, 16))):
        meta = header(classes)
        for n in range(0, classes[-1] + 2 * hk.MIN_BLOCK):
            assert heap_search.class_of(meta, n) == smallest_fitting(classes, n), (classes, n)


def test_default_classes_are_page_fitted_and_finely_spaced():
    classes = layout.DEFAULT_CLASSES
    assert check_classes(classes) == classes and len(classes) == 54
    assert classes[:8] == tuple(range(16, 129, 16)) and classes[-1] == 8192
    # no block size with as many blocks per page is larger
    assert all(hk.PAGE // (c + hk.MIN_BLOCK) < hk.PAGE // c for c in classes)
    # 8 a doubling above 128 B: a request is rounded up by at most 17%
    assert max(b / a for a, b in zip(classes[7:], classes[8:])) < 1.17
    assert [sum(1 for c in classes if 128 << k < c <= 256 << k) for k in range(6)] == \
        [8, 8, 8, 8, 8, 6]


@pytest.mark.parametrize("classes, error, words", [
    ((16, 16), ValueError, "ascending"), ((8,), ValueError, "multiples of 16"),
    ((16, 65536), ValueError, "to 32768"), ((), ValueError, "1 to 64 block sizes, got 0"),
    (tuple(range(16, 16 * 66, 16)), ValueError, "1 to 64 block sizes, got 65"),
    ((16.0,), TypeError, "int"), (16, TypeError, "sequence"), ((True,), TypeError, "int"),
    ("16", TypeError, "sequence"), ((np.float32(16),), TypeError, "int")])
def test_bad_classes_name_the_argument(pool, classes, error, words):
    with pytest.raises(error, match=words):
        DeviceHeap("1MiB", pool=pool, classes=classes)
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0


def test_the_pool_reports_its_heaps_in_memory_stats_snapshot_and_summary(sim):
    view = sim["pool_view"]
    heaps, stats = view["heaps"], view["stats"]
    assert stats["device_heap.count"] == 3
    for name in ("bytes_in_use", "peak_bytes_in_use", "num_allocs", "num_frees", "num_failed",
                 "num_invalid_frees", "reserved_bytes"):
        assert stats[f"device_heap.{name}"] == sum(h[name] for h in heaps), name
    assert stats["device_heap.bytes_in_use"] == 256 * 16 + heaps[0]["bytes_in_use"] + \
        heaps[1]["bytes_in_use"]
    assert all(h["up_to_date"] for h in heaps)          # the simulator reads at once
    snapshot = view["snapshot"]
    assert [h["address"] for h in snapshot] == sorted(h["address"] for h in snapshot)
    same = [h for h in snapshot if h["size"] == 1 << 20]
    assert len(same) == 1 and same[0]["classes"]["16"]["live_blocks"] == 256
    assert "Device heaps (malloc inside kernels): 3 open" in view["summary"]
    assert "16 B: 256 (4.00 KiB)" in view["summary"]


# -- the host API (no simulator needed) ----------------------------------------
@pytest.fixture
def pool():
    return Pool(SimulatedDevice("16MiB"))


@pytest.mark.parametrize("flag", [{"wait": "no"}, {"wait": None}, {"wait": [0]},
                                  {"compact": "no"}, {"compact": 1}])
def test_a_stats_flag_that_is_not_a_bool_is_a_type_error_naming_it(pool, flag):
    """As defragment's release is: "no" read as true before."""
    heap = DeviceHeap("1MiB", pool=pool)
    [name] = flag
    with pytest.raises(TypeError, match=f"{name} must be True or False, got "):
        heap.stats(**flag)
    if name == "wait":
        with pytest.raises(TypeError, match="wait must be True or False"):
            heap.counters(**flag)
    assert heap.stats(wait=np.True_, compact=np.False_)["up_to_date"]


def test_dropped_heaps_return_their_block_and_reset_closes_heaps(pool):
    import gc
    heap = DeviceHeap("1MiB", pool=pool)
    assert pool.memory_stats()["device_heap.count"] == 1
    assert pool.memory_stats()["device_heap.reserved_bytes"] == heap.reserved_bytes > heap.size
    del heap
    gc.collect()
    pool.synchronize()
    stats = pool.memory_stats()
    assert stats["device_heap.count"] == 0 and stats["allocated_bytes.all.current"] == 0
    heap = DeviceHeap("1MiB", pool=pool)
    pool.reset()
    assert heap.closed and pool.memory_stats()["device_heap.count"] == 0
    heap.close()                                    # nothing left to give back
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0


def test_a_snapshot_reads_each_heap_once_so_its_totals_are_its_heaps_sums(pool, monkeypatch):
    """Kernels change a heap's counters between two reads: a snapshot's
    device_heap.* stats are nevertheless the sums of its device_heaps."""
    heaps = [DeviceHeap("1MiB", pool=pool), DeviceHeap("1MiB", pool=pool)]
    for heap in heaps:
        reads = []

        def read(wait=False, reads=reads):      # each read sees a kernel's progress since
            reads.append(1)
            words = np.full(hk.HEADER + heap.size // hk.PAGE, page_word(hk.UNASSIGNED))
            words[:hk.HEADER] = 0
            words[hk.HEADER] = page_word(0, grants=len(reads), count=len(reads))    # 16 B
            return words, True
        monkeypatch.setattr(heap._reader, "read", read)
    snap = pool.snapshot()
    for name in ("bytes_in_use", "num_allocs", "reserved_bytes"):
        assert snap["stats"][f"device_heap.{name}"] == sum(
            h[name] for h in snap["device_heaps"]), name
    for heap in heaps:
        heap.close()


def test_a_reset_from_another_thread_while_a_heap_is_made_closes_it(pool, monkeypatch):
    """The reset waits for the heap's making, then closes it, as every heap
    (not left open on a block the reset released, counted in memory_stats
    and refusing close())."""
    write, resetter = DeviceHeap._write_meta, []

    def writing(self, *args):
        if not resetter:        # another thread resets the pool now
            resetter.append(threading.Thread(target=pool.reset))
            resetter[0].start()
            resetter[0].join(0.5)       # blocked on the pool's lock until the heap is made
        write(self, *args)
    monkeypatch.setattr(DeviceHeap, "_write_meta", writing)
    heap = DeviceHeap("1MiB", pool=pool)
    resetter[0].join()
    assert heap.closed
    stats = pool.memory_stats()
    assert stats["device_heap.count"] == 0 and stats["reserved_bytes.all.current"] == 0
    assert pool.snapshot()["device_heaps"] == []
    heap.close()                                # nothing left to give back


class _Copy:
    """A copy of a heap's header in flight, done once ``done`` is set."""

    def __init__(self, host, values):
        self.host, self.values, self.done = host, values, False

    def query(self):
        if self.done:
            self.host[:] = self.values
        return self.done

    def synchronize(self):
        self.done = True
        self.query()


def test_reading_the_counters_never_waits_for_running_kernels():
    from numba_alloc.plugin.heap_counters import CounterReader
    host = np.zeros(4, np.int64)
    copies = []

    def start():
        copies.append(_Copy(host, np.full(4, len(copies) + 1)))
        return copies[-1]
    reader = CounterReader(start, host)
    header, up_to_date = reader.read()              # a kernel runs: the copy waits behind it
    assert not up_to_date and not header.any() and len(copies) == 1
    header, up_to_date = reader.read()              # still running: no second copy queued
    assert not up_to_date and len(copies) == 1
    copies[0].done = True                           # the kernel ended; a read now is
    header, up_to_date = reader.read()              # newer than copy 1: copy 2 in flight
    assert (header == 1).all() and not up_to_date and len(copies) == 2
    header, up_to_date = reader.read(wait=True)     # waits: copy 2, then a fresh copy 3
    assert (header == 3).all() and up_to_date
    reader.forget()                                 # the heap was reset
    assert not reader.read()[0].any()

    def failing():
        raise RuntimeError("no event")
    broken = CounterReader(failing, host)
    header, up_to_date = broken.read()              # never raises: the last figures
    assert not up_to_date and not header.any()


class _Refused:
    """A copy whose event the device cannot query or wait for (a driver
    call that fails)."""

    def query(self):
        raise RuntimeError("the event's query failed")

    synchronize = query


def test_a_read_whose_copy_the_device_cannot_report_never_raises():
    """memory_stats reads the heaps' counters: an event query or wait that
    fails gives the last figures and the reason, and the next read starts
    a fresh copy."""
    from numba_alloc.plugin.heap_counters import CounterReader
    host = np.zeros(4, np.int64)
    copies = [_Copy(host, np.full(4, 7)), _Refused(), _Refused()]
    reader = CounterReader(lambda: copies.pop(), host)
    for wait in (False, True):
        header, up_to_date = reader.read(wait=wait)     # the copy is given up
        assert not up_to_date and not header.any()
        assert "query failed" in reader.failure
    copies[0].done = True
    header, up_to_date = reader.read(wait=True)         # a fresh copy, which completes
    assert up_to_date and (header == 7).all() and reader.failure is None and not copies


class _Gated:
    """A copy that completes once ``gate`` is set; ``waiting`` is set while
    a thread waits for it."""

    def __init__(self):
        self.gate, self.waiting = threading.Event(), threading.Event()

    def query(self):
        return self.gate.is_set()

    def synchronize(self):
        self.waiting.set()
        assert self.gate.wait(10)


def test_counter_reads_from_several_threads_at_once():
    from numba_alloc.plugin.heap_counters import Completed, CounterReader
    host = np.zeros(4, np.int64)
    results, errors = [], []

    def read():
        try:
            results.append(reader.read())
        except Exception as e:      # noqa: BLE001
            errors.append(e)
    others = []

    class Late:
        """Not done when first asked, while another thread reads (which
        finds it done): a copy completing between two polls."""
        asked = 0

        def query(self):
            Late.asked += 1
            if Late.asked == 1:
                others.append(threading.Thread(target=read))
                others[-1].start()
                others[-1].join(0.5)
                return False
            return True

        def synchronize(self):
            pass
    copies = [Late()]
    reader = CounterReader(lambda: copies.pop() if copies else Completed, host)
    reader.POLL = 10.0
    read()
    for thread in others:
        thread.join(10)
    assert not errors, errors
    assert [up_to_date for _, up_to_date in results] == [True, True]


def test_a_read_that_waits_leaves_the_lock_to_others():
    from numba_alloc.plugin.heap_counters import CounterReader
    host = np.zeros(4, np.int64)
    lock = threading.RLock()
    copy = _Gated()
    reader = CounterReader(lambda: copy, host, lock)
    waited = []
    thread = threading.Thread(target=lambda: waited.append(reader.read(wait=True)))
    thread.start()
    assert copy.waiting.wait(10)
    assert lock.acquire(timeout=5)          # the waiting read does not hold it
    lock.release()
    assert reader.read()[1] is False        # others read meanwhile: the last figures
    host[:] = 7
    copy.gate.set()
    thread.join(10)
    header, up_to_date = waited[0]
    assert up_to_date and (header == 7).all()


def test_a_read_polling_for_its_copy_leaves_the_lock_to_others():
    """read() polls for its copy (up to POLL seconds) without the lock, the
    heap's pool's lock: another thread's malloc or free goes on meanwhile."""
    from numba_alloc.plugin.heap_counters import CounterReader
    host = np.zeros(4, np.int64)
    lock = threading.RLock()
    polling, gate = threading.Event(), threading.Event()

    class Polled:
        def query(self):
            polling.set()
            return gate.is_set()

        def synchronize(self):
            assert gate.wait(10)
    reader = CounterReader(lambda: Polled(), host, lock)
    reader.POLL = 30.0
    results = []
    thread = threading.Thread(target=lambda: results.append(reader.read()))
    thread.start()
    try:
        assert polling.wait(10)
        assert lock.acquire(timeout=5)      # not held while the read polls
        lock.release()
    finally:
        host[:] = 3
        gate.set()
        thread.join(10)
    header, up_to_date = results[0]
    assert up_to_date and (header == 3).all()


def test_close_from_two_threads_at_once(pool, monkeypatch):
    heap = DeviceHeap("1MiB", pool=pool)
    errors, others = [], []
    free = pool.free

    def close():
        try:
            heap.close()
        except Exception as e:      # noqa: BLE001
            errors.append(e)

    def free_while_another_thread_closes(block):
        if not others:
            others.append(threading.Thread(target=close))
            others[0].start()
            others[0].join(0.5)
        free(block)
    monkeypatch.setattr(pool, "free", free_while_another_thread_closes)
    close()
    others[0].join(10)
    assert not errors, errors
    assert heap.closed and pool.memory_stats()["device_heap.count"] == 0
    pool.synchronize()
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0


def test_close_whose_free_raises_after_freeing_leaves_the_heap_closed(pool):
    from numba_alloc.policy.observers import PoolObserver

    class Failing(PoolObserver):
        def on_free(self, pool, block):
            raise RuntimeError("observer failed")
    heap = DeviceHeap("1MiB", pool=pool)
    pool.add_observer(Failing())
    with pytest.raises(RuntimeError, match="observer failed"):    # not "not pinned"
        heap.close()
    assert heap.closed and pool.memory_stats()["device_heap.count"] == 0
    heap.close()                    # idempotent


def test_close_whose_free_raises_before_freeing_leaves_the_heap_open(pool, monkeypatch):
    heap = DeviceHeap("1MiB", pool=pool)

    def failing_free(block):
        raise RuntimeError("free failed")
    monkeypatch.setattr(pool, "free", failing_free)
    with pytest.raises(RuntimeError, match="free failed"):
        heap.close()
    assert not heap.closed and pool.pins_of(heap._block) == 1
    monkeypatch.undo()
    heap.close()
    pool.synchronize()
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0


def test_reset_never_writes_to_the_block_of_a_heap_closed_meanwhile(pool, monkeypatch):
    heap = DeviceHeap("1MiB", pool=pool)
    block, states, others = heap._block, [], []
    write = pool.backend.write

    def write_checked(address, data):
        states.append(pool.state_of(block))
        write(address, data)
    monkeypatch.setattr(pool.backend, "write", write_checked)
    initial = heap._initial_meta

    def initial_meta_while_another_thread_closes():
        others.append(threading.Thread(target=heap.close))
        others[0].start()
        others[0].join(0.5)
        return initial()
    heap._initial_meta = initial_meta_while_another_thread_closes
    try:
        heap.reset()
    except RuntimeError as e:       # closed first: nothing written
        assert "closed" in str(e)
    others[0].join(10)
    assert states in ([], [ALLOCATED])
    assert heap.closed and pool.memory_stats()["device_heap.count"] == 0


def test_host_calls_from_threads(pool):
    """stats, counters, reset, close and the pool's reads from several
    threads: no errors but 'closed', and the pool exact afterwards."""
    errors = []

    def repeat(call, times):
        for _ in range(times):
            try:
                call()
            except RuntimeError as e:
                if "closed" not in str(e):
                    errors.append(e)
            except Exception as e:      # noqa: BLE001
                errors.append(e)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            heap = DeviceHeap("1MiB", pool=pool)
            calls = [heap.stats, lambda: heap.stats(wait=True), heap.counters, heap.reset,
                     pool.memory_stats, pool.snapshot]
            threads = [threading.Thread(target=repeat, args=(call, 30)) for call in calls]
            threads.append(threading.Timer(0.01, heap.close))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            heap.close()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]
    stats = pool.memory_stats()
    assert stats["device_heap.count"] == 0 and stats["allocated_bytes.all.current"] == 0


def test_a_dropped_heap_returns_its_block_at_once(pool):
    """Nothing the heap holds refers back to it: its block goes back when
    the last reference goes, not at the garbage collector's next pass."""
    import gc
    enabled = gc.isenabled()
    gc.disable()
    try:
        heap = DeviceHeap("1MiB", pool=pool)
        heap.stats()
        del heap
        stats = pool.memory_stats()
        assert stats["device_heap.count"] == 0 and stats["allocated_bytes.all.current"] == 0
    finally:
        if enabled:
            gc.enable()


def but_growth(stats):
    """memory_stats() but for the record of growth given back (a heap that
    fails after the pool grew for it returns that segment or those pages):
    the device calls and the reservations' running totals and peaks. The
    reservations' current values stay."""
    return {k: v for k, v in stats.items()
            if k not in ("num_device_alloc", "num_device_free", "bytes_released")
            and not (k.startswith(("reserved_bytes.", "segment.", "oversize_segments."))
                     and not k.endswith(".current"))}


@pytest.mark.parametrize("expandable", [False, True])       # segments, or pages mapped
@pytest.mark.parametrize("heap_size", ["2MiB", "64KiB"])     # growth, or none
def test_a_failing_write_of_the_bookkeeping_leaves_the_pool_as_it_was(monkeypatch, heap_size,
                                                                      expandable):
    from faults import InjectedFault
    from numba_alloc.policy.observers import PoolObserver
    pool = Pool(SimulatedDevice("16MiB"), expandable_segments=expandable)
    kept = pool.malloc(4096)
    pool.backend.write(kept.address, np.full(4096, 7, np.uint8))
    other = DeviceHeap("1MiB", pool=pool)
    heard = []

    class Listener(PoolObserver):
        def on_malloc(self, pool, block):
            heard.append(("malloc", block))

        def on_free(self, pool, block):
            heard.append(("free", block))
    pool.add_observer(Listener())
    before = pool.memory_stats()

    def failing(address, data):
        raise InjectedFault("injected failure of a copy to the device")
    monkeypatch.setattr(pool.backend, "write", failing)
    with pytest.raises(InjectedFault):      # the error keeps the half-made heap alive
        DeviceHeap(heap_size, pool=pool)
    after = pool.memory_stats()             # as if it had never been allocated
    assert but_growth(after) == but_growth(before)
    if after["num_device_alloc"] == before["num_device_alloc"]:     # the pool did not grow
        assert after == before
    assert heard == []
    assert [h["address"] for h in pool.snapshot()["device_heaps"]] == [other.address]
    assert sum(b["pinned"] for s in pool.snapshot()["segments"] for b in s["blocks"]) == 1
    monkeypatch.undo()
    assert (pool.backend.read(kept.address, 4096) == 7).all()
    with DeviceHeap("2MiB", pool=pool) as heap:            # the next one works
        assert heap.stats()["num_allocs"] == 0
    other.close()
    pool.free(kept)
    pool.synchronize()
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0


def test_a_failing_write_after_the_pool_unmapped_free_pages_leaves_counters_true(monkeypatch):
    """With expandable segments, a heap whose pages the pool could map only
    after unmapping free pages (the retry: its runs cut) fails to write its
    bookkeeping: its pages go back, and the counters are those of the
    pool's blocks as they now are (they were put back to before the retry,
    counting free blocks the retry had cut away), with the retry counted."""
    from faults import InjectedFault
    from invariants import check
    MiB = 1 << 20
    pool = Pool(SimulatedDevice("16MiB"), expandable_segments=True)
    blocks = [pool.malloc(n * MiB) for n in (3, 5, 2, 6)]
    for block in blocks[1::2]:
        pool.free(block)
    pool.synchronize()
    before = pool.memory_stats()

    def failing(address, data):
        raise InjectedFault("injected failure of a copy to the device")
    monkeypatch.setattr(pool.backend, "write", failing)
    with pytest.raises(InjectedFault):
        DeviceHeap("6MiB", pool=pool)
    monkeypatch.undo()
    after = check(pool)["stats"]            # every counter against the blocks
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert after["reserved_bytes.all.current"] < before["reserved_bytes.all.current"]
    assert after["allocation.all.current"] == before["allocation.all.current"] == 2
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    with DeviceHeap("6MiB", pool=pool) as heap:           # the next one works
        assert heap.stats()["num_allocs"] == 0
    check(pool)


def test_the_heap_never_moves_and_is_never_reclaimed():
    """Defragmentation and reclaim leave the heap's block where it is,
    resident, its bytes intact, while other blocks move and go to host memory."""
    device = SimulatedDevice("64MiB")
    pool = Pool(device, defrag=True, reclaim=True)
    blocks = [pool.malloc(3 << 20) for _ in range(3)]
    heap = DeviceHeap("4MiB", pool=pool)
    address, pattern = heap.address, np.arange(heap.size, dtype=np.uint64).view(np.uint8)[
        :heap.size]
    heap._data[:] = pattern
    for block in blocks[:2]:
        pool.free(block)
    pool.defragment()
    assert heap.address == address
    big = [pool.malloc(15 << 20) for _ in range(6)]       # more than the device: reclaim
    assert pool.memory_stats()["reclaimed.current"] > 0
    assert heap.address == address and pool.is_resident(heap._block)
    assert pool.pins_of(heap._block) == 1
    device.synchronize()
    assert (device.read(address, heap.size) == pattern).all()
    assert heap.stats()["num_allocs"] == 0
    heap.close()
    for block in big + blocks[2:]:
        pool.free(block)


def test_heap_is_one_pinned_block_that_close_returns(pool):
    heap = DeviceHeap("100KiB", pool=pool)
    assert heap.size == 2 * hk.PAGE
    assert pool.memory_stats()["allocated_bytes.all.current"] >= heap.size
    assert heap._block.pinned == 1
    assert heap.stats()["bytes_in_use"] == 0 and not heap.closed
    heap.close()
    heap.close()
    assert heap.closed
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0
    with pytest.raises(RuntimeError, match="closed"):
        heap.stats()


def test_reset_clears_pages_and_counters(pool):
    with DeviceHeap(hk.PAGE * 3, pool=pool) as heap:
        heap._meta[hk.PEAK_BYTES_IN_USE] = 5
        heap._meta[hk.HEADER + 1] = page_word(0, grants=2, count=2)
        heap._meta[hk.HEADER + 2 * 3 + hk.WORDS_PER_PAGE] = 3     # page 1's first blocks
        assert heap.stats()["num_allocs"] == 2
        heap.reset()
        assert heap.stats()["num_allocs"] == heap.stats()["peak_bytes_in_use"] == 0
        assert (heap._meta[hk.HEADER:hk.HEADER + 3] == page_word(hk.UNASSIGNED)).all()
        assert not heap._meta[hk.HEADER + 3:].any()
    assert heap.closed


@pytest.mark.parametrize("size, error, words", [
    ("lots", ValueError, "size"), (-5, ValueError, "size"), (0, ValueError, "size"),
    (1.5, TypeError, "size"), (None, TypeError, "size"), ("1.5B", ValueError, "size"),
    (True, TypeError, "size must be an int number of bytes or a string"),
    (np.float64(65536), TypeError, "size"), (b"1MiB", TypeError, "size"),
    (np.int64(-1), ValueError, "size must not be negative")])
def test_bad_sizes_name_the_argument(pool, size, error, words):
    before = pool.snapshot()
    with pytest.raises(error, match=words):
        DeviceHeap(size, pool=pool)
    assert pool.snapshot() == before


@pytest.mark.parametrize("size, pages", [
    (np.int64(1 << 20), 16), (np.uint16(1), 1), ("1.5MiB", 24), ("0.1MB", 2)])
def test_numpy_integers_and_size_strings_are_sizes(pool, size, pages):
    with DeviceHeap(size, pool=pool, classes=np.array([16, 2048])) as heap:
        assert heap.size == pages * hk.PAGE and type(heap.size) is int
        assert heap.size_classes == (16, 2048) and all(type(c) is int for c in heap.size_classes)


def test_a_closed_heap_says_so(pool):
    import gc
    import weakref
    heap = DeviceHeap("1MiB", pool=pool)
    heap.stats()
    memory = weakref.ref(pool.backend._buffers[pool.segment_of(heap._block).address])
    heap.close()
    pool.empty_cache()
    gc.collect()
    assert memory() is None         # a closed heap keeps no view of the memory it gave back
    for read in (lambda: heap.reserved_bytes, lambda: heap.address, heap.stats, heap.reset,
                 heap.counters):
        with pytest.raises(RuntimeError, match="closed"):
            read()


@pytest.mark.parametrize("size", ["4TiB", 2 ** 70])
def test_a_size_beyond_the_device_is_out_of_memory_before_its_bookkeeping_is_built(
        pool, size, monkeypatch):
    from numba_alloc import OutOfMemoryError
    built = []
    monkeypatch.setattr(DeviceHeap, "_initial_meta", lambda heap: built.append(heap))
    before = pool.snapshot()["segments"]
    with pytest.raises(OutOfMemoryError):
        DeviceHeap(size, pool=pool)
    assert pool.snapshot()["segments"] == before and built == []


def test_bad_pool_names_the_argument():
    with pytest.raises(TypeError, match="pool"):
        DeviceHeap("1MiB", pool="gpu0")


def test_device_methods_refuse_the_host(pool):
    heap = DeviceHeap("1MiB", pool=pool)
    if hk.SIMULATOR:
        pytest.skip("under the simulator the methods are the device code")
    for call in (lambda: heap.malloc(16), lambda: heap.free(0),
                 lambda: heap.view(0, 1, np.float32)):
        with pytest.raises(TypeError, match="inside CUDA kernels"):
            call()


def test_simulated_heap_is_refused_as_a_gpu_kernel_argument(pool):
    if hk.SIMULATOR:
        pytest.skip("the simulator passes the heap as it is")
    from numba.cuda.typing.typeof import Purpose, typeof
    heap = DeviceHeap("1MiB", pool=pool)
    with pytest.raises(TypeError, match="CUDA simulator"):
        typeof(heap, Purpose.argument)


def test_the_pool_must_fit_the_heap():
    from numba_alloc import OutOfMemoryError
    pool = Pool(SimulatedDevice("64MiB"))
    kept = pool.malloc(1000)
    before = pool.snapshot()
    with pytest.raises(OutOfMemoryError):
        DeviceHeap("256MiB", pool=pool)
    after = pool.snapshot()
    assert after["segments"] == before["segments"]          # nothing reserved or pinned
    assert {k: v for k, v in after["stats"].items() if k != "num_ooms"} == \
        {k: v for k, v in before["stats"].items() if k != "num_ooms"}
    assert after["stats"]["num_ooms"] == before["stats"]["num_ooms"] + 1
    assert kept.state is ALLOCATED


def _limit_and_hint(error):
    """An OutOfMemoryError's limit and hint (from "limit " to the summary)."""
    return str(error).split(", limit ", 1)[1].split("\n", 1)[0]


@pytest.mark.parametrize("growth, hint", [
    (True, "the pool's limit (16.00 MiB) stops it; raise limit"),
    (False, "growth is off: every request comes from the arena reserved at first use; a "
            "larger limit or growth on could help")])
def test_a_heap_over_a_fresh_pools_limit_reports_that_limit_as_its_malloc_does(growth, hint):
    from numba_alloc import OutOfMemoryError
    heap_pool, malloc_pool = (Pool(SimulatedDevice("64MiB"), limit="16MiB", growth=growth)
                              for _ in range(2))
    with pytest.raises(OutOfMemoryError) as heap_error:
        DeviceHeap("32MiB", pool=heap_pool)
    with pytest.raises(OutOfMemoryError) as malloc_error:
        malloc_pool.malloc(32 << 20)
    assert _limit_and_hint(heap_error.value).startswith(f"16.00 MiB. Hint: {hint}.")
    assert _limit_and_hint(heap_error.value) == _limit_and_hint(malloc_error.value)
    assert heap_pool.memory_stats() == malloc_pool.memory_stats()    # the same after either


def test_the_summary_wraps_a_heaps_classes_and_leaves_idle_ones_out():
    from numba_alloc.observe.summary import _WIDTH, device_heap_lines
    stats = {f"device_heap.{name}": 0 for name in (
        "count", "reserved_bytes", "bytes_in_use", "peak_bytes_in_use", "num_allocs",
        "num_frees", "num_failed", "num_invalid_frees")}
    names = [*map(str, layout.DEFAULT_CLASSES), "large"]
    classes = {name: {"live_blocks": k % 2 * 1000, "bytes_in_use": k % 2 * 1000 * 16}
               for k, name in enumerate(names)}
    heap = {"address": 1 << 40, "size": 256 << 20, "up_to_date": True, "classes": classes}
    lines = device_heap_lines(stats, [heap, dict(heap, classes={})])
    assert all(len(line) <= _WIDTH for line in lines)
    text = "\n".join(lines)
    assert text.count("1000 (15.62 KiB)") == len(names) // 2        # the live classes, once
    assert "32 B: 1000" in text and "16 B:" not in text             # idle: left out
    assert "1280 B: 1000" in text                                   # exact block sizes
    assert lines[-1].endswith("256.00 MiB: empty")


@pytest.mark.parametrize("dtype", ["float32", "f4", 4])
def test_the_simulators_view_refuses_a_dtype_a_gpu_kernel_refuses(dtype):
    from numba_alloc.device.heap_type import as_dtype
    with pytest.raises(TypeError, match="dtype must be a NumPy or Numba type"):
        as_dtype(dtype)
    assert as_dtype(np.float32) == as_dtype(np.dtype("float32")) == np.float32


def test_a_view_is_cut_off_at_the_heaps_end_and_a_failed_mallocs_is_empty():
    """view_bounds, which every view (GPU, simulator, stand-in) goes by:
    the view of -1 held the heap's last byte when its count passed the
    heap's size (a failed large malloc), as a Python slice takes -1."""
    from numba_alloc.device.heap_kernels import view_bounds
    size = 1 << 16
    assert view_bounds(size, -1, size + 1, 1) == (0, 0)
    assert view_bounds(size, -1, 8, 8) == (0, 0)
    assert view_bounds(size, 16, 3, 4) == (16, 3)
    assert view_bounds(size, size - 8, 4, 4) == (size - 8, 2)      # whole items, cut off
    assert view_bounds(size, size + 16, 1, 1) == (size, 0)
    assert view_bounds(size, 16, 0, 8) == view_bounds(size, 16, -2, 8) == (16, 0)
