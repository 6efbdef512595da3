"""The simulated device's pages mapped under reserved addresses (the
Backend's page mapping, for the expandable_segments setting): a mixin of
:class:`~numba_alloc.backends.simulated.SimulatedDevice`, whose lock, segment
table (``_bases``, ``_sizes``), buffers and capacity it shares. A reserved
range is listed as a segment of the device, with the set of its mapped
pages in ``_ranges``; its bytes count in the device's use only while
mapped. Thread safe, under the device's lock."""

import mmap
import time
from bisect import bisect_right

from ..policy.backend import DeviceOutOfMemory
from ..validate import as_int

PAGE = 2 << 20
NORESERVE = getattr(mmap, "MAP_NORESERVE", 0)    # Python 3.13 on


def byte_count(value, name, least):
    """``value`` as an int of at least ``least`` bytes, or TypeError/ValueError."""
    value = as_int(value, name, "an int number of bytes")
    if value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value}")
    return value


class SimulatedPages:
    """reserve_addresses, free_addresses, map_pages, unmap_pages and
    remap_pages of the simulated device (see Backend), pages of PAGE bytes."""

    page_size = PAGE

    def reserve_addresses(self, nbytes) -> int:
        nbytes = byte_count(nbytes, "nbytes", 1)
        if nbytes % self.page_size:
            raise ValueError(f"nbytes must be a multiple of the page size {self.page_size}, "
                             f"got {nbytes}")
        with self._lock:
            address = self._next_address
            self._next_address += nbytes
            self._sizes[address] = nbytes
            self._bases.insert(bisect_right(self._bases, address), address)
            self._ranges[address] = set()
            return address

    def free_addresses(self, address) -> None:
        with self._lock:
            pages = self._ranges.get(address)
            if pages is None or pages:
                raise ValueError(f"free_addresses: {address!r} is not a reserved range "
                                 "of the simulated device with every page unmapped")
            del self._ranges[address], self._sizes[address]
            del self._bases[bisect_right(self._bases, address) - 1]
            self._buffers.pop(address, None)
            self._maps.pop(address, None)

    def _pages(self, address, nbytes):
        """(page flags of the range, first page, pages) of a page-aligned
        ``nbytes`` at ``address`` inside one reserved range, or ValueError."""
        nbytes = byte_count(nbytes, "nbytes", 1)
        if address % self.page_size or nbytes % self.page_size:
            raise ValueError(f"[{address:#x}, +{nbytes}) is not page-aligned "
                             f"({self.page_size} bytes)")
        i = bisect_right(self._bases, address) - 1
        base = self._bases[i] if i >= 0 else None
        if base not in self._ranges or address + nbytes > base + self._sizes[base]:
            raise ValueError(f"[{address:#x}, +{nbytes}) is not inside a reserved range "
                             "of the simulated device")
        return base, (address - base) // self.page_size, nbytes // self.page_size

    def map_pages(self, address, nbytes) -> None:
        with self._lock:
            base, first, count = self._pages(address, nbytes)
            if nbytes > self.capacity - self._used:
                raise DeviceOutOfMemory(
                    f"simulated device: {nbytes} bytes of pages asked, "
                    f"{self.capacity - self._used} free")
            pages, wanted = self._ranges[base], range(first, first + count)
            if not pages.isdisjoint(wanted):
                raise ValueError(f"map_pages: a page of [{address:#x}, +{nbytes}) is mapped")
            pages.update(wanted)
            self._used += nbytes
            self.mappings += 1

    def unmap_pages(self, address, nbytes) -> None:
        with self._lock:
            base, first, count = self._pages(address, nbytes)
            pages = self._ranges[base]
            if count > len(pages) or not pages.issuperset(range(first, first + count)):
                raise ValueError(f"unmap_pages: a page of [{address:#x}, +{nbytes}) "
                                 "is not mapped")
            pages.difference_update(range(first, first + count))
            self._used -= nbytes
            self.unmappings += 1
            backing = self._maps.get(base)
        if backing is not None:     # the pages' bytes are lost, as on a GPU
            start = time.perf_counter_ns()
            backing.madvise(mmap.MADV_DONTNEED, address - base, nbytes)
            with self._lock:
                self.device_ns += time.perf_counter_ns() - start

    def remap_pages(self, address, nbytes, to) -> None:
        with self._lock:
            base, first, count = self._pages(address, nbytes)
            if self._pages(to, nbytes)[0] != base:
                raise ValueError(f"remap_pages: [{to:#x}, +{nbytes}) is not in the range of "
                                 f"[{address:#x}, +{nbytes})")
            pages, moved = self._ranges[base], range(first, first + count)
            if count > len(pages) or not pages.issuperset(moved):
                raise ValueError(f"remap_pages: a page of [{address:#x}, +{nbytes}) "
                                 "is not mapped")
            start = first + (to - address) // self.page_size
            if not (pages - set(moved)).isdisjoint(range(start, start + count)):
                raise ValueError(f"remap_pages: a page of [{to:#x}, +{nbytes}) is mapped")
            pages.difference_update(moved)
            pages.update(range(start, start + count))
            self.remappings += 1
            backing = self._maps.get(base)
        if backing is not None:     # the pages' bytes go with them; those left read as zeros
            start = time.perf_counter_ns()
            backing.move(to - base, address - base, nbytes)
            low, high = ((max(address, to + nbytes), address + nbytes) if to < address
                         else (address, min(to, address + nbytes)))
            if high > low:
                backing.madvise(mmap.MADV_DONTNEED, low - base, high - low)
            with self._lock:
                self.device_ns += time.perf_counter_ns() - start

    def _mapped(self, base, offset, nbytes):
        """Whether ``nbytes`` at ``offset`` of the segment or reserved range
        at ``base`` are device memory: in a range, every page they touch is
        mapped."""
        pages = self._ranges.get(base)
        if pages is None:
            return True
        first, end = offset // self.page_size, -(-(offset + nbytes) // self.page_size)
        return end - first <= len(pages) and pages.issuperset(range(first, end))
