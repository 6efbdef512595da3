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


def test_mappings_in_a_reserved_range_are_one_memory_and_unmapped_pages_are_refused():
    """cuMemCreate counts in the device's memory from creation until it is
    released and unmapped; adjacent mappings are one range to any call; a
    page unmapped in the middle, a cuMemFree of a mapping, a range freed
    while mapped and addresses that were only reserved are refused."""
    page = 2 << 20
    space = Memory(8 << 20)
    base = space.reserve_addresses(4 * page, page)
    assert (base - DEVICE_BASE) % page == 0
    with pytest.raises(AddressError, match="reserved range of addresses where nothing is mapped"):
        space.find(base, 16)
    handles = [space.create_physical(page) for _ in range(4)]
    assert space.device_bytes == 8 << 20 and space.create_physical(page) is None
    parts = [space.map_physical(base + i * page, page, h, context=1)
             for i, h in enumerate(handles)]
    run = space.find(base + 100, 3 * page)
    assert isinstance(run, Span) and run.parts == tuple(parts)
    run.view(0, 3 * page)[:] = 4
    assert parts[1].view(0, 1)[0] == 4 and space.find_span(base + 100, 3 * page) == run
    with pytest.raises(AddressError, match="a cuMemMap mapping"):
        space.release(base, ("device",))                # cuMemFree of a mapping
    with pytest.raises(AddressError, match="still mapped"):
        space.free_addresses(base, 4 * page)
    space.unmap(base + page, page)
    assert not run.alive and space.device_bytes == 8 << 20     # the handle is not released
    with pytest.raises(AddressError, match="runs past the end"):
        space.find(base, 2 * page)
    space.release_physical(handles[1])
    assert space.device_bytes == 6 << 20
    space.release_physical(handles[0])                  # mapped still: its memory stays
    assert space.device_bytes == 6 << 20
    for i in (0, 2, 3):
        space.unmap(base + i * page, page)
    for h in handles[2:]:
        space.release_physical(h)
    assert space.device_bytes == 0
    space.free_addresses(base, 4 * page)
    with pytest.raises(AddressError, match="not a range cuMemAddressReserve gave"):
        space.free_addresses(base, 4 * page)
