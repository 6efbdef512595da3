"""Live defragmentation end to end on the simulated device: the planner,
the Numba copy kernel (under the CUDA simulator) and the pool's records."""

import contextlib
import threading

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.policy.backend import PhaseCopyError
from numba_alloc.policy.errors import DefragmentationError, DefragmentationRefused
from numba_alloc.policy.observers import Relocator

from invariants import check
from owner import Owner, pattern
from test_properties import PoolMachine

KiB, MiB = 1 << 10, 1 << 20


def fragmented(defrag, capacity=2 * MiB, count=16):
    """A full small segment of ``count`` blocks with distinct patterns, every
    other one freed: half the bytes free, in holes of one block each."""
    device = SimulatedDevice(capacity)
    pool = Pool(device, defrag=defrag)
    owner = Owner(device, pool)
    size = capacity // count
    for _ in range(count):
        owner.malloc(size)
    for i in range(count // 2):
        owner.free(i)                      # frees the blocks at even positions
    pool.synchronize()
    return device, pool, owner, size


def assert_data_intact(owner):
    """Every live block's pattern, read at its current address."""
    for i in range(len(owner.live)):
        block, seed = owner.live[i]
        assert (owner.device.read(block.address, block.size) == pattern(seed, block.size)).all()


def test_a_scattered_request_fails_without_defrag():
    _, pool, _, size = fragmented(defrag=False)
    with pytest.raises(OutOfMemoryError, match="defrag:on"):
        pool.malloc(4 * size)
    assert compat.get_num_defragmentations(pool) == 0


def test_defrag_moves_live_blocks_and_serves_the_request(monkeypatch):
    from numba_alloc.device import kernels
    launches = []
    run = kernels.simulated_copy
    monkeypatch.setattr(kernels, "simulated_copy", lambda *a, **k: launches.append(a) or run(*a, **k))
    device, pool, owner, size = fragmented(defrag=True)
    device.kernel_limit = 1 << 20          # the kernel, not NumPy, for this batch of 128 KiB moves
    before = {id(b): b.address for b, _ in owner.live}
    block = pool.malloc(4 * size)
    assert len(launches) == 1, "one launch of the Numba kernel (simulated) for the batch"
    moved = [b for b, _ in owner.live if b.address != before[id(b)]]
    assert moved, "blocks had to move"
    assert_data_intact(owner)
    stats = check(pool)["stats"]
    assert (stats["bytes_defragged"] == compat.get_bytes_defragged(pool)
            == sum(b.allocated_size for b in moved))
    assert stats["num_defragmentations"] == compat.get_num_defragmentations(pool) == 1
    assert device.move_counters()[2] == len(moved)
    assert sum(b.allocated_size for b in moved) <= 4 * size   # the cheapest window
    device.write(block.address, np.full(4 * size, 9, np.uint8))
    assert_data_intact(owner)                                  # the new block overlaps none


def test_a_block_another_thread_frees_while_moves_are_planned_moves_with_its_row(monkeypatch):
    """A free of another thread (as a finalizer's free_later makes it) that
    unregisters a planned block's handle, then finds the pool busy and waits:
    the move goes on by the block's row, and the free keeps the new place."""
    from numba_alloc.policy import moves
    from numba_alloc.policy.block import ALLOCATED
    device, pool, owner, size = fragmented(defrag=True)
    execute, seen = moves.execute, {}

    def racing(pool, phases):
        src, dst, _ = phases[-1][-1]            # a phase: rows (src, dst, size)
        i = next(i for i, (b, _) in enumerate(owner.live) if b.address == src)
        block, _ = owner.live.pop(i)
        pool.free_later(block)                  # keeps, unregisters, finds the lock held
        assert pool._deferred and block.state is ALLOCATED
        seen.update(block=block, dst=dst)
        return execute(pool, phases)

    monkeypatch.setattr(moves, "execute", racing)
    assert pool.defragment().blocks_moved >= 2
    assert_data_intact(owner)
    pool.synchronize()                          # the deferred free goes on
    assert seen["block"].state is not ALLOCATED and seen["block"].address == seen["dst"]
    check(pool)


def test_pinned_blocks_do_not_move():
    device, pool, owner, size = fragmented(defrag=True)
    for block, _ in owner.live:
        pool.pin(block)
    addresses = [b.address for b, _ in owner.live]
    with pytest.raises(OutOfMemoryError):
        pool.malloc(4 * size)
    assert [b.address for b, _ in owner.live] == addresses
    assert compat.get_num_defragmentations(pool) == 0


def test_defragment_opens_a_hole_on_demand():
    _, pool, owner, size = fragmented(defrag=False)
    result = pool.defragment(3 * size)
    assert result.hole and result.bytes_moved <= 2 * size and result.bytes_released == 0
    assert_data_intact(owner)
    assert pool.malloc(3 * size).allocated_size == 3 * size
    check(pool)


def test_full_compaction_packs_and_returns_emptied_segments():
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device)
    owner = Owner(device, pool)
    for _ in range(3):                      # three 20 MiB segments of 5 MiB blocks
        for _ in range(4):
            owner.malloc(5 * MiB)
    for i in (11, 9, 8, 6, 4, 2, 1):        # leave five blocks scattered over the segments
        owner.free(i)
    pool.synchronize()
    reserved = compat.memory_reserved(pool)
    result = pool.defragment()
    assert result.bytes_released >= 20 * MiB
    assert compat.memory_reserved(pool) == reserved - result.bytes_released
    assert_data_intact(owner)
    stats = check(pool)["stats"]
    assert stats["bytes_defragged"] == result.bytes_moved
    assert result.bytes_moved <= 5 * 5 * MiB
    assert compat.get_num_defragmentations(pool) == 1


