"""The nrt_heap_size setting: NRT's allocations (np.empty inside kernels)
served by a heap carved from the pool. Its semantics under the CUDA
simulator (tests/nrt_sim.py in a subprocess), and the host side on a
simulated device: the setting, the heap and its descriptor, more room
between launches, every error leaving the pool as it was. What numba-cuda
links and loads: test_nrt_link.py."""

import numpy as np
import pytest

import numba_alloc
from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice, Settings, memory_summary
from numba_alloc.device import nrt_heap as nrt_device
from numba_alloc.observe.memory_viz import load_snapshot
from numba_alloc.observe.snapshot_check import check_snapshot
from numba_alloc.observe.summary import format_saved_summary
from numba_alloc.plugin import registry
from numba_alloc.plugin.device_heap import DeviceHeap
from numba_alloc.plugin.nrt_heap import heap_of
from numba_alloc.policy.counters import NRT_HEAP_COUNTERS

from invariants import check
from simulator_scripts import run_under_simulator
from test_config import clean_registry  # noqa: F401 (a fixture)

MiB, PAGE = 1 << 20, DeviceHeap.page_size


def stats_but_ooms(pool):
    """memory_stats() without num_ooms (which counts the refusal itself)."""
    return {k: v for k, v in pool.memory_stats().items() if k != "num_ooms"}


def holdings(pool):
    """What a pool holds: its allocated and reserved bytes and blocks, NRT's heap."""
    stats = pool.memory_stats()
    return {k: v for k, v in stats.items() if k.startswith("nrt.") or k in (
        "allocated_bytes.all.current", "allocation.all.current", "reserved_bytes.all.current",
        "segment.all.current", "allocated_bytes.all.allocated", "allocated_bytes.all.peak")}


@pytest.fixture(scope="module")
def sim(once):
    return once("nrt_sim", lambda: run_under_simulator("nrt_sim.py"))


def test_the_descriptor_kernels_read_describes_the_heap(sim):
    d = sim["descriptor"]
    assert d["words"][nrt_device.DATA_ADDRESS] == d["heap"]
    assert d["words"][nrt_device.DATA_BYTES] == d["size"] == MiB
    assert d["words"][nrt_device.META_ADDRESS] == d["heap"] + d["size"]
    assert d["words"][nrt_device.META_WORDS] == d["meta_len"]


def test_arrays_alive_together_are_intact_and_the_counters_exact_after_the_kernel(sim):
    run = sim["roomy"]
    counts = np.arange(128) % 13 + 1
    expected = [sum(i + j for j in range(n)) + sum(i + j for j in range(n + 1)) + 2 * i + 1
                for i, n in enumerate(counts.tolist())]
    assert run["sums"] == expected and not any(run["failed"])
    nrt = run["nrt"]
    assert nrt["nrt.num_allocs"] == nrt["nrt.num_frees"] == 3 * 128
    assert nrt["nrt.bytes_in_use"] == 0 and nrt["nrt.num_failed"] == 0
    assert nrt["nrt.peak_bytes_in_use"] > 0 and nrt["nrt.num_invalid_frees"] == 0
    assert nrt["nrt.size"] == MiB
    assert run["allocated"] == nrt["nrt.reserved_bytes"]      # the heap's blocks are the pool's
    assert sim["pinned"] == [True, True]                       # heap and descriptor never move


def test_a_full_heap_hands_nrt_the_null_pointer_counts_it_and_leaves_the_pool(sim):
    run = sim["full"]
    failed = sum(run["failed"])
    assert failed > 0 and all(s == -1 for s, f in zip(run["sums"], run["failed"]) if f)
    nrt, roomy = run["nrt"], sim["roomy"]["nrt"]
    assert nrt["nrt.num_failed"] == failed                     # counted since the first heap
    assert nrt["nrt.num_allocs"] - roomy["nrt.num_allocs"] == 3 * 96 - failed
    assert nrt["nrt.num_frees"] == nrt["nrt.num_allocs"] and nrt["nrt.bytes_in_use"] == 0
    assert nrt["nrt.size"] == PAGE                              # 1 byte: one page
    assert run["allocated"] == run["pool_before"]              # the pool as before the kernel


