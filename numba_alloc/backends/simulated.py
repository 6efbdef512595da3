"""A device simulated in host memory, for running the pool without a GPU.

Each segment is a zero-filled anonymous memory map viewed as a NumPy array
(the OS backs its pages only when they are written, so a large capacity costs
nothing until used).

Work is one FIFO queue, run as a GPU runs one stream: :meth:`SimulatedDevice.launch`
queues it; it runs when some thread completes it (:meth:`complete`, or
:meth:`synchronize` for everything queued before the call), one piece at a
time in queue order, whichever thread runs it. A piece counts as finished
only once it has returned (or raised), so an event completes, and
synchronize returns, only after all work queued before it has finished,
also while another thread is still running some of it. A defragmentation
copy is queued like any work and waited for. Thread safe.
"""

import mmap
import threading
import time
from bisect import bisect_right
from collections import deque

import numpy as np

from ..policy.backend import (BLOCKS_MOVED, BYTES_MOVED, COUNTERS, DEFRAGMENTATIONS,
                              LATE_MALLOC_HEAP, Backend, DeviceOutOfMemory, Event,
                              HostOutOfMemory)
from ..units import parse_size
from ..validate import as_flag, as_int
from .simulated_pages import NORESERVE, PAGE, SimulatedPages, byte_count

_BASE_ADDRESS = 0x7F00_0000_0000
_ALIGNMENT = PAGE           # segments start on page boundaries


class SimulatedEvent(Event):
    __slots__ = ("_device", "_ticket")

    def __init__(self, device):
        self._device = device
        self._ticket = 0

    def record(self):
        with self._device._lock:
            self._ticket = self._device._queued

    def query(self):
        return self._device._completed >= self._ticket