def _three_scattered_segments():
    """Three 20 MiB segments of 5 MiB blocks, five blocks left scattered."""
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device)
    owner = Owner(device, pool)
    for _ in range(12):
        owner.malloc(5 * MiB)
    for i in (11, 9, 8, 6, 4, 2, 1):
        owner.free(i)
    pool.synchronize()
    return pool, owner


def test_a_compaction_that_keeps_its_emptied_segments_leaves_them_cached():
    """release=False: the same moves as a compaction that gives the
    emptied segments back, which then stay in the pool, wholly free, until
    empty_cache() gives them back."""
    twin, _ = _three_scattered_segments()
    given_back = twin.defragment()
    twin.empty_cache()
    pool, owner = _three_scattered_segments()
    reserved = compat.memory_reserved(pool)
    kept = pool.defragment(release=False)
    assert kept == given_back._replace(bytes_released=0) and given_back.bytes_released >= 20 * MiB
    assert compat.memory_reserved(pool) == reserved
    assert sum(segment.size for segment in pool._free_segments()) >= given_back.bytes_released
    assert_data_intact(owner)
    check(pool)
    pool.empty_cache()
    assert compat.memory_reserved(pool) == compat.memory_reserved(twin)
    assert_data_intact(owner)
    check(pool)


def _arrays_every_other_dropped(seed, count, release_first):
    """A pool on a 16 GiB device of sizes only: ``count`` requests of 1-64
    MiB (bench_defrag.py's layout: the large ones in segments of their own,
    the others sharing), every other one freed; empty_cache() first when
    ``release_first``. Returns the pool."""
    import random
    rng = random.Random(seed)
    pool = Pool(SimulatedDevice(16 << 30, holds_data=False))
    blocks = [pool.malloc(rng.randrange(MiB, 64 * MiB)) for _ in range(count)]
    for block in blocks[::2]:
        pool.free(block)
    pool.synchronize()
    if release_first:
        pool.empty_cache()
    return pool


@pytest.mark.parametrize("seed", range(4))
def test_a_full_compaction_leaves_less_reserved_than_giving_back_the_free_segments(seed):
    """Moving a block into a segment that was free costs that segment
    (else it would go back): the compaction moves only what gives bytes
    back, and ends holding no more than empty_cache() alone would (it held
    up to 11% more, having moved nearly every live byte)."""
    cached = _arrays_every_other_dropped(seed, 120, release_first=True)
    pool = _arrays_every_other_dropped(seed, 120, release_first=False)
    live = compat.memory_allocated(pool)
    done = pool.defragment()
    assert compat.memory_reserved(pool) <= compat.memory_reserved(cached)
    assert done.bytes_moved < live // 4
    check(pool)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_a_full_compaction_never_holds_more_than_empty_cache_would(seed):
    """Random requests of 512 B to 80 MiB, some freed as they go and half of
    the rest at the end: a full compaction ends holding no more than
    giving back the free segments would."""
    import random

    def build():
        rng = random.Random(seed)
        pool = Pool(SimulatedDevice(8 << 30, holds_data=False))
        blocks = []
        for _ in range(rng.randrange(5, 120)):
            kind = rng.random()
            size = (rng.randrange(512, MiB) if kind < 0.3 else rng.randrange(MiB, 10 * MiB)
                    if kind < 0.7 else rng.randrange(10 * MiB, 80 * MiB))
            blocks.append(pool.malloc(size))
            if rng.random() < 0.2:
                pool.free(blocks.pop(rng.randrange(len(blocks))))
        for block in [b for b in blocks if rng.random() < 0.5]:
            pool.free(block)
        pool.synchronize()
        return pool

    cached = build()
    cached.empty_cache()
    pool = build()
    pool.defragment()
    assert compat.memory_reserved(pool) <= compat.memory_reserved(cached)
    check(pool)


