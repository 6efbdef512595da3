"""Making room for a request by moving blocks (policy/room.py), on the
simulated device: every block moves at most once in a request, and a
request that fails leaves the pool's segments, reserved bytes and
counters as they were, only blocks moved (issue 37, defects 1 and 5)."""

import collections

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_alloc import Pool, SimulatedDevice
from numba_alloc.policy.backend import DeviceOutOfMemory
from numba_alloc.policy.errors import DefragmentationError
from numba_alloc.policy.observers import PoolObserver, Relocator

from faults import FaultyDevice
from invariants import check
from owner import Owner, pattern

MiB = 1 << 20
# what moving blocks may change: its own counters, the split blocks' (a
# layout's), and what a failed request counts
MOVED = ("bytes_defragged", "num_defragmentations", "num_ooms", "num_sync_all_streams")
LAYOUT = ("inactive_split.", "inactive_split_bytes.")
# what a segment reserved and given back within the request counts
ROUND_TRIP = ("num_device_alloc", "num_device_free", "bytes_released", "reserved_bytes.",
              "segment.")


class MoveCounts(PoolObserver):
    """How many times each block moved."""

    def __init__(self):
        self.counts = collections.Counter()
        self.defragmentations = []

    def on_move(self, pool, block, old_address):
        self.counts[id(block)] += 1

    def on_defragment(self, pool, blocks_moved, bytes_moved):
        self.defragmentations.append((blocks_moved, bytes_moved))


class Stamped(Owner):
    """An Owner whose blocks hold their pattern in their first and last
    STAMP bytes only (a property test makes hundreds of MiB of blocks): a
    block moved to a wrong place, or overwritten, shows there."""
    STAMP = 4096

    def expected(self, block, seed):
        return [(0, pattern((*seed, 0), self.STAMP)),
                (block.size - self.STAMP, pattern((*seed, 1), self.STAMP))]


def build(segments, slack, keep_whole=True, device_class=SimulatedDevice, owner_class=Owner):
    """A pool with defrag on over ``segments``, each (MiB, [(block MiB,
    kept)]): one segment of that size carved into those blocks, the ones
    not kept freed; on a device with ``slack`` MiB beyond them."""
    device = device_class((sum(size for size, _ in segments) + slack) * MiB)
    device.kernel_limit = 0                # NumPy copies: the kernel is tested elsewhere
    pool = Pool(device, defrag=True, keep_whole_segments=False)
    owner, dropped = owner_class(device, pool), []
    for size, blocks in segments:
        pool.free(pool.malloc(size * MiB))     # a cached segment of that size ...
        pool.synchronize()
        for block_size, kept in blocks:        # ... that these blocks split
            owner.malloc(block_size * MiB)
            if not kept:
                dropped.append(owner.live[-1][0])
    for block in dropped:
        owner.free(next(i for i, (b, _) in enumerate(owner.live) if b is block))
    pool.synchronize()
    pool.configure(keep_whole_segments=keep_whole)
    return device, pool, owner


def assert_data_intact(owner):
    for block, seed in owner.live:
        for offset, data in owner.expected(block, seed):
            assert (owner.device.read(block.address + offset, len(data)) == data).all()


def state(pool):
    """What a failed request must leave as it was: the segments (address,
    size) and the counters."""
    segments = sorted((s["address"], s["total_size"]) for s in pool.snapshot()["segments"])
    return segments, pool.memory_stats()


def assert_as_before(before, pool):
    """The pool's segments as ``before``, and its counters but for those
    moving blocks changes, and those of segments the request reserved and
    gave back (as many freed as allocated)."""
    segments, stats = before
    now_segments, now = state(pool)
    assert now_segments == segments
    round_trips = now["num_device_alloc"] - stats["num_device_alloc"]
    assert now["num_device_free"] - stats["num_device_free"] == round_trips
    assert now["reserved_bytes.all.current"] == stats["reserved_bytes.all.current"]
    for key, value in stats.items():
        if key.startswith(MOVED + LAYOUT) or round_trips and key.startswith(ROUND_TRIP) \
                and not key.endswith(".current"):
            continue
        assert now[key] == value, key


# seed 380 of a random campaign: the plan compacts, then packs a round
COMPACT_THEN_PACK = (
    [(32, [(12, False), (6, False), (12, True), (2, False)]),
     (24, [(6, False), (5, False), (6, True), (4, False), (3, False)]),
     (64, [(6, False), (6, True), (8, True), (12, True), (2, False), (12, True), (6, True),
           (2, True), (10, True)])], 0, 40 * MiB)


