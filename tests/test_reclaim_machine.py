"""Reclaim (the reclaim setting) as a state machine: uses, frees, pins and
GPU work in any order, on the simulated device."""

import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from numba_alloc import OutOfMemoryError, Pool, ReclaimError  # noqa: E402

from faults import FaultyDevice, InjectedFault  # noqa: E402
from invariants import check  # noqa: E402
from test_reclaim import MiB, fill, intact  # noqa: E402

class ReclaimMachine(RuleBasedStateMachine):
    """Blocks in use are resident and never taken; every block's bytes
    survive any number of trips to host memory; counters match a recount."""

    def __init__(self):
        super().__init__()
        self.device = FaultyDevice(24 * MiB)     # no failure unless armed
        self.host_limit = 96 * MiB
        self.pool = Pool(self.device, reclaim=True, host_limit=self.host_limit)
        self.live = []          # [block, value]
        self.uses = []          # (context manager, blocks) entered, not exited
        self.pinned = []

    @rule(size=st.sampled_from([100, 3 * MiB, 5 * MiB, 9 * MiB]), value=st.integers(0, 250))
    def malloc(self, size, value):
        try:
            block = self.pool.malloc(size)
        except OutOfMemoryError:
            return
        try:
            with self.pool.use(block):
                fill(self.device, block, value)
        except OutOfMemoryError:        # reclaimed before its first use: cannot come back
            self.pool.free(block)
            return
        self.live.append([block, value])

    @precondition(lambda self: self.live and len(self.uses) < 3)
    @rule(data=st.data())
    def enter_use(self, data):
        picks = data.draw(st.lists(st.sampled_from(self.live), min_size=1, max_size=2))
        blocks = [p[0] for p in picks]
        context = self.pool.use(*blocks)
        try:
            context.__enter__()
        except OutOfMemoryError:
            return
        for block, value in picks:
            assert self.pool.is_resident(block)
            assert intact(self.device, block, value)
        self.uses.append((context, blocks))

    @precondition(lambda self: self.uses)
    @rule(launch=st.booleans())
    def exit_use(self, launch):
        context, _ = self.uses.pop()
        if launch:
            self.device.launch()        # GPU work queued inside the use
        context.__exit__(None, None, None)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        entry = data.draw(st.sampled_from(self.live))
        if any(entry[0] in blocks for _, blocks in self.uses) or entry[0] in self.pinned:
            return
        self.live.remove(entry)
        self.pool.free(entry[0])

    @precondition(lambda self: self.live and not self.pinned)
    @rule(data=st.data())
    def pin(self, data):
        block = data.draw(st.sampled_from(self.live))[0]
        try:
            self.pool.pin(block)
        except OutOfMemoryError:
            return
        self.pinned.append(block)

    @precondition(lambda self: self.pinned)
    @rule()
    def unpin(self):
        self.pool.unpin(self.pinned.pop())

    @rule()
    def complete(self):
        self.device.complete(1)

    @rule(size=st.sampled_from([3 * MiB, 9 * MiB]))
    def malloc_while_frees_are_held(self, size):
        reclaimed = self.pool.snapshot()["reclaimed"]
        with self.pool.hold_frees():
            try:
                self.pool.free(self.pool.malloc(size))
            except OutOfMemoryError:        # reclaim could not make room: took nothing
                assert self.pool.snapshot()["reclaimed"] == reclaimed

    @rule(call=st.sampled_from(["host_allocate", "copy_to_host", "synchronize"]),
          skip=st.integers(0, 2), size=st.sampled_from([5 * MiB, 9 * MiB, 20 * MiB]))
    def malloc_with_a_failing_reclaim(self, call, skip, size):
        def state():
            return ([(self.pool.is_resident(b), self.pool.pins_of(b)) for b, _ in self.live],
                    self.pool.snapshot()["reclaimed"],
                    self.pool.current("allocated_bytes"), self.pool.current("reclaimed_bytes"))
        before = state()
        self.device.fail(call, skip=skip)
        try:
            block = self.pool.malloc(size)
        except (ReclaimError, InjectedFault):
            assert state() == before        # every block as it was
        except OutOfMemoryError:
            pass
        else:
            self.pool.free(block)
        self.device.heal()

    @rule(limit=st.sampled_from([0, 16 * MiB, 40 * MiB, 96 * MiB]))
    def set_host_limit(self, limit):
        try:
            self.pool.configure(host_limit=limit)
        except RuntimeError:
            assert self.pool._residency.host_bytes > limit
            return
        self.host_limit = limit

    @rule(nbytes=st.sampled_from([None, 4 * MiB]))
    def defragment_or_empty_cache(self, nbytes):
        if nbytes is None:
            self.pool.empty_cache()
        else:
            self.pool.configure(defrag=True)
            self.pool.defragment(nbytes)

    @invariant()
    def consistent(self):
        check(self.pool)
        for _, blocks in self.uses:
            assert all(self.pool.is_resident(b) for b in blocks)
        for block in self.pinned:
            assert self.pool.is_resident(block)
        # the host limit caps the chunks reclaimed blocks hold; the host
        # cache holds every byte of host memory handed out
        assert self.pool._residency.host_bytes <= self.host_limit
        assert self.pool._residency.host_bytes == sum(
            saved.host_bytes for saved in self.pool._residency.reclaimed.values())
        assert self.device.host_used == self.pool.host_cache.stats()["allocated_bytes.current"]

    def teardown(self):
        self.device.heal()
        self.pool.configure(host_limit="96MiB")     # room to bring every block back
        while self.uses:
            self.uses.pop()[0].__exit__(None, None, None)
        for block in self.pinned:
            self.pool.unpin(block)
        # resident ones first: freeing them makes room to bring the others back
        self.live.sort(key=lambda entry: not self.pool.is_resident(entry[0]))
        for block, value in self.live:
            with self.pool.use(block):
                assert intact(self.device, block, value)
            self.pool.free(block)
        self.pool.synchronize()
        stats = check(self.pool)["stats"]
        assert stats["reclaimed.current"] == stats["allocation.all.current"] == 0


TestReclaimMachine = ReclaimMachine.TestCase
TestReclaimMachine.settings = settings(max_examples=40, stateful_step_count=50, deadline=None)
