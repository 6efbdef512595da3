"""Making room for a request by moving blocks (policy/room.py), on the
simulated device: every block moves at most once in a request (issue 37,
defect 5)."""

import collections

import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numba_alloc import OutOfMemoryError, Pool, SimulatedDevice
from numba_alloc.policy.observers import PoolObserver

from invariants import check
from owner import Owner, pattern

MiB = 1 << 20


class MoveCounts(PoolObserver):
    """How many times each block moved."""

    def __init__(self):
        self.counts = collections.Counter()

    def on_move(self, pool, block, old_address):
        self.counts[id(block)] += 1


class Stamped:
    """A user of a pool whose live blocks carry their own pattern in their
    first and last STAMP bytes only, as Owner's do in every byte (a
    property test makes hundreds of MiB of blocks): a block moved to a
    wrong place, or overwritten, shows there."""
    STAMP = 4096

    def __init__(self, device, pool):
        self.device, self.pool, self.live, self.serial = device, pool, [], 0

    def malloc(self, size):
        try:
            block = self.pool.malloc(size)
        except OutOfMemoryError:
            return None
        self.serial += 1
        self.live.append((block, self.serial))
        for offset, data in self.stamps(block, self.serial):
            self.device.write(block.address + offset, data)
        return block

    def stamps(self, block, seed):
        """(offset, bytes) the block holds."""
        return [(0, pattern((seed, 0), self.STAMP)),
                (block.size - self.STAMP, pattern((seed, 1), self.STAMP))]

    def free(self, index):
        block, _ = self.live.pop(index)
        self.pool.free(block)


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
        stamps = owner.stamps(block, seed) if isinstance(owner, Stamped) else \
            [(0, pattern(seed, block.size))]
        for offset, data in stamps:
            assert (owner.device.read(block.address + offset, len(data)) == data).all()


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