def test_the_null_pointer_is_ignored_and_a_pointer_off_the_heap_counted(sim):
    before, after = sim["full"]["nrt"], sim["bad_frees"]
    assert after["nrt.num_invalid_frees"] - before["nrt.num_invalid_frees"] == 3
    assert after["nrt.num_frees"] == before["nrt.num_frees"]


def test_a_larger_size_between_launches_gives_the_kernel_its_arrays(sim):
    run = sim["regrown"]
    assert not any(run["failed"]) and all(s > 0 for s in run["sums"])
    nrt = run["nrt"]
    assert nrt["nrt.size"] == 2 * MiB
    assert nrt["nrt.num_failed"] == sum(sim["full"]["failed"])      # the old heap's kept
    assert nrt["nrt.num_allocs"] == sim["full"]["nrt"]["nrt.num_allocs"] + 3 * 96


def test_the_summary_shows_nrts_heap_within_the_pool(sim):
    summary = sim["summary"]
    assert "NRT's heap (np.empty inside kernels, nrt_heap_size): 2.00 MiB" in summary
    assert "of which NRT's heap (np.empty in kernels)" in summary
    assert "failed 96, invalid frees 3" in summary


# -- the host side, on a simulated device ------------------------------------------------
def test_the_setting_is_off_by_default_and_parsed_as_sizes():
    assert Settings().nrt_heap_size is None
    assert Pool(SimulatedDevice(64 * MiB), nrt_heap_size="4MiB").settings().nrt_heap_size == 4 * MiB
    for bad in ("lots", 0, -5, 2**63):
        with pytest.raises(ValueError, match="nrt_heap_size"):
            Pool(SimulatedDevice(64 * MiB), nrt_heap_size=bad)


def test_the_heap_is_carved_only_when_kernels_need_it_and_counted_in_nrt():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    assert pool.nrt_heap is None and pool.memory_stats()["allocated_bytes.all.current"] == 0
    assert all(pool.memory_stats()[f"nrt.{c.name}"] == 0 for c in NRT_HEAP_COUNTERS)
    heap = heap_of(pool)
    assert heap_of(pool) is heap
    stats = pool.memory_stats()
    assert stats["nrt.reserved_bytes"] == stats["allocated_bytes.all.current"] > MiB
    assert stats["device_heap.count"] == 0          # NRT's heap is not among the DeviceHeaps
    user = DeviceHeap("128KiB", pool=pool)
    assert pool.memory_stats()["device_heap.count"] == 1
    assert [h["size"] for h in pool.snapshot()["device_heaps"]] == [user.size]
    assert pool.snapshot()["nrt_heap"]["descriptor_address"] == heap.descriptor_address
    with pytest.raises(RuntimeError, match="nrt_heap_size is unset"):
        heap_of(Pool(SimulatedDevice(64 * MiB)))


def test_nrt_heap_stats_gives_its_size_classes():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    assert numba_alloc.nrt_heap_stats(pool) is None
    heap = heap_of(pool)
    stats = numba_alloc.nrt_heap_stats(pool, wait=True)
    assert stats["up_to_date"] and stats["size"] == MiB and stats["classes"] == {}
    assert stats["descriptor_address"] == heap.descriptor_address
    assert stats["reserved_bytes"] == pool.memory_stats()["nrt.reserved_bytes"]


def _granted_words(heap, blocks):
    """The words a read of ``heap`` copies once ``blocks`` blocks of 16 B
    are granted on its first page (a kernel's work, stood in)."""
    from numba_alloc.device import heap_layout as layout
    words = np.full(layout.HEADER + heap.size // layout.PAGE,
                    layout.UNASSIGNED * layout.STATE_UNIT, np.int64)
    words[:layout.HEADER] = 0
    words[layout.HEADER] = blocks * layout.GRANT_UNIT + blocks         # class 0 (16 B)
    words[layout.BYTES_IN_USE] = words[layout.PEAK_BYTES_IN_USE] = 16 * blocks
    return words