@pytest.mark.parametrize("release", [None, 1, "no"])
def test_release_must_be_true_or_false_and_nothing_moves_otherwise(release):
    pool, owner = _three_scattered_segments()
    reserved = compat.memory_reserved(pool)
    with pytest.raises(TypeError, match="release must be True or False"):
        pool.defragment(release=release)
    assert compat.memory_reserved(pool) == reserved
    assert compat.get_num_defragmentations(pool) == 0 and pool.stats.bytes_defragged == 0
    assert_data_intact(owner)


def test_a_failed_copy_leaves_blocks_and_data_where_they_were():
    device, pool, owner, size = fragmented(defrag=True)

    def failing_copy(batches, first):
        raise RuntimeError("launch failed: too many resources requested")

    device.copy = failing_copy
    addresses = [b.address for b, _ in owner.live]
    before = pool.memory_stats()
    with pytest.raises(DefragmentationError, match="keep their old addresses") as info:
        pool.malloc(4 * size)
    assert "too many resources" in str(info.value)
    assert [b.address for b, _ in owner.live] == addresses
    assert_data_intact(owner)
    after = pool.memory_stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    check(pool)
    del device.copy                       # the device works again: so does defragmentation
    pool.malloc(4 * size)
    assert_data_intact(owner)


class RecordingRelocator(Relocator):
    def __init__(self, refuse=None):
        self.refuse, self.moves = refuse, []

    def pin_unmovable(self, pool):
        if self.refuse:
            raise DefragmentationRefused(self.refuse)

    def relocated(self, pool, moves):
        self.moves.extend((block, old, block.address) for block, old in moves)


def test_the_relocator_hears_every_move_and_can_refuse():
    _, pool, owner, size = fragmented(defrag=True)
    pool.relocator = RecordingRelocator(refuse="numba-cuda 9.9 is not supported")
    with pytest.raises(OutOfMemoryError, match="refused: numba-cuda 9.9"):
        pool.malloc(4 * size)
    relocator = pool.relocator = RecordingRelocator()
    pool.malloc(4 * size)
    assert relocator.moves and all(old != new for _, old, new in relocator.moves)
    assert {id(b) for b, _, _ in relocator.moves} <= {id(b) for b, _ in owner.live}


def test_pending_frees_are_retired_before_planning():
    device, pool, owner, size = fragmented(defrag=True)
    device.launch()
    owner.free(0)                          # pending: its GPU work has not run
    block = pool.malloc(5 * size)          # defragmentation synchronizes, then reuses it
    assert block.allocated_size == 5 * size
    assert device.pending_work == 0
    assert_data_intact(owner)
    check(pool)


class DefragMachine(PoolMachine):
    """The pool machine with defragmentation on and on-demand compactions."""

    @initialize(config=st.sampled_from([{"defrag": True}, {"defrag": True, "limit": 48 * MiB},
                                        {"defrag": True, "growth": False, "limit": 40 * MiB}]))
    def start(self, config):
        self.device = SimulatedDevice(96 * MiB)
        self.pool = Pool(self.device, **config)
        self.owner = Owner(self.device, self.pool)

    @rule(units=st.integers(1, 64))
    def open_hole(self, units):
        result = self.pool.defragment(units * 64 * KiB)
        assert result.bytes_moved <= compat.memory_allocated(self.pool)
        assert_data_intact(self.owner)

    @rule()
    def compact(self):
        self.pool.defragment()
        assert_data_intact(self.owner)


TestDefragMachine = DefragMachine.TestCase
TestDefragMachine.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)


def _exact(pool, owner):
    """What an error must leave as it was: stats, blocks, handles, settings."""
    return (pool.memory_stats(), pool.snapshot()["segments"],
            [(b.address, b.allocated_size) for b, _ in owner.live], pool.settings())


