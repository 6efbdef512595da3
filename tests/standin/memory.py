"""The stand-in driver's memory: every allocation a device address may point
into, and the checks every call that takes an address makes.

Device memory is one address space, as on a GPU: allocations are ranges of
one reserved host mapping (pages are only backed once touched, and given
back when freed), at addresses from DEVICE_BASE up that are not reused until
the reserve has been gone through once, so that a freed address is
recognised as freed and not as someone else's block. A kernel's array may
run from one live allocation into another (:class:`Span`), as a pointer
may on a GPU. The driver's virtual memory management is there too: ranges
of addresses reserved with nothing behind them (cuMemAddressReserve),
physical allocations that count in the device's memory from their
creation (cuMemCreate) until released and unmapped, and mappings of one
into a reserved range, each a device allocation of its own (cuMemMap).
Pinned and managed
memory are real host memory (anonymous mappings) whose host address is also
their device address, as with unified addressing; memory pinned by
cuMemHostRegister is the caller's. Thread safe (one lock).
"""

import bisect
import ctypes
import itertools
import mmap
import threading

import numpy as np

DEVICE_BASE = 0x2000_0000_0000      # far from where hosts map their memory
ALIGN = 512                         # cuMemAlloc's alignment (CUDA's is 256 or more)
# the device address space reserved, in capacities: addresses are handed out
# upwards through it before any is reused
RESERVE_CAPACITIES = 64
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)     # Linux's value; Python 3.12 names it


class Allocation:
    """One allocation: ``kind`` 'device', 'host' (cuMemHostAlloc),
    'registered' (cuMemHostRegister) or 'managed'; ``serial`` tells apart
    two allocations that had the same address (host memory can be reused by
    the host's allocator)."""

    __slots__ = ("address", "size", "kind", "serial", "buffer", "mapped", "context", "alive",
                 "physical")

    def __init__(self, address, size, kind, serial, buffer, mapped, context, physical=None):
        self.address, self.size, self.kind, self.serial = address, size, kind, serial
        self.buffer, self.mapped, self.context, self.alive = buffer, mapped, context, True
        self.physical = physical    # the cuMemCreate handle of a cuMemMap mapping, else None

    def view(self, offset, nbytes):
        """A writable uint8 NumPy view of ``nbytes`` bytes from ``offset``;
        RuntimeError for a freed device allocation (its memory is gone)."""
        if self.kind == "device":
            if self.buffer is None:
                raise RuntimeError(f"{self!r} has no memory any more")
            return self.buffer[offset:offset + nbytes]
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(
            self.address + offset))

    def __repr__(self):
        state = "live" if self.alive else "freed"
        return f"<{state} {self.kind} allocation {self.address:#x}+{self.size} #{self.serial}>"


class Span:
    """A device range that starts in one live allocation and ends in another
    (a kernel's array over several, as one pointer may run across them on
    a GPU): ``first`` and ``last`` are those allocations; or one that runs
    through adjacent cuMemMap mappings, every one of them in ``parts``
    (what any call may take, as on a GPU)."""

    __slots__ = ("address", "size", "first", "last", "parts", "_memory")

    def __init__(self, address, size, first, last, memory, parts=()):
        self.address, self.size, self.first, self.last = address, size, first, last
        self.parts = tuple(parts) or (first, last)
        self._memory = memory

    @property
    def alive(self):
        return all(part.alive for part in self.parts)

    def view(self, offset, nbytes):
        """A writable uint8 view of the address space from ``offset``."""
        if not self.alive:
            raise RuntimeError(f"{self!r} has no memory any more")
        return self._memory.device_view(self.address + offset, nbytes)

    def __eq__(self, other):
        return (isinstance(other, Span) and (self.address, self.size) == (other.address, other.size)
                and len(self.parts) == len(other.parts)
                and all(a is b for a, b in zip(self.parts, other.parts)))

    def __hash__(self):
        return hash((self.address, self.size))

    def __repr__(self):
        return f"<span {self.address:#x}+{self.size} from {self.first!r} to {self.last!r}>"


class AddressError(Exception):
    """An address a call took is not inside a live allocation of the right
    kind; ``reason`` says what it is instead."""

    def __init__(self, address, nbytes, reason):
        super().__init__(f"{address:#x} (+{nbytes} bytes): {reason}")
        self.address, self.nbytes, self.reason = address, nbytes, reason


