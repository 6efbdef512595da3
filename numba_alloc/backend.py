"""The small interface the pool policy needs from a device.

Two implementations: :class:`numba_alloc.cuda_backend.CudaDevice` (Numba's
driver bindings) and :class:`numba_alloc.simulated.SimulatedDevice` (host
memory). The pool calls a backend only under its own lock.
"""

from abc import ABC, abstractmethod


class DeviceOutOfMemory(Exception):
    """The backend could not allocate: the device has no room."""


class Event(ABC):
    """A marker in the device's work queue (on CUDA: an event recorded on the
    legacy default stream)."""

    @abstractmethod
    def record(self):
        """Mark the current end of the queue; completes once all work queued
        before this call has finished."""

    @abstractmethod
    def query(self):
        """True when the recorded point has been reached. Never blocks."""


class Backend(ABC):
    """A device the pool draws segments from. Sizes and addresses are ints in
    bytes."""

    device_id = 0
    name = "device"

    @abstractmethod
    def allocate(self, nbytes):
        """Reserve ``nbytes`` of device memory and return its address.
        Raises :class:`DeviceOutOfMemory` when the device has no room."""

    @abstractmethod
    def release(self, address):
        """Give back a segment that :meth:`allocate` returned."""

    @abstractmethod
    def memory_info(self):
        """``(free, total)`` device memory in bytes."""

    def headroom(self, free):
        """Bytes of the device's ``free`` memory an arena without a limit
        leaves to what runs beside the pool (the driver, module loads, other
        libraries): none here."""
        return 0

    @abstractmethod
    def event(self):
        """A new, unrecorded :class:`Event`."""

    @abstractmethod
    def synchronize(self):
        """Block until all work queued on the device has finished."""

    @abstractmethod
    def copy(self, batches, first):
        """Move bytes with the copy kernel (numba_alloc.kernels) and wait
        for it. ``batches``: (destination segment, source segment, table),
        each segment an (address, size) pair and the table an int64 array of
        rows (source offset, destination offset, length). ``first`` is 1 when
        this starts a defragmentation, else 0. Raises on a failed launch."""

    @abstractmethod
    def move_counters(self):
        """(defragmentations, bytes moved, blocks moved) as the copy kernels
        counted them in device memory (one device-to-host read)."""