class ReconfigureMachine(DefragMachine):
    """Defragmentation with settings changed at runtime under live load,
    pinned blocks and frees held: a refused change leaves everything as it
    was, an accepted one is in force, the pool never reserves more than its
    limit, pinned blocks never move, and an out-of-memory moves nothing."""

    @initialize(config=st.sampled_from([{"defrag": True, "limit": 64 * MiB},
                                        {"defrag": True, "max_split_size_mb": 24},
                                        {"defrag": True, "growth": False, "limit": 40 * MiB}]))
    def start(self, config):
        super().start(config)
        self.device.kernel_limit = 0           # NumPy copies: the kernel is tested above
        self.pinned, self.holds = [], contextlib.ExitStack()

    def teardown(self):
        if hasattr(self, "holds"):
            self.holds.close()

    @rule(size=st.integers(MiB, 40 * MiB))
    def malloc_large(self, size):
        before = [(b.address, b.allocated_size) for b, _ in self.owner.live]
        if self.owner.malloc(size) is None:
            assert [(b.address, b.allocated_size) for b, _ in self.owner.live] == before

    @precondition(lambda self: self.owner.live)
    @rule(index=st.integers(0, 1000))
    def free(self, index):
        if self.owner.live[index % len(self.owner.live)][0] not in self.pinned:
            self.owner.free(index)

    @precondition(lambda self: self.owner.live)
    @rule(index=st.integers(0, 1000))
    def pin(self, index):
        block = self.owner.live[index % len(self.owner.live)][0]
        self.pool.pin(block)
        self.pinned.append(block)

    @precondition(lambda self: self.pinned)
    @rule()
    def unpin(self):
        self.pool.unpin(self.pinned.pop())

    @rule()
    def hold_frees(self):
        self.holds.enter_context(self.pool.hold_frees())

    @rule()
    def release_holds(self):
        self.holds.close()

    @rule(change=st.fixed_dictionaries({}, optional={
        "limit": st.sampled_from([None, 24 * MiB, 48 * MiB, 64 * MiB, 0.5]),
        "defrag": st.booleans(),
        "garbage_collection_threshold": st.sampled_from([None, 0.3, 0.8]),
        "growth": st.booleans(),
        "max_split_size_mb": st.sampled_from([None, 24, 40])}))
    def configure(self, change):
        before = _exact(self.pool, self.owner)
        try:
            self.pool.configure(**change)
        except (RuntimeError, ValueError):
            assert _exact(self.pool, self.owner) == before
            return
        assert all(getattr(self.pool.settings(), k) == v for k, v in change.items())

    @rule()
    def reset(self):
        self.pool.reset()
        self.owner.live.clear()
        self.pinned.clear()

    @rule(units=st.integers(1, 64))
    def open_hole(self, units):
        pinned = [(b, b.address) for b in self.pinned]
        super().open_hole(units)
        assert all(b.address == address for b, address in pinned)

    @rule()
    def compact(self):
        pinned = [(b, b.address) for b in self.pinned]
        super().compact()
        assert all(b.address == address for b, address in pinned)

    @invariant()
    def within_limit(self):
        if hasattr(self, "pool") and self.pool.initialized:
            assert compat.memory_reserved(self.pool) <= compat.get_bytes_limit(self.pool)


TestReconfigureMachine = ReconfigureMachine.TestCase
TestReconfigureMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_pin_is_a_function_and_a_context_manager():
    import numba_alloc
    device, pool, owner, size = fragmented(defrag=True)
    blocks = [b for b, _ in owner.live]
    pins = [numba_alloc.pin(b) for b in blocks[:-1]]      # pinned for good
    with numba_alloc.pin(blocks[-1]):
        addresses = [b.address for b in blocks]
        with pytest.raises(OutOfMemoryError):
            pool.malloc(4 * size)
        assert [b.address for b in blocks] == addresses
    assert blocks[-1].pinned == 0 and all(p.block.pinned == 1 for p in pins)
    with pytest.raises(ValueError, match="not memory numba_alloc allocated"):
        numba_alloc.pin(object())


def test_module_defragment_takes_a_pool():
    import numba_alloc
    _, pool, owner, size = fragmented(defrag=False)
    result = numba_alloc.defragment(pool, nbytes=3 * size)
    assert result.hole
    assert_data_intact(owner)


def test_module_defragment_passes_release_on():
    import numba_alloc
    pool, owner = _three_scattered_segments()
    reserved = compat.memory_reserved(pool)
    done = numba_alloc.defragment(pool, release=False)
    assert done.bytes_moved > 0 and done.bytes_released == 0
    assert compat.memory_reserved(pool) == reserved
    assert_data_intact(owner)


