"""Property-based tests of traces: corrupted logs are refused naming their
line, a dumped history with defragmentation moves replays cleanly, and a
replay that fails anywhere leaves the pool as it was."""

import io
import math
import random
import re

import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import numba_alloc
from numba_alloc.observe.history import ALLOC, MOVE
from numba_alloc.observe.trace import (ALLOCATE, ALLOCATE_FAILURE, DEALLOCATE,
                               TraceEvent, read_rmm_log)

from test_replay import current_stats, pool_with_live_blocks
from test_trace import HEADER_LINE, NEW_RMM, dumped, live_pointer_errors
from workload import KiB, MiB, make_pool


VALID_LOG = NEW_RMM.splitlines()


def assert_well_formed(events):
    for e in events:
        assert type(e.thread) is int and 0 <= e.thread < 1 << 64
        assert type(e.time) is float and math.isfinite(e.time) and e.time >= 0
        assert e.action in (ALLOCATE, DEALLOCATE, ALLOCATE_FAILURE)
        assert type(e.pointer) is int and 0 <= e.pointer < 1 << 64
        assert type(e.size) is int and 0 <= e.size < 1 << 64
        assert type(e.stream) is int and 0 <= e.stream < 1 << 64
        assert not (e.action == ALLOCATE_FAILURE and e.pointer)


@settings(max_examples=300, deadline=None)
@given(line=st.integers(1, len(VALID_LOG) - 1), field=st.integers(0, 6),
       text=st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=30)
       | st.sampled_from(["-1", "1.5", "0x", "nan", "-0", "1e3", "(nil)", "0x0", "00", " 7 ",
                          str(1 << 64), "9" * 50, '"', "free", "allocate failure"]))
def test_a_corrupted_field_is_read_as_well_formed_or_refused_naming_its_line(line, field, text):
    lines = list(VALID_LOG)
    fields = lines[line].split(",")
    fields[field:field + 1] = [text]         # field 6 appends one
    lines[line] = ",".join(fields)
    try:
        events = read_rmm_log(io.StringIO("\n".join(lines) + "\n"))
    except ValueError as e:
        assert str(e).startswith(f"trace, line {line + 1}: "), str(e)
    else:
        assert_well_formed(events)
        clean = read_rmm_log(io.StringIO(NEW_RMM))
        assert [e for i, e in enumerate(events) if i != line - 1] == [
            e for i, e in enumerate(clean) if i != line - 1]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_read_as_well_formed_or_refused_with_a_value_error(text):
    try:
        events = read_rmm_log(io.StringIO(HEADER_LINE + "\n" + text, newline=""))
    except ValueError as e:
        assert re.match(r"trace, line \d+: ", str(e)), str(e)
    else:
        assert_well_formed(events)


class DefragmentingPool(RuleBasedStateMachine):
    """Random allocations, frees (some while the device works) and
    defragmentations on a pool too small for its load, so that
    defragmentation also runs on the malloc path and out-of-memory errors
    are logged; at the end, the dumped history must replay cleanly."""

    def __init__(self):
        super().__init__()
        self.device, self.pool = make_pool(capacity=16 * MiB, defrag=True)
        numba_alloc.record_history(device=self.pool)
        self.live = []

    @rule(size=st.one_of(st.integers(1, 8 * KiB), st.integers(MiB, 3 * MiB)))
    def malloc(self, size):
        try:
            self.live.append(self.pool.malloc(size))
        except numba_alloc.OutOfMemoryError:
            pass

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 63), device_busy=st.booleans())
    def free(self, index, device_busy):
        if device_busy:
            self.device.launch()
        self.pool.free(self.live.pop(index % len(self.live)))

    @rule()
    def complete(self):
        self.device.complete()

    @rule(nbytes=st.none() | st.integers(1, 3 * MiB))
    def defragment(self, nbytes):
        self.pool.defragment(nbytes)

    def teardown(self):
        events = dumped(self.pool)
        errors, live_in_log = live_pointer_errors(events)
        assert errors == []
        assert live_in_log == {b.address: b.size for b in self.live}   # each where it is now
        history = numba_alloc.recorded_events(self.pool)
        assert sum(e.action == ALLOCATE for e in events) == sum(
            e.action in (ALLOC, MOVE) for e in history)
        report = numba_alloc.replay_trace(events, make_pool()[1])
        assert (report.unknown_frees, report.reused_addresses, report.failed_requests) == (0, 0, 0)
        assert report.allocations - report.frees == len(self.live)


TestDumpedHistoryWithMovesReplaysCleanly = DefragmentingPool.TestCase
TestDumpedHistoryWithMovesReplaysCleanly.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


class Fault(Exception):
    pass


def failing_on_call(call, number, exception, refused):
    """``call`` that raises ``exception`` on its ``number``-th use (from 1),
    appending the arguments it refused to ``refused``."""
    calls = [0]

    def wrapper(*args):
        calls[0] += 1
        if calls[0] == number:
            refused.append(args)
            raise exception
        return call(*args)
    return wrapper


def random_trace(rng, length):
    """Allocations, frees, reused and unknown pointers, recorded failures."""
    events = []
    for _ in range(length):
        action = rng.choice((ALLOCATE, ALLOCATE, DEALLOCATE, ALLOCATE_FAILURE))
        pointer = 0 if action == ALLOCATE_FAILURE else 0x1000 * rng.randrange(1, 12)
        size = rng.choice((rng.randrange(1, 64 * 1024), rng.randrange(MiB, 6 * MiB), 1 << 40))
        events.append(TraceEvent(0, 0.0, action, pointer, size, 0))
    return events


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32), length=st.integers(1, 40), where=st.sampled_from(
    ["malloc", "free"]), number=st.integers(1, 30),
       exception=st.sampled_from([Fault("injected"), KeyboardInterrupt(), MemoryError()]))
def test_a_replay_that_fails_anywhere_leaves_the_pool_as_it_was(seed, length, where, number,
                                                                 exception):
    pool, held = pool_with_live_blocks()
    before = current_stats(pool)
    refused = []
    setattr(pool, where, failing_on_call(getattr(pool, where), number, exception, refused))
    try:
        numba_alloc.replay_trace(random_trace(random.Random(seed), length), pool)
    except type(exception) as raised:
        assert raised is exception and refused
    else:
        assert not refused
    finally:
        delattr(pool, where)
    for (block,) in (refused if where == "free" else ()):
        if block.state == "allocated":      # the free that failed was the replay's last try
            pool.free(block)
            pool.synchronize()
    assert current_stats(pool) == before
    assert all(block.state == "allocated" for block in held)
    assert {b["address"] for s in pool.snapshot()["segments"] for b in s["blocks"]
            if b["state"] != "inactive"} == {block.address for block in held}