def test_nrt_heap_stats_reads_the_heap_once_so_its_classes_add_up_to_its_totals():
    """A kernel running: each read of the heap sees one more block. The
    totals and the classes come from one read (they came from two)."""
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    heap = heap_of(pool).heap
    reads = []

    def read(wait=False):
        reads.append(1)
        return _granted_words(heap, len(reads)), False
    heap._reader.read = read
    for stats in (numba_alloc.nrt_heap_stats(pool), pool.snapshot()["nrt_heap"]):
        assert stats["num_allocs"] == sum(c["num_allocs"] for c in stats["classes"].values())
        assert stats["bytes_in_use"] == sum(c["bytes_in_use"] for c in stats["classes"].values())


def test_nrt_heap_stats_while_another_thread_gives_the_heap_a_new_size():
    """The heap is replaced (another thread's configure, forced between
    the reader's choice of heap and its read): the read goes to the new
    heap, and the old heap's counts are counted once (stats raised 'the
    heap is closed', or counted them twice)."""
    import threading
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    old = heap_of(pool).heap
    read = old._reader.read

    def read_during_a_resize(wait=False):
        old._reader.read = lambda wait=False: (_granted_words(old, 8), True)
        resize = threading.Thread(target=pool.configure, kwargs={"nrt_heap_size": "2MiB"})
        resize.start()
        resize.join()
        return read(wait)
    old._reader.read = read_during_a_resize
    stats = numba_alloc.nrt_heap_stats(pool)
    assert old.closed and stats["size"] == 2 * MiB
    assert stats["num_allocs"] == pool.memory_stats()["nrt.num_allocs"] == 8


def test_a_heap_the_pool_cannot_hold_changes_nothing():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1GiB")
    with pytest.raises(OutOfMemoryError):
        heap_of(pool)
    assert pool.nrt_heap is None and pool.memory_stats()["allocated_bytes.all.current"] == 0
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB", limit="8MiB")
    heap = heap_of(pool)
    before = stats_but_ooms(pool)
    with pytest.raises(OutOfMemoryError):
        pool.configure(nrt_heap_size="16MiB")         # over the limit: refused, as it was
    assert pool.settings().nrt_heap_size == MiB and pool.nrt_heap.heap is heap.heap
    assert stats_but_ooms(pool) == before


def test_a_heap_over_a_fresh_pools_limit_reports_that_limit():
    pool = Pool(SimulatedDevice(64 * MiB), limit="16MiB")
    pool.configure(nrt_heap_size="32MiB")
    with pytest.raises(OutOfMemoryError, match=r"limit 16\.00 MiB\. Hint: the pool's limit "
                                               r"\(16\.00 MiB\) stops it; raise limit\."):
        heap_of(pool)
    assert pool.nrt_heap is None and pool.memory_stats()["reserved_bytes.all.current"] == 0


def test_a_new_size_replaces_the_heap_behind_the_same_descriptor():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    heap = heap_of(pool)
    address, old = heap.descriptor_address, heap.heap
    pool.configure(nrt_heap_size="3MiB")
    assert heap.descriptor_address == address and old.closed
    words = pool.backend.read(address, 32).view(np.int64)
    assert words[nrt_device.DATA_ADDRESS] == heap.heap.address
    assert words[nrt_device.DATA_BYTES] == heap.heap.size == 3 * MiB
    assert pool.memory_stats()["nrt.size"] == 3 * MiB


def test_unset_is_refused_while_the_heap_serves_and_allowed_before():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    pool.configure(nrt_heap_size=None)              # nothing carved yet: back to CUDA's heap
    pool.configure(nrt_heap_size="1MiB")
    heap_of(pool)
    with pytest.raises(RuntimeError, match="nrt_heap_size cannot go back to unset"):
        pool.configure(nrt_heap_size=None)
    assert pool.settings().nrt_heap_size == MiB


def test_a_reset_drops_the_heap_with_the_pools_memory():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    heap = heap_of(pool)
    pool.reset()
    assert pool.nrt_heap is None and heap.heap.closed
    assert heap_of(pool) is not heap


