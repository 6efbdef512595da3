"""Expandable segments (the expandable_segments setting): the large pool's
segments as runs of pages mapped under one range of reserved addresses,
after PyTorch's ``expandable_segments``, with pages of the backend's page
size (2 MiB on the simulated device).

A request no free block serves maps the fewest pages that, with a free
block at the end of a segment beside them (or at the start of the next),
hold it; the run joins the segments it touches, so that a block may span
pages mapped at different times. Under pressure (the retry before out of
memory, the garbage-collection threshold, empty_cache) the whole pages
inside free blocks are unmapped, wherever they lie: a segment is cut in
two around them. So a free block stuck behind a long-lived one costs at
most the partial pages at its ends, not its segment. Each segment is a
mapped run: every invariant of a segment holds (its blocks tile it, its
bytes are reserved). The small pool keeps its 2 MiB segments.

A part of :class:`~numba_alloc.policy.pool.Pool`, under its lock.
"""

from collections import deque

from . import core as _core
from .backend import DeviceOutOfMemory
from .block import LARGE, Segment

# the reserved range holds this many times the device's memory (room to
# place runs where they join free blocks, whatever the free addresses'
# layout), and at most MOST_ADDRESSES (64 TiB: the addresses a GPU's 48 bits
# leave, and int64 sums of them in the core)
RANGE_OVER_DEVICE = 2
MOST_ADDRESSES = 1 << 46
# mappings an undone request may give back: one a block, for a request of
# several blocks (a bring-back); beyond, the oldest stay mapped, free and cached
MAPPINGS_KEPT = 256


