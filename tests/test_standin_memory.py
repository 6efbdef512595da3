"""The driver stand-in's memory (tests/standin/memory.py): device memory is
one address space, so a kernel's array may run from one live allocation
into another, as on a GPU; addresses are reused only once the reserve has
been gone through, never over a live allocation."""

import pytest
from standin import memory
from standin.memory import DEVICE_BASE, AddressError, Memory, Span


def test_an_array_may_span_live_allocations_and_sees_their_bytes():
    space = Memory(16 << 20)
    a = space.allocate_device(4096, context=1)
    b = space.allocate_device(4096, context=1)
    a.view(0, 4096)[:] = 7
    b.view(0, 4096)[:] = 9
    span = space.find_span(a.address + 100, b.address + 200 - (a.address + 100))
    assert isinstance(span, Span) and span.first is a and span.last is b
    view = span.view(0, span.size)
    assert view[0] == 7 and view[-1] == 9
    view[-1] = 5                                   # one memory: the allocation sees it
    assert b.view(199, 1)[0] == 5
    assert space.find_span(a.address, 4096) is a   # inside one: that allocation
    space.release(b.address, ("device",))
    assert not span.alive
    with pytest.raises(AddressError, match="runs past the end"):
        space.find_span(a.address, b.address + 10 - a.address)   # it ends in freed memory
    with pytest.raises(RuntimeError, match="no memory any more"):
        span.view(0, 16)


def test_addresses_come_back_only_once_the_reserve_is_gone_through(monkeypatch):
    monkeypatch.setattr(memory, "RESERVE_CAPACITIES", 1)
    space = Memory(4 << 20)                        # a reserve of 1 GiB
    kept = space.allocate_device(1 << 20, context=1)
    kept.view(0, 16)[:] = 3
    seen = {kept.address}
    for _ in range(2200):                          # 1.1 GiB through, 512 KiB at a time
        block = space.allocate_device(512 << 10, context=1)
        assert block is not None and not kept.address <= block.address < kept.address + (1 << 20)
        seen.add(block.address)
        block.view(0, block.size)[:] = 0xFF
        space.release(block.address, ("device",))
    assert len(seen) < 2201                        # some came back ...
    assert min(seen) >= DEVICE_BASE and (kept.view(0, 16) == 3).all()   # ... none over a live one
    reused = space.allocate_device(4096, context=1)
    assert reused.address in seen and (reused.view(0, 4096) == 0).all()   # reused: zeros