@pytest.mark.parametrize("arguments, error", [({"release": "no"}, TypeError),
                                              ({"nbytes": -1}, ValueError),
                                              ({"nbytes": "lots"}, TypeError)])
def test_module_defragment_checks_its_arguments_before_it_does_anything(arguments, error):
    """A bad argument raises before the copy kernel is loaded (on a GPU: a
    compile and a launch)."""
    import numba_alloc
    pool, owner = _three_scattered_segments()
    loads = []
    pool.backend.load_copy_kernel = lambda: loads.append(1)
    with pytest.raises(error):
        numba_alloc.defragment(pool, **arguments)
    assert loads == [] and pool.stats.bytes_defragged == 0
    assert numba_alloc.defragment(pool).bytes_moved > 0 and loads == [1]


def test_compaction_across_many_segments_keeps_every_chain_intact():
    """Blocks moving between segments rebuilt in one phase (found by a
    helper's workload: a destination segment rebuilt before its source)."""
    import random
    device = SimulatedDevice(256 * MiB)
    pool = Pool(device)
    owner = Owner(device, pool)
    rng = random.Random(8)
    for step in range(300):
        if owner.live and rng.random() < 0.45:
            if rng.random() < 0.3:
                device.launch()
            owner.free(rng.randrange(len(owner.live)))
        else:
            owner.malloc(rng.choice((rng.randrange(1, 64 * KiB), rng.randrange(MiB, 12 * MiB))))
        if rng.random() < 0.2:
            device.complete()
    pool.synchronize()
    result = pool.defragment()
    assert result.blocks_moved > 0 and result.bytes_released > 0
    check(pool)
    assert_data_intact(owner)


def test_a_request_larger_than_any_segment_is_served_by_compacting_then_growing():
    device = SimulatedDevice(100 * MiB)
    pool = Pool(device, defrag=True)
    owner = Owner(device, pool)
    for _ in range(20):                       # five 20 MiB segments of 4 MiB blocks
        owner.malloc(4 * MiB)
    for i in range(0, 20, 2)[::-1]:
        owner.free(i)                         # 40 MiB free, scattered over every segment
    pool.synchronize()
    big = pool.malloc(36 * MiB)               # no segment holds it: compact, release, grow
    assert big.allocated_size == 36 * MiB
    assert compat.get_num_defragmentations(pool) == 1
    assert_data_intact(owner)
    check(pool)
    with pytest.raises(OutOfMemoryError):     # nothing can make room for this one
        pool.malloc(90 * MiB)


def test_a_block_the_relocator_has_not_registered_yet_stays_where_it_is():
    def scattered():
        device = SimulatedDevice(64 * MiB)
        pool = Pool(device)
        owner = Owner(device, pool)
        for _ in range(12):                 # three 20 MiB segments of 5 MiB blocks
            owner.malloc(5 * MiB)
        for i in (11, 9, 8, 6, 4, 2, 1):
            owner.free(i)
        pool.synchronize()
        return pool, owner

    class Glue(Relocator):
        def __init__(self, unregistered):
            self.unregistered, self.moved = unregistered, []

        def movable(self, block):
            return block is not self.unregistered

        def relocated(self, pool, moves):
            self.moved += [block for block, _ in moves]

    pool, owner = scattered()               # which blocks a compaction moves
    pool.relocator = Glue(None)
    pool.defragment()
    moving = [i for i, (block, _) in enumerate(owner.live) if block in pool.relocator.moved]
    assert moving

    pool, owner = scattered()               # the same, with one of them not registered
    unregistered = owner.live[moving[0]][0]
    address = unregistered.address
    pool.relocator = glue = Glue(unregistered)
    pool.defragment()
    assert unregistered.address == address and unregistered not in glue.moved
    assert_data_intact(owner)
    check(pool)


def _one_sparse_segment(capacity):
    """A 40 MiB segment holding 3 and 12 MiB blocks (25 MiB free) and a full
    40 MiB segment, on a device of ``capacity``, defrag on."""
    device = SimulatedDevice(capacity)
    pool = Pool(device, defrag=True)
    owner = Owner(device, pool)
    owner.malloc(40 * MiB)
    owner.free(0)
    pool.synchronize()
    owner.malloc(3 * MiB)
    owner.malloc(12 * MiB)
    owner.malloc(40 * MiB)
    return device, pool, owner