def test_a_compaction_then_a_round_moves_each_block_once():
    """Issue 37, defect 5: the round packed blocks the compaction had just
    moved, copying them twice."""
    segments, slack, request = COMPACT_THEN_PACK
    device, pool, owner = build(segments, slack)
    moves = MoveCounts()
    pool.add_observer(moves)
    live = sum(block.size for block, _ in owner.live)
    assert owner.malloc(request) is not None
    assert moves.counts and max(moves.counts.values()) == 1
    assert pool.stats.bytes_defragged <= live
    assert_data_intact(owner)
    check(pool)


def test_a_round_reserves_a_segment_as_tight_as_the_blocks_it_receives():
    """A sparse 20 MiB segment's 6 MiB block, with 6 MiB free on the
    device: the round moves it into a new segment of 6 MiB, which leaves
    the 20 MiB one free for a 16 MiB request. A segment sized for new
    requests of 6 MiB (18 MiB) would not fit the device, and the request
    would fail."""
    device, pool, owner = build([(20, [(6, True), (14, False)]),
                                 (20, [(19, True), (1, False)])], 6)
    def large():
        return sorted(s["total_size"] for s in pool.snapshot()["segments"]
                      if s["segment_type"] == "large")
    assert large() == [20 * MiB, 20 * MiB]
    assert owner.malloc(16 * MiB) is not None
    assert large() == [6 * MiB, 20 * MiB, 20 * MiB]
    assert pool.stats.bytes_defragged == 6 * MiB
    assert_data_intact(owner)
    check(pool)


# a 20 MiB segment whose 12 MiB block fits no free range elsewhere, between
# 3 MiB of free space and a 3 MiB hole, its 2 MiB block at the end; another
# segment with a 2 MiB hole; nothing more on the device
GATHER = [(20, [(3, False), (12, True), (3, False), (2, True)]), (20, [(18, True), (2, False)])]


def gathered(device_class=SimulatedDevice):
    device, pool, owner = build(GATHER, 0, device_class=device_class)
    segments = {s["address"]: s for s in pool.snapshot()["segments"] if s["total_size"] == 20 * MiB}
    first = min(segments)
    return device, pool, owner, first


def test_a_segments_free_space_is_gathered_at_its_end_when_no_hole_can_be_cleared():
    """No run of blocks can be cleared for 8 MiB (the 12 MiB block fits no
    free range elsewhere) and the device has no room: the 2 MiB block moves
    into the other segment's hole and the 12 MiB one slides down by 3 MiB
    over its own bytes, in four copies; the request takes the 8 MiB left."""
    device, pool, owner, first = gathered()
    moves = MoveCounts()
    pool.add_observer(moves)
    block = owner.malloc(8 * MiB)
    assert block is not None and block.address == first + 12 * MiB
    assert sorted(moves.counts.values()) == [1, 1]
    assert moves.defragmentations == [(2, 14 * MiB)]       # told once, of both blocks
    assert pool.stats.bytes_defragged == 14 * MiB
    assert [b.address - first for b, _ in owner.live[:1]] == [0]     # the 12 MiB block
    assert_data_intact(owner)
    check(pool)


def test_defragment_for_a_size_gathers_when_no_hole_can_be_cleared():
    device, pool, owner, first = gathered()
    result = pool.defragment(8 * MiB)
    assert result.hole and result.blocks_moved == 2 and result.bytes_moved == 14 * MiB
    assert pool.malloc(8 * MiB).address == first + 12 * MiB
    assert_data_intact(owner)
    check(pool)


def test_with_growth_off_the_arenas_blocks_slide_together_for_a_request():
    """One 10 MiB arena: blocks of 2, 3 and 2 MiB, each followed by 1 MiB
    free. No run can be cleared (a block between the free ranges fits none
    of them); the 3 MiB block slides down 1 MiB in three copies, the last
    one 2 MiB in one, and the 3 MiB request takes the arena's end."""
    device = FaultyDevice(64 * MiB)             # (it counts the copies)
    pool = Pool(device, growth=False, limit=10 * MiB, defrag=True)
    owner = Owner(device, pool)
    for size in (2, 1, 3, 1, 2, 1):
        owner.malloc(size * MiB)
    for index in (5, 3, 1):
        owner.free(index)
    pool.synchronize()
    arena = owner.live[0][0].address
    copies = device.calls["copy"]
    block = owner.malloc(3 * MiB)
    assert block is not None and block.address == arena + 7 * MiB
    assert [b.address - arena for b, _ in owner.live[:3]] == [0, 2 * MiB, 5 * MiB]
    assert pool.stats.bytes_defragged == 5 * MiB
    assert device.calls["copy"] - copies == 4
    assert_data_intact(owner)
    check(pool)


class Scribbling(FaultyDevice):
    """A failing copy first writes garbage over its destinations, as a
    launch that failed part way may have."""

    def copy(self, batches, first):
        fault = self._faults.get("copy")
        if fault is not None and not fault[0]:
            for (dst, _), _, table in batches:
                for _, offset, nbytes in table.tolist():
                    self.write(dst + offset, np.full(nbytes, 0xA5, np.uint8))
        super().copy(batches, first)