def test_a_reset_that_fails_returning_a_segment_closes_the_heaps_all_the_same():
    """reset() kills every block first, then returns the segments; when a
    return fails, it raises with the rest kept free for the next reset. The
    heaps on the dead blocks were left open: heap_of() still gave NRT the
    old descriptor's address, which the next allocation was handed, and a
    DeviceHeap stayed open on a dead block (close() raised ValueError)."""
    from faults import FaultyDevice, InjectedFault
    device = FaultyDevice(256 * MiB)
    pool = Pool(device, nrt_heap_size="1MiB")
    user = DeviceHeap("4MiB", pool=pool)
    nrt = heap_of(pool)
    pool.malloc(30 * MiB)                           # a third segment
    device.fail("release", skip=1)
    with pytest.raises(InjectedFault):
        pool.reset()
    assert pool.memory_stats()["segment.all.current"] == 2     # kept for the next reset
    assert user.closed and nrt.heap.closed and pool.nrt_heap is None
    assert pool.memory_stats()["nrt.size"] == 0
    user.close()                                    # closed: nothing to do
    check(pool)
    block = pool.malloc(MiB)
    fresh = heap_of(pool)
    assert fresh is not nrt and fresh.descriptor_address != block.address
    check(pool)
    pool.reset()
    assert pool.memory_stats()["segment.all.current"] == 0


def test_configure_replaces_every_pools_heap_or_none(clean_registry):
    roomy = registry.create_pool(SimulatedDevice(256 * MiB, device_id=0))
    tight = registry.create_pool(SimulatedDevice(16 * MiB, device_id=1))
    registry.configure(nrt_heap_size="1MiB")
    heaps = [heap_of(roomy), heap_of(tight)]
    before = [holdings(p) for p in (roomy, tight)]
    with pytest.raises(OutOfMemoryError):
        # roomy's new heap was carved (in a segment grown for it), then given back
        registry.configure(nrt_heap_size="32MiB")
    assert [holdings(p) for p in (roomy, tight)] == before
    assert registry.settings().nrt_heap_size == MiB
    assert [p.nrt_heap.heap for p in (roomy, tight)] == [h.heap for h in heaps]
    registry.configure(nrt_heap_size="2MiB")
    assert [p.memory_stats()["nrt.size"] for p in (roomy, tight)] == [2 * MiB, 2 * MiB]


def test_a_dumped_snapshot_keeps_nrts_heap_for_the_summary(tmp_path):
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    heap_of(pool)
    numba_alloc.dump_snapshot(tmp_path / "s.pickle", pool)
    snap = load_snapshot(tmp_path / "s.pickle")
    assert snap["nrt_heap"]["size"] == MiB
    assert "NRT's heap (np.empty inside kernels, nrt_heap_size): 1.00 MiB" in \
        format_saved_summary(snap, "saved")
    snap["nrt_heap"]["size"] = -1
    with pytest.raises(ValueError, match="nrt_heap"):
        check_snapshot(snap)


def test_out_of_memory_says_where_nrt_draws_from():
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    heap_of(pool)
    with pytest.raises(OutOfMemoryError, match="np.empty inside kernels \\(NRT\\) draws from "
                                               "the pool's NRT heap"):
        pool.malloc(128 * MiB)
    assert "NRT's heap" in str(memory_summary(pool))


def test_a_replacement_whose_switch_fails_changes_no_setting_and_no_heap():
    """Pointing NRT at its new heap waits for the device and writes the
    descriptor: when that fails, configure raises with the old heap still
    serving, the setting as it was and the new heap given back."""
    from faults import FaultyDevice, InjectedFault
    device = FaultyDevice(64 * MiB)
    pool = Pool(device, nrt_heap_size="1MiB")
    heap = heap_of(pool)
    before, served = holdings(pool), heap.heap
    device.fail("synchronize")
    with pytest.raises(InjectedFault):
        pool.configure(nrt_heap_size="3MiB", defrag=True)
    assert pool.settings().nrt_heap_size == MiB and not pool.settings().defrag
    assert heap.heap is served and not served.closed and holdings(pool) == before
    words = pool.backend.read(heap.descriptor_address, 32).view(np.int64)
    assert words[nrt_device.DATA_ADDRESS] == served.address
    pool.configure(nrt_heap_size="3MiB")                # the next try works
    assert pool.memory_stats()["nrt.size"] == 3 * MiB and served.closed