def test_a_segments_few_live_blocks_move_into_a_new_segment_to_make_room():
    """No hole opens inside the segments and nothing can be evacuated into
    them, but the device still has room for a 16 MiB segment: the sparse
    segment's 15 MiB move there and the 38 MiB request takes its place
    (stencil's trace failed so at 1.196x its peak live bytes)."""
    device, pool, owner = _one_sparse_segment(100 * MiB)
    reserved = pool.current("reserved_bytes")
    block = pool.malloc(38 * MiB)
    assert_data_intact(owner)
    assert pool.current("reserved_bytes") == reserved + 16 * MiB
    segments = {s["address"]: s for s in check(pool)["segments"]}
    sparse = next(s for s in segments.values() if s["total_size"] == 40 * MiB
                  and any(b["address"] == block.address for b in s["blocks"]))
    assert sparse["allocated_size"] == 38 * MiB           # only the new block is there
    assert compat.get_bytes_defragged(pool) == 15 * MiB


def test_without_room_for_the_new_segment_the_request_fails_and_nothing_moves():
    device, pool, owner = _one_sparse_segment(95 * MiB)     # 15 MiB left: 16 are needed
    before = pool.snapshot()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(38 * MiB)
    after = pool.snapshot()
    assert after["segments"] == before["segments"]
    assert {k: v for k, v in after["stats"].items() if k != "num_ooms"} == \
        {k: v for k, v in before["stats"].items() if k != "num_ooms"}
    assert_data_intact(owner)


def test_a_failed_copy_into_a_new_segment_gives_the_segment_back():
    device, pool, owner = _one_sparse_segment(100 * MiB)

    def failing_copy(batches, first):
        raise RuntimeError("launch failed")

    device.copy = failing_copy
    addresses = [b.address for b, _ in owner.live]
    segments = pool.snapshot()["segments"]
    with pytest.raises(DefragmentationError, match="keep their old addresses"):
        pool.malloc(38 * MiB)
    assert [b.address for b, _ in owner.live] == addresses
    assert pool.snapshot()["segments"] == segments      # the new segment went back
    assert_data_intact(owner)
    check(pool)
    del device.copy
    pool.malloc(38 * MiB)
    assert_data_intact(owner)


def _four_sparse_segments(capacity, defrag=True):
    """Four 20 MiB segments each holding one live 9 MiB block between a
    6 MiB hole and a 5 MiB one (no block fits another segment's holes), on
    a device of ``capacity``."""
    device = SimulatedDevice(capacity)
    pool = Pool(device, defrag=defrag, separate_big_segments=False)   # carved as in PyTorch
    owner = Owner(device, pool)
    for _ in range(4):
        pool.free(pool.malloc(20 * MiB))    # a cached 20 MiB segment ...
        pool.synchronize()
        owner.malloc(6 * MiB)               # ... that these two split
        owner.malloc(9 * MiB)
    for i in range(4):
        owner.free(i)                   # the 6 MiB blocks (the list shifts)
    pool.synchronize()
    return device, pool, owner


def test_sparse_segments_are_packed_into_a_new_one_and_returned_to_make_room():
    """No hole, no compaction and no single segment's blocks open room for
    30 MiB; packing two segments' blocks into one new 18 MiB segment and
    returning them does (the bundled trace and churn failed so)."""
    _, pool, owner = _four_sparse_segments(100 * MiB)
    assert [s["allocated_size"] for s in pool.snapshot()["segments"]] == [9 * MiB] * 4
    block = pool.malloc(30 * MiB)
    assert_data_intact(owner)
    sizes = sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                   for s in check(pool)["segments"])
    assert sizes == [(18, 18), (20, 9), (20, 9), (30, 30)]
    assert block.size == 30 * MiB
    assert compat.get_bytes_defragged(pool) == 18 * MiB
    assert pool.stats.num_device_free == 2


def test_sparse_segments_stay_without_defrag_or_without_room_for_the_new_segment():
    _, pool, _ = _four_sparse_segments(100 * MiB, defrag=False)
    with pytest.raises(OutOfMemoryError):
        pool.malloc(30 * MiB)
    # 9 MiB left: a round's segment for one 9 MiB block needs 10
    _, pool, owner = _four_sparse_segments(89 * MiB)
    before = pool.snapshot()
    with pytest.raises(OutOfMemoryError):
        pool.malloc(30 * MiB)
    assert pool.snapshot()["segments"] == before["segments"]
    assert_data_intact(owner)