class SimulatedDevice(SimulatedPages, Backend):
    """A device of ``capacity`` bytes (an int, or a string such as ``"16GiB"``)
    whose memory lives in host RAM and whose out-of-memory comes at capacity;
    ``device_id``, the GPU number it stands for, is an int >= 0.

    ``holds_data=False`` makes a device of sizes only: no byte of it
    exists, so copies (a defragmentation's, a reclaim's) are queued and
    counted as on a GPU but move nothing, and reading, writing or viewing
    its memory raises RuntimeError. For replaying traces: the pool's host
    time is then its own, not that of hundreds of MiB copied through the
    host's caches (which a GPU copies on the device).

    ``write(address, data)`` and ``read(address, nbytes)`` reach any byte of a
    live segment or mapped page, like cuMemcpy; an address outside every
    segment and mapped page raises ValueError, as an illegal address would
    fault on a GPU. Unlike
    cuMemcpy they act at once, not behind the work queued before them: call
    :meth:`synchronize` first to see what queued work (a launch, a copy
    bringing a reclaimed block back) has written.
    """

    name = "simulated"
    #: Batches moving at most this many bytes run the Numba copy kernel under
    #: the CUDA simulator, as a GPU runs it (the tests do, to check it end to
    #: end); the others are copied by NumPy, with the same counting. 0 by
    #: default: the simulator runs one Python thread per GPU thread (1 MiB
    #: in one move takes it 0.25 s, 64 KiB in 512-byte moves 0.2 s), a cost
    #: that is the simulator's, not the pool's.
    kernel_limit = 0

    def __init__(self, capacity, device_id=0, holds_data=True):
        capacity = parse_size(capacity, "capacity")
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity}")
        device_id = as_int(device_id, "device_id", "an int >= 0")
        if device_id < 0:
            raise ValueError(f"device_id must be an int >= 0, got {device_id}")
        holds_data = as_flag(holds_data, "holds_data")
        self.capacity = capacity
        self.device_id = device_id
        self.holds_data = holds_data
        self._lock = threading.Lock()     # segments, the queue and its tickets
        self._running = threading.Lock()  # held while the device runs a piece of work
        self._running_thread = None       # the thread running a piece of work
        self._bases = []          # sorted segment base addresses
        self._sizes = {}          # base -> bytes of the segment there
        self._buffers = {}        # base -> np.ndarray(uint8), mapped on first access
        self._used = 0
        self._next_address = _BASE_ADDRESS
        self._work = deque()      # (ticket, callable or None), not yet started
        self._queued = 0          # tickets handed out
        self._completed = 0       # every piece up to this ticket has finished; only grows
        self.allocations = 0      # segments ever allocated
        self.releases = 0         # segments ever released
        # nanoseconds the host spent running the device's queued work (copies,
        # launches, memsets) and unmapping the host pages of released segments
        # that held data: what a GPU does on the device, not the host
        self.device_ns = 0
        self._counters = np.zeros(COUNTERS, dtype=np.int64)
        self._counts = (0,) * COUNTERS   # the counters when the last copy ended
        self._host_used = 0       # bytes of host buffers handed out
        self._ranges = {}         # base -> set of its mapped pages (indices): reserved address ranges
        self._maps = {}           # base -> the mmap under a range's buffer (to drop pages)
        self.mappings = 0         # map_pages calls that mapped
        self.unmappings = 0       # unmap_pages calls
        self.remappings = 0       # remap_pages calls that moved pages

    # -- Backend ---------------------------------------------------------
    def allocate(self, nbytes) -> int:
        nbytes = byte_count(nbytes, "nbytes", 1)
        with self._lock:
            if nbytes > self.capacity - self._used:
                raise DeviceOutOfMemory(
                    f"simulated device: {nbytes} bytes asked, "
                    f"{self.capacity - self._used} free")
            address = self._next_address
            self._next_address += -(-nbytes // _ALIGNMENT) * _ALIGNMENT
            self._sizes[address] = nbytes
            self._bases.insert(bisect_right(self._bases, address), address)
            self._used += nbytes
            self.allocations += 1
            return address

    def release(self, address) -> None:
        with self._lock:
            nbytes = None if address in self._ranges else self._sizes.pop(address, None)
            if nbytes is None:
                shown = f"{address:#x}" if isinstance(address, int) else repr(address)
                raise ValueError(f"release: address {shown} is not a live segment of "
                                 "the simulated device")
            buffer = self._buffers.pop(address, None)
            del self._bases[bisect_right(self._bases, address) - 1]
            self._used -= nbytes
            self.releases += 1
        if buffer is not None:
            # unmapping the host pages that held its data: the simulated
            # memory's own work, as the copies that mapped them are
            start = time.perf_counter_ns()
            del buffer
            with self._lock:
                self.device_ns += time.perf_counter_ns() - start

    def memory_info(self) -> tuple[int, int]:
        with self._lock:
            return self.capacity - self._used, self.capacity

    def event(self) -> "SimulatedEvent":
        return SimulatedEvent(self)

    def synchronize(self) -> None:
        """Return once all work queued before this call has finished."""
        self._refuse_inside_work("synchronize")
        with self._lock:
            last = self._queued
        self._finish(last)

    def copy(self, batches, first) -> None:
        """Queue the copy behind the work queued before it and wait for it;
        raises here what the copy raised."""
        self._refuse_inside_work("copy")
        failure = []

        def run_copy():
            try:
                self._copy(batches, first)
            except Exception as e:
                failure.append(e)
            finally:
                self._counts = tuple(int(c) for c in self._counters)

        self._finish(self._enqueue(run_copy))
        if failure:
            # taken out of the list, else error -> traceback -> this frame ->
            raise failure.pop()     # list -> error: a cycle keeping the callers' frames

    def _copy(self, batches, first):
        counters = self._counters
        for (dst_address, _), (src_address, _), table in batches:
            nbytes = int(table[:, 2].sum())
            if self.holds_data:
                with self._lock:
                    dst, src = self._from(dst_address), self._from(src_address)
                if nbytes <= self.kernel_limit:
                    from ..device import kernels    # imports numba.cuda: not before it runs
                    kernels.simulated_copy(dst, src, table, counters, first)
                    first = 0
                    continue
                for s, d, n in table.tolist():
                    dst[d:d + n] = src[s:s + n]
            # counted as the copy kernel counts (a device of sizes only moves nothing)
            counters[DEFRAGMENTATIONS] += first
            counters[BYTES_MOVED] += nbytes
            counters[BLOCKS_MOVED] += len(table)
            first = 0

    def move_counters(self) -> tuple[int, int, int]:
        """The counters as the last copy left them (the copy has finished)."""
        return self._counts

    # -- host memory (reclaim) ---------------------------------------------------
    reclaims = True
    host_capacity = None        #: bytes of host memory it may hand out (None: no cap)

    def host_allocate(self, nbytes, flags=0) -> np.ndarray:
        """A zeroed buffer of ``nbytes``, counted in :attr:`host_used` once
        it exists; HostOutOfMemory (nothing counted) past host_capacity or
        when the host cannot give the memory."""
        nbytes = byte_count(nbytes, "nbytes", 1)       # flags: no meaning here
        self._check_host_room(nbytes)
        try:
            buffer = np.zeros(nbytes, dtype=np.uint8)
        except (MemoryError, ValueError) as e:     # ValueError: more than NumPy can index
            raise HostOutOfMemory(f"simulated host: {nbytes} bytes asked: {e}") from None
        with self._lock:            # another thread may have taken the room meanwhile
            self._check_host_room(nbytes)
            self._host_used += nbytes
        return buffer

    def _check_host_room(self, nbytes):
        if self.host_capacity is not None and self._host_used + nbytes > self.host_capacity:
            raise HostOutOfMemory(f"simulated host: {nbytes} bytes asked, "
                                  f"{self.host_capacity - self._host_used} free")

    def host_release(self, buffer) -> None:
        with self._lock:
            self._host_used -= buffer.nbytes

    def copy_to_host(self, address, buffer, nbytes) -> None:
        source = self._device_bytes(address, nbytes)    # outside every segment: raises now

        def run():
            buffer[:nbytes] = source
        self._enqueue(None if source is None else run)

    def copy_from_host(self, buffer, address, nbytes) -> None:
        target = self._device_bytes(address, nbytes)

        def run():
            target[:] = buffer[:nbytes]
        self._enqueue(None if target is None else run)

    def _device_bytes(self, address, nbytes):
        """The view a copy to or from the host reads or writes, or None on a
        device of sizes only (the copy then moves nothing); ValueError for
        a range outside every live segment."""
        nbytes = byte_count(nbytes, "nbytes", 0)
        with self._lock:
            base, offset = self._segment_at(address, nbytes)
            return self._memory(base)[offset:offset + nbytes] if self.holds_data else None

    @property
    def host_used(self):
        """Bytes of host memory handed out by host_allocate and not released."""
        return self._host_used

    # -- the work queue ------------------------------------------------------
    # CUDA's device malloc heap: sized before the first kernel, as on CUDA
    _malloc_heap = 8 << 20
    _launched = False

    def malloc_heap_size(self) -> int | None:
        return self._malloc_heap

    def set_malloc_heap_size(self, nbytes) -> None:
        if self._launched:
            raise RuntimeError(LATE_MALLOC_HEAP + " (a kernel was launched on this "
                               "simulated device)")
        self._malloc_heap = byte_count(nbytes, "malloc_heap_size", 1)

    def launch(self, work=None) -> None:
        """Queue ``work`` (a callable taking no argument, or None for work
        that only occupies the device) behind everything queued before.
        Work must not wait for the device, nor for a lock that a thread
        waiting for the device holds (as a GPU host callback must not)."""
        if work is not None and not callable(work):
            raise TypeError(f"work must be a callable taking no argument, or None; got {work!r}")
        self._launched = True
        self._enqueue(work)

    def _enqueue(self, work):
        with self._lock:
            self._queued += 1
            self._work.append((self._queued, work))
            return self._queued

    def complete(self, count=None) -> None:
        """Run the next ``count`` pieces of queued work that no thread has
        started, one at a time in queue order (fewer when fewer are queued);
        when None, return once all work queued before this call has
        finished. What a piece raises is raised here, by the thread that ran
        it; the piece counts as finished and the device goes on."""
        self._refuse_inside_work("complete")
        if count is None:
            self.synchronize()
            return
        count = as_int(count, "count", "an int >= 0 or None")
        if count < 0:
            raise ValueError(f"count must be an int >= 0 or None, got {count}")
        for _ in range(count):
            if not self._run_next():
                return

    def _finish(self, last):
        """Run or wait for every piece of work up to ticket ``last``."""
        while self._completed < last:
            self._run_next(last)

    def _run_next(self, last=None):
        """Run the oldest piece of work no thread has started, if there is
        one (and its ticket is at most ``last``), after the piece another
        thread may be running. False when there was none to run."""
        with self._running:
            with self._lock:
                if not self._work or (last is not None and self._work[0][0] > last):
                    return False
                ticket, work = self._work.popleft()
            self._running_thread = threading.get_ident()
            start = time.perf_counter_ns()
            try:
                if work is not None:
                    work()
            finally:
                self._running_thread = None
                with self._lock:
                    self._completed = ticket
                    self.device_ns += time.perf_counter_ns() - start
        return True

    def _refuse_inside_work(self, call):
        if self._running_thread == threading.get_ident():
            raise RuntimeError(f"{call}() was called by work running on the simulated device: "
                               "device work cannot wait for the device")

    @property
    def pending_work(self):
        """Number of queued pieces of work that have not finished (one that
        is running included)."""
        with self._lock:
            return self._queued - self._completed

    # -- memory access --------------------------------------------------------
    def _memory(self, base):
        """The bytes of the segment at ``base`` (under the lock), mapped on
        first access: a segment nothing reads or writes costs no mapping.
        RuntimeError on a device of sizes only."""
        if not self.holds_data:
            raise RuntimeError("this simulated device holds no data (holds_data=False): "
                               "its memory cannot be read, written or viewed")
        buf = self._buffers.get(base)
        if buf is None:
            if base in self._ranges:    # private, so that dropped pages read as zeros
                backing = self._maps[base] = mmap.mmap(
                    -1, self._sizes[base], flags=mmap.MAP_PRIVATE | NORESERVE)
            else:
                backing = mmap.mmap(-1, self._sizes[base])
            buf = self._buffers[base] = np.frombuffer(backing, dtype=np.uint8)
        return buf

    def _from(self, address):
        """The bytes from ``address`` (a pool segment's: a segment of the
        device, or a run of mapped pages in a reserved range) to the end
        of what holds it (under the lock)."""
        base, offset = self._segment_at(address, 0)
        return self._memory(base)[offset:]

    def _segment_at(self, address, nbytes):
        """(base, offset) of ``nbytes`` at ``address`` inside one live
        segment (under the lock), or ValueError."""
        i = bisect_right(self._bases, address) - 1
        if i >= 0:
            base = self._bases[i]
            offset = address - base
            if offset + nbytes <= self._sizes[base] and self._mapped(base, offset, nbytes):
                return base, offset
        raise ValueError(
            f"address range [{address:#x}, {address + nbytes:#x}) is not inside "
            "one live segment or mapped range of the simulated device")

    def _locate(self, address, nbytes):
        with self._lock:
            base, offset = self._segment_at(address, nbytes)
            return self._memory(base), offset

    def write(self, address, data) -> None:
        """Copy ``data`` (bytes-like or array) to device memory at ``address``."""
        if isinstance(data, np.ndarray):
            src = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            src = np.frombuffer(data, dtype=np.uint8)
        buf, offset = self._locate(address, src.nbytes)
        buf[offset:offset + src.nbytes] = src

    def view(self, address, nbytes) -> np.ndarray:
        """A writable NumPy view (uint8) of ``nbytes`` of device memory at
        ``address``: what kernels under the CUDA simulator read and write."""
        nbytes = byte_count(nbytes, "nbytes", 0)
        buf, offset = self._locate(address, nbytes)
        return buf[offset:offset + nbytes]

    def read(self, address, nbytes) -> np.ndarray:
        """A copy of ``nbytes`` of device memory at ``address`` (uint8 array)."""
        nbytes = byte_count(nbytes, "nbytes", 0)
        buf, offset = self._locate(address, nbytes)
        return buf[offset:offset + nbytes].copy()

    def __repr__(self):
        return (f"SimulatedDevice(capacity={self.capacity}"
                + (")" if self.holds_data else ", holds_data=False)"))