def test_a_replacement_whose_counters_cannot_be_read_keeps_the_heap_and_its_counts():
    """Switching to a new heap reads the old one's counters, to keep them in
    nrt.*: when the copy cannot be started (the driver refuses it), the
    replacement is refused (it went ahead with the figures of the last read
    that completed, and nrt.* lost what the kernels counted since)."""
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    heap = heap_of(pool)
    old = heap.heap
    assert pool.memory_stats()["nrt.num_allocs"] == 0          # a read that completed
    pool.backend.write(old.address + old.size, _granted_words(old, 8))     # a kernel's work
    start = old._reader._start

    def refused():
        raise RuntimeError("cuMemcpyDtoHAsync refused")
    old._reader._start = refused
    before = holdings(pool)
    with pytest.raises(RuntimeError, match="cuMemcpyDtoHAsync refused"):
        pool.configure(nrt_heap_size="2MiB")
    assert pool.settings().nrt_heap_size == MiB and heap.heap is old and not old.closed
    assert holdings(pool) == before
    old._reader._start = start
    pool.configure(nrt_heap_size="2MiB")                # the next try works, counts kept
    stats = pool.memory_stats()
    assert stats["nrt.size"] == 2 * MiB and old.closed
    assert stats["nrt.num_allocs"] == 8 and stats["nrt.peak_bytes_in_use"] == 16 * 8


def test_a_heap_whose_descriptor_cannot_be_written_leaves_the_pool_as_it_was(monkeypatch):
    from numba_alloc.plugin import nrt_heap

    def refused(backend, address, words):
        raise RuntimeError("cuMemcpyHtoD refused")
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB")
    before = holdings(pool)
    monkeypatch.setattr(nrt_heap, "write_words", refused)
    with pytest.raises(RuntimeError, match="refused"):
        heap_of(pool)
    # the segments grown for the heap and its descriptor went back (the
    # device calls, and the reserved totals, count them)
    assert pool.nrt_heap is None and holdings(pool) == before
    assert pool.memory_stats()["segment.all.current"] == 0


@pytest.mark.parametrize("expandable", [False, True])
def test_a_heap_carved_for_a_module_whose_global_is_not_written_goes_back(expandable):
    """nrt_link gives a module the descriptor's address through serve(): when
    that write fails, the heap carved for it goes back as if never carved
    (running totals and peaks too), and the next load carves it again."""
    from numba_alloc.plugin.nrt_heap import serve
    pool = Pool(SimulatedDevice(64 * MiB), nrt_heap_size="1MiB", expandable_segments=expandable)
    pool.malloc(1000)
    before = holdings(pool)

    def refused(address):
        raise RuntimeError("cuMemcpyHtoD refused")
    with pytest.raises(RuntimeError, match="refused"):
        serve(pool, refused)
    assert pool.nrt_heap is None and holdings(pool) == before
    check(pool)
    written = []
    serve(pool, written.append)
    assert written == [pool.nrt_heap.descriptor_address]
    assert pool.memory_stats()["nrt.size"] == MiB
    serve(pool, written.append)                     # carved once
    assert written[1] == written[0]


def test_a_cross_pool_configure_that_fails_gives_the_malloc_heap_its_size_back(clean_registry):
    """configure prepares every pool before it commits any: when the second
    device refuses its malloc heap size, the first one's goes back."""
    class Heaped(SimulatedDevice):
        refuse = False

        def __init__(self, capacity, device_id):
            super().__init__(capacity, device_id)
            self.size = 8 * MiB

        def malloc_heap_size(self):
            return self.size

        def set_malloc_heap_size(self, nbytes):
            if self.refuse and nbytes != self.size:
                raise RuntimeError("cuCtxSetLimit refused")
            self.size = nbytes
    first, second = Heaped(64 * MiB, 0), Heaped(64 * MiB, 1)
    registry.create_pool(first), registry.create_pool(second)
    second.refuse = True
    with pytest.raises(RuntimeError, match="refused"):
        registry.configure(malloc_heap_size="64MiB")
    assert (first.size, second.size) == (8 * MiB, 8 * MiB)
    assert registry.settings().malloc_heap_size is None