def test_with_less_room_rounds_pack_one_segment_at_a_time_into_a_tight_one():
    """17 MiB left (two 9 MiB blocks need 18): the first round packs one
    segment's block into a new 10 MiB segment and returns the 20 MiB one;
    with the room that made, the second packs two into an 18 MiB one, and
    the 30 MiB request fits what went back."""
    _, pool, owner = _four_sparse_segments(97 * MiB)
    assert pool.malloc(30 * MiB).size == 30 * MiB
    assert_data_intact(owner)
    sizes = sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                   for s in check(pool)["segments"])
    assert sizes == [(10, 9), (18, 18), (20, 9), (30, 30)]


def _four_segments_holding_12_mib():
    """Four 20 MiB segments each holding one 12 MiB block (their 8 MiB
    holes fit no block: nothing compacts) on a device with 14 MiB free."""
    device = SimulatedDevice(94 * MiB)
    pool = Pool(device, defrag=True)
    owner = Owner(device, pool)
    for i in range(4):
        pool.free(pool.malloc(20 * MiB))     # a cached 20 MiB segment ...
        pool.synchronize()
        owner.malloc(12 * MiB)               # ... that a 12 MiB block splits
    return device, pool, owner


def test_rounds_of_packing_each_make_room_for_the_next():
    """One segment's blocks fit a new 12 MiB segment, then another's, then
    two segments' fit a new 24 MiB one, and the 40 MiB request fits what
    they returned."""
    device, pool, owner = _four_segments_holding_12_mib()
    assert sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                  for s in pool.snapshot()["segments"]) == [(20, 12)] * 4
    pool.malloc(40 * MiB)
    assert_data_intact(owner)
    assert sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                  for s in check(pool)["segments"]) == [(12, 12), (12, 12), (24, 24), (40, 40)]
    assert compat.get_bytes_defragged(pool) == 48 * MiB


def test_a_copy_failing_in_a_later_round_leaves_the_earlier_rounds_done_and_the_pool_whole():
    device, pool, owner = _four_segments_holding_12_mib()
    copy, calls = device.copy, []

    def second_fails(batches, first):
        calls.append(len(batches))
        if len(calls) == 2:
            raise RuntimeError("launch failed")
        return copy(batches, first)

    device.copy = second_fails
    with pytest.raises(DefragmentationError, match="keep their old addresses"):
        pool.malloc(40 * MiB)
    assert_data_intact(owner)
    # round one stays done (its new segment and the one it emptied gone);
    # round two's new segment went back
    assert sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                  for s in check(pool)["segments"]) == [(12, 12), (20, 12), (20, 12), (20, 12)]
    del device.copy
    pool.malloc(40 * MiB)
    assert_data_intact(owner)


class LateCopies(SimulatedDevice):
    """Copies that run when they are waited for (finish_copies), as a GPU's
    run after their launches return; the device fails them after
    ``fail_after`` phases (None: never)."""

    fail_after = None
    on_finish = staticmethod(lambda: None)     # what the test looks at before the copies

    def start_copies(self, phases, first):
        self.started = (phases, first)

    def finish_copies(self):
        self.on_finish()
        phases, first = self.started
        for done, phase in enumerate(phases):
            if done == self.fail_after:
                raise PhaseCopyError(done) from RuntimeError("the device failed")
            self.copy(phase.batches(), first if done == 0 else 0)