class ExpandableSegments:
    """Mapping and unmapping the large pool's pages."""

    _range = None       # (address, bytes) of the reserved addresses, while in force
    # the pages mapped lately, the newest last, for an undone request to give
    # back (Segments._give_back_growth): (serial, address, bytes, what mapping
    # them and joining them to the free block before them changed in the
    # core's counters); the newest MAPPINGS_KEPT only, while in force
    _mappings = ()

    @property
    def maps_pages(self) -> bool:
        """Whether expandable segments are in force: large blocks lie in
        pages mapped under one reserved range."""
        return self._range is not None

    def _reserve_range(self, total):
        """Reserve the range for a device of ``total`` bytes when
        expandable_segments is in force (at the pool's first use): the
        longest the backend gives of RANGE_OVER_DEVICE times ``total`` (at
        most MOST_ADDRESSES), halved while it has no room for it, down to a
        page (a block the range cannot place gets a segment of its own).
        When it gives none, with ``auto`` the large pool takes whole
        segments (the range stays None); with true RuntimeError naming the
        setting. Raises what the backend raises but DeviceOutOfMemory."""
        page = self.backend.page_size
        nbytes = -(-min(RANGE_OVER_DEVICE * total, MOST_ADDRESSES) // page) * page
        while nbytes >= page:
            try:
                address = self.backend.reserve_addresses(nbytes)
            except DeviceOutOfMemory:
                nbytes = nbytes // 2 // page * page
                continue
            self._range = (address, nbytes)
            self._mappings = deque(maxlen=MAPPINGS_KEPT)
            return
        if self._settings.expandable_segments:
            raise RuntimeError(
                f"expandable_segments: {self.backend!r} reserves no range of device "
                f"addresses, not even one page of {page} bytes, for the pool's pages "
                "(use auto, which then takes whole segments, or false)")

    def _free_range(self):
        """Give the reserved range back (reset, every segment released)."""
        if self._range is not None:
            self.backend.free_addresses(self._range[0])
            self._range = None
            self._mappings = ()

    def _mapped(self, segment):
        """Whether ``segment`` is a run of pages of the reserved range."""
        r = self._range
        return r is not None and r[0] <= segment.address < r[0] + r[1]

    def _runs(self):
        """The mapped segments, by address."""
        return sorted((s for s in self._segments.values() if self._mapped(s)),
                      key=lambda s: s.address)

    # -- growing ---------------------------------------------------------------
    def _placement(self, size):
        """(pages, where to map them, where the block starts) of the fewest
        pages that serve a ``size``-byte block, the lowest address among
        equals; None when the range has no room (the block then gets a
        segment of its own, outside the range)."""
        page, p = self.backend.page_size, self._core.p
        base, length = self._range
        best = None
        left, left_tail = None, 0
        for right in self._runs() + [None]:
            low = left.address + left.size if left is not None else base
            high = right.address if right is not None else base + length
            head, right_tail = _core.edges(p, right.row) if right is not None else (0, 0)
            gap = (high - low) // page
            if gap:
                options = [(-(-(size - left_tail) // page), low, low - left_tail)]
                pages = -(-(size - head) // page)
                if pages < gap:
                    options.append((pages, high - pages * page, high - pages * page))
                if gap * page + left_tail + head >= size:
                    options.append((gap, low, low - left_tail))
                for option in options:      # (a free block that serves alone is take's)
                    if 0 < option[0] <= gap and (best is None or option[:2] < best[:2]):
                        best = option
            left, left_tail = right, right_tail
        return best

    def _grow_mapped(self, placement, size, kind, nbytes):
        """Serve a ``size``-byte large block by mapping the pages of
        ``placement`` (from :meth:`_placement`); None when the limit or the
        device has no room for them."""
        pages, address, block_at = placement
        nbytes_mapped = pages * self.backend.page_size
        if self.stats.current("reserved_bytes") + nbytes_mapped > self._limit:
            return None
        self._reserve(2)
        counters = self._counters()
        try:
            self.backend.map_pages(address, nbytes_mapped)
        except DeviceOutOfMemory:
            return None
        serial = self._segments_made
        run = self._new_run(address, nbytes_mapped)
        for observer in self._block_observers:
            observer.on_segment_alloc(self, run)
        row, seam = run.row, self._join_neighbours(run)
        self._mappings.append((serial, address, nbytes_mapped, self._counters() - counters))
        r = _core.TABLE + row * _core.NF
        mv = self._core.mv
        if mv[r + _core.STATE] != _core.FREE or mv[r + _core.ADDR] != block_at:
            row = seam         # the run joined the free block before it
        return self._handle(_core.take_row(self._core.p, row, size, kind, nbytes), nbytes)

    def _new_run(self, address, nbytes):
        """Index a newly mapped run of pages as a segment (never oversize:
        max_split_size_mb and expandable segments exclude each other)."""
        run = Segment(address, nbytes, LARGE, False, False, self._segments_made, mapped=True)
        self._segments_made += 1
        run.row = _core.add_segment(self._core.p, address, nbytes, LARGE, False, False)
        self._segments[address] = run
        self.stats.num_device_alloc += 1
        self._update_scarce_rules()
        return run

    def _join_neighbours(self, run):
        """Join ``run`` to the mapped segments that end where it begins and
        begin where it ends; the last row of the one before it, -1 when
        none."""
        seam = -1
        for segment in self._runs():
            if segment.address + segment.size == run.address:
                seam = self._join(segment, run)
                run = segment
            elif segment.address == run.address + run.size:
                self._join(run, segment)
                break
        return seam

    def _join(self, left, right):
        """Make ``right``, which begins where ``left`` ends, part of it;
        the last row ``left`` had."""
        last = _core.join(self._core.p, left.row, right.row)
        left.size += right.size
        left.serial = min(left.serial, right.serial)
        del self._segments[right.address]
        return last

    # -- moving runs ---------------------------------------------------------------
    def _move_run(self, run, to):
        """Move mapped segment ``run`` to the unmapped addresses at ``to``
        in the range by remapping its pages (backend.remap_pages: nothing
        copied, no memory used): its blocks keep their bytes and offsets,
        their handles follow (observers hear the new pages, each allocated
        block's move, then the old pages) and the reserved bytes stay.
        Every block must be movable (defrag's quiescing done). Raises what
        the backend raises (then nothing changed)."""
        old, nbytes = run.address, run.size
        self.backend.remap_pages(old, nbytes, to)
        # at both addresses while its rows change over: segment_of takes no lock
        self._segments[to] = run
        mv, delta = self._core.mv, to - old
        moved = []
        for row in self._core.rows_of(run):
            r = _core.TABLE + row * _core.NF
            mv[r + _core.ADDR] += delta
            mv[r + _core.SEG] = to
            if mv[r + _core.STATE] == _core.ALLOCATED:
                moved.append(row)
        run.address = to
        del self._segments[old]
        for mapping in [m for m in self._mappings if old <= m[1] < old + nbytes]:
            self._mappings.remove(mapping)      # its pages are elsewhere: no undo's to unmap
        # the pages the run now holds and those it left, as mappings
        mapped = (to, min(old, to + nbytes)) if delta < 0 else (max(to, old + nbytes), to + nbytes)
        left = (max(old, to + nbytes), old + nbytes) if delta < 0 else (old, min(to, old + nbytes))
        for observer in self._block_observers:
            observer.on_segment_alloc(self, Segment(mapped[0], mapped[1] - mapped[0], LARGE, False,
                                                    False, run.serial, mapped=True))
        blocks = [(block, block.address - delta) for row in moved
                  if (block := self._handle_of(row)) is not None]
        for observer in self._observers:
            for block, at in blocks:
                observer.on_move(self, block, at)
        if self.relocator is not None:
            self.relocator.relocated(self, blocks)
        for observer in self._block_observers:
            observer.on_segment_free(self, Segment(left[0], left[1] - left[0], LARGE, False,
                                                   False, run.serial, mapped=True))

    # -- unmapping -------------------------------------------------------------
    def _free_page_bytes(self):
        """Bytes of the whole pages inside the free blocks of mapped
        segments (what :meth:`_unmap_free_pages` can return)."""
        p, page = self._core.p, self.backend.page_size
        return sum(high - low for run in self._runs()
                   for _, low, high in _core.free_pages(p, run.row, page))

    def _unmap_free_pages(self, nbytes=None):
        """Unmap the whole pages inside free blocks of mapped segments,
        highest addresses first, until ``nbytes`` are unmapped (None: all);
        the bytes unmapped. A backend that fails an unmap ends it there:
        what was unmapped stays so, the rest as it was."""
        p, page = self._core.p, self.backend.page_size
        unmapped = 0
        for run in reversed(self._runs()):
            for row, low, high in reversed(_core.free_pages(p, run.row, page)):
                if nbytes is not None and unmapped >= nbytes:
                    return unmapped
                self._unmap(run, row, low, high)
                unmapped += high - low
        return unmapped

    def _unmap_growth(self, low, nbytes):
        """Unmap the pages [low, low + nbytes) mapped for an undone request
        (they lie in a free block again)."""
        high = low + nbytes
        mv = self._core.mv
        for run in self._runs():
            if run.address <= low < run.address + run.size:
                for row in self._core.rows_of(run):
                    r = _core.TABLE + row * _core.NF
                    if mv[r + _core.ADDR] <= low < mv[r + _core.ADDR] + mv[r + _core.SIZE]:
                        self._unmap(run, row, low, high)
                        return

    def _unmap(self, run, row, low, high):
        """Unmap the pages ``[low, high)`` of free ``row`` in ``run``: the
        whole segment, or a cut of it in two (or shorter)."""
        if low == run.address and high == run.address + run.size:
            self._release_segment(run)
            return
        self._reserve(1)
        self.backend.unmap_pages(low, high - low)
        end = run.address + run.size
        if high < end:
            # indexed before the cut makes its rows name it: segment_of takes no lock
            above = Segment(high, end - high, LARGE, False, False, run.serial, mapped=True)
            self._segments[high] = above
        head = _core.cut(self._core.p, row, low, high)
        if high < end:
            above.row = head
        if low > run.address:
            run.size = low - run.address
        else:
            del self._segments[run.address]
        stats = self.stats
        stats.num_device_free += 1
        stats.bytes_released += high - low
        self._update_scarce_rules()
        gone = Segment(low, high - low, LARGE, False, False, run.serial, mapped=True)
        for observer in self._block_observers:
            observer.on_segment_free(self, gone)