@pytest.mark.parametrize("failing", range(5))
def test_a_copy_failing_anywhere_in_a_gather_leaves_every_block_whole(failing):
    """The gather's copies: the eviction, then the slide's four pieces. When
    copy ``failing`` fails (after writing garbage where it copies to), the
    blocks moved before it keep their new places, the sliding block its
    old address and every byte (its pieces go back), the pool is
    consistent, and once the device works the request is served."""
    device, pool, owner, first = gathered(Scribbling)
    addresses = [b.address for b, _ in owner.live]
    device.fail("copy", skip=failing)
    with pytest.raises(DefragmentationError, match="keep" if failing == 0 else "went back"):
        pool.malloc(8 * MiB)
    assert_data_intact(owner)
    check(pool)
    now = [b.address for b, _ in owner.live]
    assert now[0] == addresses[0]           # the 12 MiB block did not move
    assert (now[1] != addresses[1]) == (failing > 0)    # the 2 MiB one moved before the slide
    assert owner.malloc(8 * MiB) is not None
    assert_data_intact(owner)
    check(pool)


# the 4 MiB block of the first segment must leave for 9 MiB to be free, and
# fits no free range of the second (3 and 1 MiB), whose blocks slide first
GATHER_INTO_GATHERED = [(20, [(5, True), (5, True), (4, False), (4, True), (2, False)]),
                        (20, [(4, True), (4, True), (3, False), (4, True), (4, True),
                              (1, False)])]


@pytest.mark.parametrize("failing", [None, 0, 1, 2, 3, 4])
def test_a_block_goes_into_free_space_another_segment_gathers_first(failing):
    """The second segment's last two blocks slide down 3 MiB (two pieces
    each), the first segment's 4 MiB block goes into the 4 MiB gathered at
    its end, and the 9 MiB request takes the first segment's end. When
    copy ``failing`` fails (garbage written first), every block keeps its
    bytes, the pool is consistent, and the request is served later."""
    device, pool, owner = build(GATHER_INTO_GATHERED, 0, device_class=Scribbling)
    first = min(s["address"] for s in pool.snapshot()["segments"]
                if s["total_size"] == 20 * MiB)
    if failing is not None:
        device.fail("copy", skip=failing)
        with pytest.raises(DefragmentationError):
            pool.malloc(9 * MiB)
        assert_data_intact(owner)
        check(pool)
        device.heal()
    block = owner.malloc(9 * MiB)
    assert block is not None and block.address == first + 10 * MiB
    if failing is None:
        assert pool.stats.bytes_defragged == 12 * MiB      # two 4 MiB slides, one eviction
    assert_data_intact(owner)
    check(pool)


def test_putting_pieces_back_that_fails_too_says_the_block_is_split():
    device, pool, owner, first = gathered(FaultyDevice)
    device.fail("copy", skip=3, times=2)            # the third piece, then its way back
    with pytest.raises(DefragmentationError, match="split between its old and new places"):
        pool.malloc(8 * MiB)
    check(pool)


class PinsAtQuiesce(Relocator):
    """A relocator that pins ``blocks`` when a request is about to move
    blocks (as the Numba glue pins NRT's memsys), after the request made
    its first plan."""

    def __init__(self, blocks):
        self.blocks = blocks

    def pin_unmovable(self, pool):
        for block in self.blocks:
            pool.pin(block)
        self.blocks = []


def test_blocks_pinned_while_the_device_quiesces_do_not_move():
    """make_room plans before it quiesces the device and keeps that plan
    only when quiescing changed nothing: here the relocator pins every
    live block then, so nothing may move and the request fails with the
    pool as before."""
    segments, slack, request = COMPACT_THEN_PACK
    device, pool, owner = build(segments, slack)
    addresses = [block.address for block, _ in owner.live]
    pool.relocator = PinsAtQuiesce([block for block, _ in owner.live])
    moves = MoveCounts()
    pool.add_observer(moves)
    before = state(pool)
    assert owner.malloc(request) is None
    assert not moves.counts
    assert [block.address for block, _ in owner.live] == addresses
    assert_as_before(before, pool)
    assert_data_intact(owner)
    check(pool)


# seed 227: the plan compacts into the 6 MiB the device has left, then packs a round
COMPACT_INTO_SLACK_THEN_PACK = (
    [(32, [(2, True), (3, False), (5, True), (2, True), (8, True), (12, True)]),
     (20, [(3, False), (4, False), (8, True), (5, False)]),
     (24, [(4, True), (5, True), (8, False), (3, True), (4, True)]),
     (24, [(8, True), (2, False), (2, True), (12, False)]),
     (20, [(6, False), (4, False), (2, False), (6, True), (2, True)])], 6, 48 * MiB)