def test_a_round_whose_copy_completed_before_the_wait_failed_keeps_its_new_segment():
    """The first round's copy completes and waiting for it fails (a
    cuCtxSynchronize the driver fails after the copy kernel ran):
    DefragmentationError with the moved block at its new address, and its
    new segment stays in the pool, holding it. It went back to the device
    with the block inside it: the block's memory freed under it, the block
    table without its segment and the counters above what it holds."""
    device, pool, owner = _four_segments_holding_12_mib()
    waits = []

    def first_wait_fails():
        waits.append(1)
        if len(waits) == 1:
            raise PhaseCopyError(1) from RuntimeError("the device failed after the copies")

    device.finish_copies = first_wait_fails
    with pytest.raises(DefragmentationError, match="once the copy"):
        pool.malloc(40 * MiB)
    assert_data_intact(owner)
    assert all(pool.segment_of(block) is not None for block, _ in owner.live)
    assert sorted((s["total_size"] // MiB, s["allocated_size"] // MiB)
                  for s in check(pool)["segments"]) == [(12, 12), (20, 0), (20, 12),
                                                        (20, 12), (20, 12)]
    del device.finish_copies
    pool.malloc(40 * MiB)
    assert_data_intact(owner)
    check(pool)


def _compaction_of_phases(device):
    """(pool, owner) whose full compaction takes several phases: blocks
    leaving the emptiest segments, then sliding down in the others."""
    pool = Pool(device)
    owner = Owner(device, pool)
    for _ in range(30):                        # three 20 MiB segments of ten blocks
        owner.malloc(2 * MiB)
    for i in (28, 26, 24, 22, 18, 16, 12, 9, 4, 2, 0):
        owner.free(i)                          # two phases: 6 blocks, then 1
    pool.synchronize()
    return pool, owner


def test_records_follow_while_the_copies_run_and_go_back_for_phases_the_device_failed():
    """A backend whose copies run after start_copies returns (a GPU): the
    blocks' records and their observers follow before the copies complete;
    when the device fails them after the first phase, that phase's blocks
    keep their new addresses and the others get their old ones back, every
    byte where its block says, the counters counting the first phase only."""
    pool, owner = _compaction_of_phases(SimulatedDevice(GiB := 1 << 30))
    addresses = [block.address for block, _ in owner.live]
    done = pool.defragment()                   # the plan, on a device of the same layout
    moved_in_order = [block.address for block, _ in owner.live]
    device = LateCopies(GiB)
    pool, owner = _compaction_of_phases(device)
    assert [block.address for block, _ in owner.live] == addresses
    device.fail_after = 1
    seen = []
    device.on_finish = lambda: seen.append([block.address for block, _ in owner.live])
    with pytest.raises(DefragmentationError, match="failed in phase 2 of") as info:
        pool.defragment()
    assert str(info.value.__cause__) == "the device failed"
    phases, _ = device.started
    assert len(phases) == 2 and seen == [moved_in_order]   # followed before the copies ran
    first = set(phases[0].moves[:, 1].tolist())        # the first phase's destinations
    now = [block.address for block, _ in owner.live]
    for old, moved, address in zip(addresses, moved_in_order, now):
        assert address == (moved if moved in first else old)
    assert sum(a != b for a, b in zip(addresses, now)) == len(phases[0].moves)
    assert_data_intact(owner)
    assert compat.get_bytes_defragged(pool) == int(phases[0].moves[:, 2].sum())
    check(pool)
    device.fail_after = None
    assert pool.defragment().bytes_moved > 0
    assert [block.address for block, _ in owner.live] == moved_in_order
    assert done.bytes_moved == compat.get_bytes_defragged(pool)
    assert_data_intact(owner)
    check(pool)


def test_pools_sharing_a_device_count_only_their_own_moves():
    """Two pools on one simulated device: pool A's compaction held inside
    its copy while pool B compacts from another thread; each counts its
    own defragmentation and bytes only (B copies once A's copies are
    counted: a backend's copy session is one pool's at a time)."""
    device = SimulatedDevice(64 * MiB)
    pools = {name: Pool(device) for name in "AB"}
    for pool in pools.values():
        blocks = [pool.malloc(128 << 10) for _ in range(16)]
        for block in blocks[::2]:
            pool.free(block)
        pool.synchronize()
    held, go, b_waits = threading.Event(), threading.Event(), threading.Event()
    copy = device.copy

    def held_copy(batches, first):
        if threading.current_thread().name == "A" and not held.is_set():
            held.set()
            go.wait()
        return copy(batches, first)

    device.copy = held_copy
    session = device.copy_session()

    class Watched:           # B's thread says when it asks for the session
        def __enter__(self):
            if threading.current_thread().name == "B":
                b_waits.set()
            return session.__enter__()

        def __exit__(self, *exc):
            return session.__exit__(*exc)

    device.copy_session = lambda: Watched()
    done = {}

    def compact(name):
        try:
            done[name] = pools[name].defragment()
        finally:
            b_waits.set()    # B ended (a pool that does not wait for A's copies)

    threads = {name: threading.Thread(target=compact, args=(name,), name=name) for name in "AB"}
    threads["A"].start()
    assert held.wait(60)                       # A inside its copy, its counters read
    threads["B"].start()
    assert b_waits.wait(60)                    # B waits for A's session (or has ended)
    go.set()
    for thread in threads.values():
        thread.join(60)
    for name, pool in pools.items():
        assert done[name].bytes_moved > 0
        assert compat.get_num_defragmentations(pool) == 1
        assert compat.get_bytes_defragged(pool) == done[name].bytes_moved
        check(pool)
