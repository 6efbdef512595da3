"""A device simulated in host memory, for running the pool without a GPU.

Each segment is a zero-filled anonymous memory map viewed as a NumPy array
(the OS backs its pages only when they are written, so a large capacity costs
nothing until used). Work is a
FIFO queue: :meth:`SimulatedDevice.launch` queues it, it runs when the device
completes it (:meth:`complete`, or :meth:`synchronize` for everything), and
an event completes once the work queued before it has run, as on a GPU.
Thread safe.
"""

import mmap
import threading
from bisect import bisect_right
from collections import deque

import numpy as np

from . import kernels
from .backend import Backend, DeviceOutOfMemory, Event
from .config import parse_size

_BASE_ADDRESS = 0x7F00_0000_0000
_ALIGNMENT = 2 << 20


class SimulatedEvent(Event):
    __slots__ = ("_device", "_ticket")

    def __init__(self, device):
        self._device = device
        self._ticket = 0

    def record(self):
        self._ticket = self._device._queued

    def query(self):
        return self._device._completed >= self._ticket


class SimulatedDevice(Backend):
    """A device of ``capacity`` bytes (an int, or a string such as ``"16GiB"``)
    whose memory lives in host RAM and whose out-of-memory comes at capacity.

    ``write(address, data)`` and ``read(address, nbytes)`` reach any byte of a
    live segment, like cuMemcpy; an address outside every segment raises
    ValueError, as an illegal address would fault on a GPU.
    """

    name = "simulated"
    #: Batches moving at most this many bytes run the Numba copy kernel under
    #: the CUDA simulator (one Python thread per GPU thread, so slow); larger
    #: ones are copied by NumPy, with the same counting.
    kernel_limit = 1 << 20

    def __init__(self, capacity, device_id=0):
        capacity = parse_size(capacity, "capacity")
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity}")
        self.capacity = capacity
        self.device_id = device_id
        self._lock = threading.Lock()
        self._bases = []          # sorted segment base addresses
        self._buffers = {}        # base -> np.ndarray(uint8)
        self._used = 0
        self._next_address = _BASE_ADDRESS
        self._work = deque()      # (ticket, callable or None)
        self._queued = 0          # tickets handed out
        self._completed = 0       # tickets finished
        self.allocations = 0      # segments ever allocated
        self.releases = 0         # segments ever released
        self._counters = np.zeros(kernels.COUNTERS, dtype=np.int64)

    # -- Backend ---------------------------------------------------------
    def allocate(self, nbytes):
        with self._lock:
            if nbytes > self.capacity - self._used:
                raise DeviceOutOfMemory(
                    f"simulated device: {nbytes} bytes asked, "
                    f"{self.capacity - self._used} free")
            address = self._next_address
            self._next_address += -(-nbytes // _ALIGNMENT) * _ALIGNMENT
            self._buffers[address] = np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
            self._bases.insert(bisect_right(self._bases, address), address)
            self._used += nbytes
            self.allocations += 1
            return address

    def release(self, address):
        with self._lock:
            buf = self._buffers.pop(address)
            del self._bases[bisect_right(self._bases, address) - 1]
            self._used -= buf.nbytes
            self.releases += 1

    def memory_info(self):
        return self.capacity - self._used, self.capacity

    def event(self):
        return SimulatedEvent(self)

    def synchronize(self):
        self.complete()

    def copy(self, batches, first):
        counters = self._counters
        for (dst_address, _), (src_address, _), table in batches:
            dst, src = self._buffers[dst_address], self._buffers[src_address]
            if int(table[:, 2].sum()) <= self.kernel_limit:
                kernels.simulated_copy(dst, src, table, counters, first)
            else:
                for s, d, n in table.tolist():
                    dst[d:d + n] = src[s:s + n]
                counters[kernels.DEFRAGMENTATIONS] += first
                counters[kernels.BYTES_MOVED] += int(table[:, 2].sum())
                counters[kernels.BLOCKS_MOVED] += len(table)
            first = 0

    def move_counters(self):
        return tuple(int(c) for c in self._counters)

    # -- the work queue ------------------------------------------------------
    def launch(self, work=None):
        """Queue ``work`` (a callable taking no argument, or None for work
        that only occupies the device) behind everything queued before."""
        with self._lock:
            self._queued += 1
            self._work.append((self._queued, work))

    def complete(self, count=None):
        """Run the oldest ``count`` queued pieces of work (all when None)."""
        while count is None or count > 0:
            with self._lock:
                if not self._work:
                    return
                ticket, work = self._work.popleft()
            if work is not None:
                work()
            self._completed = ticket
            if count is not None:
                count -= 1

    @property
    def pending_work(self):
        """Number of queued pieces of work that have not run."""
        return len(self._work)

    # -- memory access --------------------------------------------------------
    def _locate(self, address, nbytes):
        with self._lock:
            i = bisect_right(self._bases, address) - 1
            if i >= 0:
                base = self._bases[i]
                buf = self._buffers[base]
                offset = address - base
                if offset + nbytes <= buf.nbytes:
                    return buf, offset
        raise ValueError(
            f"address range [{address:#x}, {address + nbytes:#x}) is not inside "
            "one live segment of the simulated device")

    def write(self, address, data):
        """Copy ``data`` (bytes-like or array) to device memory at ``address``."""
        if isinstance(data, np.ndarray):
            src = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            src = np.frombuffer(data, dtype=np.uint8)
        buf, offset = self._locate(address, src.nbytes)
        buf[offset:offset + src.nbytes] = src

    def read(self, address, nbytes):
        """A copy of ``nbytes`` of device memory at ``address`` (uint8 array)."""
        buf, offset = self._locate(address, nbytes)
        return buf[offset:offset + nbytes].copy()

    def __repr__(self):
        return f"SimulatedDevice(capacity={self.capacity})"