class OtherProcess(SimulatedDevice):
    """A device that another process takes ``grab`` bytes of once, after
    the ``after``-th copy from now (None: never); ``released_before``: the
    segments released by then."""
    after = grab = released_before = None

    def copy(self, batches, first):
        super().copy(batches, first)
        if self.after is not None:
            self.after -= 1
            if self.after == 0:
                self.after, self.released_before = None, self.releases
                grab = min(self.grab, self.memory_info()[0])
                if grab:
                    SimulatedDevice.allocate(self, grab)


def test_memory_another_process_takes_while_blocks_move_is_no_reason_to_change_the_pool():
    """Issue 37, defect 1: a compaction returned its emptied segments, then
    the device refused the round's segment (another process had taken its
    free memory while the compaction copied): the request failed with the
    segments returned. Now it is served another way, or fails with the
    pool as before."""
    segments, slack, request = COMPACT_INTO_SLACK_THEN_PACK
    device, pool, owner = build(segments, slack, keep_whole=False, device_class=OtherProcess)
    before = state(pool)
    device.after, device.grab = 1, slack * MiB      # once the compaction has copied
    if owner.malloc(request) is None:
        assert_as_before(before, pool)
    assert pool.stats.bytes_defragged > 0
    assert_data_intact(owner)
    check(pool)


class Refusing(SimulatedDevice):
    """A device that refuses the ``refuse``-th allocation from now once,
    as if another process held the memory for that instant."""
    refuse = None

    def allocate(self, nbytes):
        if self.refuse is not None:
            self.refuse -= 1
            if self.refuse == 0:
                self.refuse = None
                raise DeviceOutOfMemory("refused (another process, for an instant)")
        return super().allocate(nbytes)


def layouts():
    """(segments, slack MiB, request bytes, keep_whole) for build: every
    segment holds live blocks (none is a cached free segment, which a
    request returns to the device before it moves anything)."""
    blocks = st.lists(st.tuples(st.sampled_from([2, 3, 4, 5, 6, 8, 12]), st.booleans()),
                      min_size=1, max_size=12)

    def fill(size, drawn):
        parts, left = [], size
        for block, kept in drawn:
            block = min(block, left)
            if left - block == 1:
                block = left                   # no 1 MiB rest (a small-pool block)
            parts.append((block, kept))
            left -= block
            if not left:
                break
        parts = parts + [(left, False)] if left else parts
        parts[0] = (parts[0][0], True)
        return size, parts

    # mostly requests larger than any segment, so that only growing serves
    # them: a compaction, rounds, or both
    segment = st.builds(fill, st.sampled_from([20, 24, 32, 40]), blocks)
    return st.tuples(st.lists(segment, min_size=3, max_size=6), st.sampled_from([0, 2, 6, 12]),
                     st.sampled_from([24, 40, 48, 64]).map(lambda m: m * MiB), st.booleans())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts())
def test_no_block_moves_twice_in_one_request(layout):
    segments, slack, request, keep_whole = layout
    device, pool, owner = build(segments, slack, keep_whole, owner_class=Stamped)
    moves = MoveCounts()
    pool.add_observer(moves)
    owner.malloc(request)
    assert max(moves.counts.values(), default=0) <= 1
    assert_data_intact(owner)
    check(pool)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), refuse=st.integers(1, 6))
def test_a_request_refused_a_segment_at_any_point_is_served_or_leaves_the_pool_as_before(
        layout, refuse):
    """The device refuses the request's ``refuse``-th new segment once (as
    if another process held the memory for that instant): the request is
    served, or fails with the pool as before but for moved blocks."""
    segments, slack, request, keep_whole = layout
    device, pool, owner = build(segments, slack, keep_whole, Refusing, Stamped)
    before = state(pool)
    device.refuse = refuse
    if owner.malloc(request) is None:
        assert_as_before(before, pool)
    assert_data_intact(owner)
    check(pool)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), after=st.integers(1, 5), grab=st.sampled_from([2, 6, 12, 40]))
def test_memory_another_process_takes_changes_a_failed_request_only_once_memory_went_back(
        layout, after, grab):
    """Another process takes ``grab`` MiB after the request's ``after``-th
    copy: the request is served, or fails with the pool as before but for
    moved blocks, unless the pool had returned memory to the device by
    then (nothing can get it back: the pool keeps what it then holds,
    every block intact)."""
    segments, slack, request, keep_whole = layout
    device, pool, owner = build(segments, slack, keep_whole, OtherProcess, Stamped)
    before, releases = state(pool), device.releases
    device.after, device.grab = after, grab * MiB
    if owner.malloc(request) is None and device.released_before in (None, releases):
        assert_as_before(before, pool)
    assert_data_intact(owner)
    check(pool)