def _reserve(nbytes, least):
    """An anonymous mapping of ``nbytes`` (page-rounded) without swap
    reserved, or, where the host refuses so much (strict overcommit), of
    less, down to ``least``."""
    page = mmap.PAGESIZE
    while True:
        size = -(-nbytes // page) * page
        try:
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | MAP_NORESERVE)
        except OSError:
            if nbytes // 2 < least:
                raise
            nbytes //= 2


class Memory:
    """The address space of the stand-in: device allocations within
    ``capacity`` bytes, and the host memory the driver knows of."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._reserve = _reserve(RESERVE_CAPACITIES * max(capacity, 1 << 30), capacity)
        self._space = np.frombuffer(self._reserve, np.uint8)
        self._next = DEVICE_BASE
        self._serials = itertools.count(1)
        self._starts = []           # sorted start addresses of live allocations
        self._live = {}             # start -> Allocation
        self._freed = {}            # start -> the last Allocation freed there
        self._reserved = {}         # start -> size of the address ranges cuMemAddressReserve gave
        # cuMemCreate handle -> [size, times mapped, released, its bytes while unmapped
        # (None before its first unmap)]
        self._physical = {}
        self._handles = itertools.count(1)
        self.device_bytes = 0

    # -- allocating ------------------------------------------------------------
    def allocate_device(self, size, context):
        """A new device allocation of ``size`` bytes; None when the device
        has no room (the caller answers CUDA_ERROR_OUT_OF_MEMORY)."""
        with self._lock:
            if self.device_bytes + size > self.capacity:
                return None
            span = -(-max(size, 1) // ALIGN) * ALIGN
            address = self._next
            if address + span > DEVICE_BASE + len(self._space):
                address = self._first_gap(span)     # the reserve gone through: reuse
                if address is None:
                    return None
                self._space[address - DEVICE_BASE:address - DEVICE_BASE + size] = 0
            self._next = address + span
            offset = address - DEVICE_BASE
            self.device_bytes += size
            return self._add(address, size, "device", self._space[offset:offset + size],
                             False, context)

    def _first_gap(self, span, alignment=ALIGN):
        """The lowest device address (a multiple of ``alignment`` from
        DEVICE_BASE) with ``span`` bytes free of live allocations and
        reserved ranges, or None (under the lock)."""
        end = DEVICE_BASE + len(self._space)
        taken = sorted([(start, self._live[start].size) for start in self._starts
                        if start >= DEVICE_BASE] + list(self._reserved.items()))
        address = DEVICE_BASE
        for start, size in taken:
            if start >= end or start - address >= span:
                break
            after = start + -(-max(size, 1) // ALIGN) * ALIGN
            address = max(address, DEVICE_BASE + -(-(after - DEVICE_BASE) // alignment)
                          * alignment)
        return address if address + span <= end else None

    # -- virtual memory management ---------------------------------------------
    def reserve_addresses(self, size, alignment):
        """A new range of ``size`` device addresses, a multiple of
        ``alignment`` from DEVICE_BASE, with nothing behind them; None when
        the address space has no such range."""
        with self._lock:
            address = DEVICE_BASE + -(-(self._next - DEVICE_BASE) // alignment) * alignment
            if address + size > DEVICE_BASE + len(self._space):
                address = self._first_gap(size, alignment)
                if address is None:
                    return None
            self._next = max(self._next, address + size)
            self._reserved[address] = size
            return address

    def free_addresses(self, address, size):
        """Give back a reserved range (its start and size), nothing mapped
        in it; AddressError otherwise."""
        with self._lock:
            if self._reserved.get(address) != size:
                raise AddressError(address, size, "not a range cuMemAddressReserve gave "
                                   "(its start and its size)")
            i = bisect.bisect_left(self._starts, address)
            if i < len(self._starts) and self._starts[i] < address + size:
                raise AddressError(address, size, f"{self._live[self._starts[i]]!r} is still "
                                   "mapped in it")
            del self._reserved[address]

    def create_physical(self, size):
        """A handle of ``size`` bytes of device memory, counted in the
        device's use; None when the device has no room."""
        with self._lock:
            if self.device_bytes + size > self.capacity:
                return None
            self.device_bytes += size
            handle = next(self._handles)
            self._physical[handle] = [size, 0, False, None]
            return handle

    def release_physical(self, handle):
        """Release a handle: its memory goes back once no mapping of it is
        left; AddressError for a handle that is not live."""
        with self._lock:
            entry = self._physical.get(handle)
            if entry is None or entry[2]:
                raise AddressError(0, 0, f"handle {handle} is not a live cuMemCreate handle")
            entry[2] = True
            self._drop_physical(handle)

    def _drop_physical(self, handle):
        size, mapped, released, _ = self._physical[handle]
        if released and not mapped:
            del self._physical[handle]
            self.device_bytes -= size

    def map_physical(self, address, size, handle, context):
        """Map the whole of ``handle`` at ``address``, inside a reserved
        range where nothing is mapped: the mapping's Allocation (its bytes
        those the handle held when last unmapped, else zeros), or
        AddressError."""
        with self._lock:
            entry = self._physical.get(handle)
            if entry is None or entry[2] or entry[0] != size:
                raise AddressError(address, size, f"handle {handle} is not a live cuMemCreate "
                                   f"handle of {size} bytes")
            if not any(start <= address and address + size <= start + length
                       for start, length in self._reserved.items()):
                raise AddressError(address, size, "not inside a reserved range")
            if self._overlapping(address, size):
                raise AddressError(address, size, "overlaps a mapping")
            entry[1] += 1
            offset = address - DEVICE_BASE
            self._space[offset:offset + size] = 0 if entry[3] is None else entry[3]
            return self._add(address, size, "device", self._space[offset:offset + size], False,
                             context, handle)

    def unmap(self, address, size):
        """Remove the mapping at ``address`` of ``size`` bytes (its
        handle keeps its bytes for a later map until it is released);
        AddressError where there is none."""
        allocation = self._live.get(address)
        if allocation is None or allocation.physical is None or allocation.size != size:
            raise AddressError(address, size, "not a mapping of that size")
        held = self.device_view(address, size).copy()
        self.release(address, ("device",), mapping=True)
        with self._lock:
            self._physical[allocation.physical][1] -= 1
            self._physical[allocation.physical][3] = held
            self._drop_physical(allocation.physical)

    def device_view(self, address, nbytes):
        """The address space's bytes [address, address + nbytes)."""
        offset = address - DEVICE_BASE
        return self._space[offset:offset + nbytes]

    def allocate_host(self, size, mapped, context, kind="host"):
        """Real host memory, pinned: its address is its device address too
        (an anonymous mapping, zeroed and page-aligned as CUDA's)."""
        buffer = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE)
        address = ctypes.addressof(ctypes.c_uint8.from_buffer(buffer))
        with self._lock:
            return self._add(address, size, kind, buffer, mapped, context)

    def register_host(self, address, size, mapped, context):
        """Pin the caller's host memory [address, address + size)."""
        with self._lock:
            if self._overlapping(address, size):
                return None
            return self._add(address, size, "registered", None, mapped, context)

    def _add(self, address, size, kind, buffer, mapped, context, physical=None):
        allocation = Allocation(address, size, kind, next(self._serials), buffer, mapped,
                                context, physical)
        bisect.insort(self._starts, address)
        self._live[address] = allocation
        return allocation

    def release(self, address, kinds, mapping=False):
        """Free the allocation starting at ``address`` (one of ``kinds``; a
        cuMemMap mapping only when ``mapping``): the Allocation, or
        AddressError (not the start of a live one)."""
        with self._lock:
            allocation = self._live.get(address)
            if allocation is None or allocation.kind not in kinds:
                raise AddressError(address, 0, self._describe(address))
            if (allocation.physical is not None) != mapping:
                raise AddressError(address, 0, f"{allocation!r} is {'not ' * mapping}a "
                                   "cuMemMap mapping")
            del self._live[address]
            self._starts.pop(bisect.bisect_left(self._starts, address))
            allocation.alive = False
            self._freed[address] = allocation
            if allocation.kind == "device":
                if not mapping:             # a mapping's memory is its handle's
                    self.device_bytes -= allocation.size
                allocation.buffer = None
                # its whole pages back to the host (they read as zeros after)
                page = mmap.PAGESIZE
                start = -(-(address - DEVICE_BASE) // page) * page
                end = (address - DEVICE_BASE + allocation.size) // page * page
                if end > start:
                    self._reserve.madvise(mmap.MADV_DONTNEED, start, end - start)
            elif allocation.kind != "registered":
                # its pages back to the host; the mapping stays (reads as zeros), so
                # that its address is not handed out again while it is named freed
                allocation.buffer.madvise(mmap.MADV_DONTNEED)
            return allocation

    # -- finding ---------------------------------------------------------------
    def find(self, address, nbytes, device_access=True):
        """The live allocation holding [address, address + nbytes), checked:
        for ``device_access``, device memory, mapped host memory or managed
        memory. AddressError naming what the range is instead."""
        with self._lock:
            allocation = self._containing(address)
            if allocation is not None and allocation.physical is not None \
                    and address + nbytes > allocation.address + allocation.size:
                parts = self._adjacent_mappings(allocation, address + nbytes)
                if parts:
                    return Span(address, nbytes, parts[0], parts[-1], self, parts)
            if allocation is None or address + nbytes > allocation.address + allocation.size:
                raise AddressError(address, nbytes, self._describe(address, nbytes))
            if device_access and allocation.kind in ("host", "registered") \
                    and not allocation.mapped:
                raise AddressError(address, nbytes, f"in {allocation!r}, which is pinned but "
                                   "not mapped: the device cannot reach it")
            return allocation

    def find_span(self, address, nbytes):
        """:meth:`find` for a kernel's array, which may also run from one
        live device allocation into another: the Allocation, or a
        :class:`Span` of the two; AddressError for a range whose either end
        is not in live device memory."""
        try:
            return self.find(address, nbytes)
        except AddressError:
            with self._lock:
                first = self._containing(address)
                last = self._containing(address + nbytes - 1)
                if (first is None or last is None or first is last
                        or first.kind != "device" or last.kind != "device"):
                    raise
                return Span(address, nbytes, first, last, self)

    def _adjacent_mappings(self, first, end):
        """The cuMemMap mappings from ``first`` on, each starting where the
        one before ends, up to ``end``; None where one is missing (under
        the lock)."""
        parts = [first]
        while parts[-1].address + parts[-1].size < end:
            after = self._live.get(parts[-1].address + parts[-1].size)
            if after is None or after.physical is None:
                return None
            parts.append(after)
        return parts

    def holds_pinned(self, address, nbytes):
        """Whether host range [address, address + nbytes) is pinned memory
        (an async copy with it is asynchronous, as on a GPU)."""
        with self._lock:
            allocation = self._containing(address)
            return (allocation is not None and allocation.kind != "device"
                    and address + nbytes <= allocation.address + allocation.size)

    def range_of(self, address):
        """(base, size) of the live allocation holding ``address``."""
        allocation = self.find(address, 1, device_access=False)
        return allocation.address, allocation.size

    def _containing(self, address):
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        allocation = self._live[self._starts[i]]
        end = allocation.address + max(allocation.size, 1)
        return allocation if address < end else None

    def _overlapping(self, address, size):
        i = bisect.bisect_right(self._starts, address + size - 1) - 1
        if i < 0:
            return False
        allocation = self._live[self._starts[i]]
        return allocation.address + allocation.size > address

    def _describe(self, address, nbytes=0):
        """What ``address`` is, for an error message (under the lock)."""
        if address == 0:
            return "the null address (a parked or unset pointer)"
        allocation = self._containing(address)
        if allocation is not None:
            return (f"runs past the end of {allocation!r} (to {address + nbytes:#x}, which "
                    f"ends at {allocation.address + allocation.size:#x})")
        starts = sorted(self._freed)
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0:
            freed = self._freed[starts[i]]
            if address < freed.address + max(freed.size, 1):
                return f"inside {freed!r}"
        if any(start <= address < start + size for start, size in self._reserved.items()):
            return "in a reserved range of addresses where nothing is mapped"
        if address >= DEVICE_BASE:
            return "not inside any allocation the device made"
        return "host memory the driver does not know (not pinned, not mapped)"

    def live(self, kind="device"):
        """The live allocations of ``kind``."""
        with self._lock:
            return [a for a in self._live.values() if a.kind == kind]
