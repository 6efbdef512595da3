"""The small interface the pool policy needs from a device.

Two implementations: :class:`numba_alloc.backends.cuda_device.CudaDevice` (Numba's
driver bindings) and :class:`numba_alloc.backends.simulated.SimulatedDevice` (host
memory). The pool calls a backend only under its own lock.
"""

import contextlib
import threading
from abc import ABC, abstractmethod

# the copy kernel's counters (numba_alloc.device.kernels): their places in its
# counters array and in the tuple move_counters() returns
DEFRAGMENTATIONS, BYTES_MOVED, BLOCKS_MOVED = 0, 1, 2
COUNTERS = 3


# why a malloc_heap_size comes too late (the backends' RuntimeError)
LATE_MALLOC_HEAP = ("malloc_heap_size: CUDA's device malloc heap can be sized only before "
                    "the first kernel of the context that uses device malloc (NRT's "
                    "np.empty inside kernels) has run; set it in NUMBA_ALLOC_CONF, or with "
                    "numba_alloc.configure() before launching kernels")


# why a backend whose device context is gone can no longer be used (Backend.check_alive)
CONTEXT_CLOSED = ("its CUDA context was closed (cuda.close(), or a reset of the device), which "
                  "released the pool's memory: this pool can no longer use the device; the "
                  "GPU's next use makes a new context, with a new pool")


# held while a backend's copy_session lock is made
_MAKING_SESSIONS = threading.Lock()


class DeviceOutOfMemory(Exception):
    """The backend could not allocate: the device has no room."""


class HostOutOfMemory(Exception):
    """The backend could not allocate pinned host memory."""


class PhaseCopyError(Exception):
    """Copies of phases (:meth:`Backend.start_copies`) failed: the first
    ``done`` phases completed; phase ``done`` may have run in part (a
    phase's copies leave its sources as they were), none after it ran.
    The backend's error is the ``__cause__``."""

    def __init__(self, done):
        super().__init__(f"the copies failed after {done} phases completed")
        self.done = done


class Event(ABC):
    """A marker in the device's work queue (on CUDA: an event recorded on the
    legacy default stream)."""

    @abstractmethod
    def record(self) -> None:
        """Mark the current end of the queue; completes once all work queued
        before this call has finished."""

    @abstractmethod
    def query(self) -> bool:
        """True when the recorded point has been reached. Never blocks."""


class Backend(ABC):
    """A device the pool draws segments from. Sizes and addresses are ints in
    bytes."""

    device_id = 0
    name = "device"
    scratch_bytes = 0   #: device memory the backend holds for itself, outside the segments
    #: False once the device context this backend serves is gone (CudaDevice:
    #: cuda.close(), or a reset of the device, released it; never here). Its
    #: pool's own figures stay readable (its snapshot's ``device`` is None);
    #: every call that needs the device raises :meth:`check_alive`'s error
    #: without reaching the driver.
    context_alive = True

    def check_alive(self) -> None:
        """Raise RuntimeError, naming the device and why (:data:`CONTEXT_CLOSED`),
        when :attr:`context_alive` is False."""
        if not self.context_alive:
            raise RuntimeError(f"{self.name} device {self.device_id}: {CONTEXT_CLOSED}")

    @abstractmethod
    def allocate(self, nbytes) -> int:
        """Reserve ``nbytes`` of device memory and return its address.
        Raises :class:`DeviceOutOfMemory` when the device has no room."""

    @abstractmethod
    def release(self, address) -> None:
        """Give back a segment that :meth:`allocate` returned."""

    @abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes."""

    def headroom(self, free) -> int:
        """Bytes of the device's ``free`` memory an arena without a limit
        leaves to what runs beside the pool (the driver, module loads, other
        libraries): none here."""
        return 0

    def session(self) -> contextlib.AbstractContextManager:
        """A context manager around a run of calls from one thread (a
        defragmentation, with its hundreds of releases): a backend may
        set up once what each call would (CudaDevice: its context made
        current). The code inside leaves the thread's current device
        context as it found it. Nothing here."""
        return contextlib.nullcontext()

    @abstractmethod
    def event(self) -> "Event":
        """A new, unrecorded :class:`Event`."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all work queued on the device has finished."""

    # -- every device's work: for pinned host memory, which any device's work
    # may read or write, whichever pool's cache it came from ---------------------
    def event_all_devices(self) -> "Event":
        """A new, unrecorded :class:`Event` whose record marks the work
        queued on every device of the process, this one's and the others'
        (on CUDA: every live context Numba knows). Here: :meth:`event`."""
        return self.event()

    def is_current(self) -> bool:
        """Whether work the calling thread queues on stream 0 now goes to
        this device, so that it follows the work queued before on this
        device's legacy default stream (on CUDA: this backend's context is
        the current one; another device's work does not follow it). Here:
        True (no other device)."""
        return True

    def synchronize_other_devices(self) -> None:
        """Block until the work queued on every other device of the process
        has finished (with :meth:`synchronize`: every device's). Here:
        nothing (no other device)."""

    @abstractmethod
    def copy(self, batches, first) -> None:
        """Move bytes with the copy kernel (numba_alloc.device.kernels) and wait
        for it. ``batches``: (destination segment, source segment, table),
        each segment an (address, size) pair and the table an int64 array of
        rows (source offset, destination offset, length). ``first`` is 1 when
        this starts a defragmentation, else 0. Raises on a failed launch."""

    def start_copies(self, phases, first) -> None:
        """Start copying ``phases`` (each a numba_alloc.policy.phase.Phase)
        behind all work queued before them, each phase after the one
        before it, and return: :meth:`finish_copies` waits for them, so
        that the caller's work overlaps the copies. ``first`` as copy's,
        for the first phase. PhaseCopyError when a phase cannot be started
        (the phases before it have completed when it is raised). Here: each
        phase copied and waited for in turn (copy, by its batches)."""
        for done, phase in enumerate(phases):
            try:
                self.copy(phase.batches(), first if done == 0 else 0)
            except Exception as e:
                raise PhaseCopyError(done) from e

    def finish_copies(self) -> None:
        """Wait for the copies :meth:`start_copies` started. PhaseCopyError
        when the device failed them, its ``done`` the phases they completed
        as the copy kernel's counters tell (0 when they cannot be read).
        Here: nothing to wait for (start_copies waited)."""

    def copy_session(self) -> contextlib.AbstractContextManager:
        """A reentrant lock of this backend that a pool holds from reading
        :meth:`move_counters` before its copies to reading them after:
        pools sharing a backend copy one at a time, so that each counts
        its own moves only. Made on first use, once."""
        lock = self.__dict__.get("_copy_session")
        if lock is None:
            with _MAKING_SESSIONS:
                lock = self.__dict__.setdefault("_copy_session", threading.RLock())
        return lock

    @abstractmethod
    def move_counters(self) -> tuple[int, int, int]:
        """(defragmentations, bytes moved, blocks moved) as the copy kernels
        counted them in device memory (one device-to-host read)."""

    # -- CUDA's device malloc heap (NRT's np.empty inside kernels) ----------------
    def malloc_heap_size(self) -> int | None:
        """Bytes of the device's malloc heap (CUDA's default: 8 MiB), which
        kernels' device-side malloc draws from, outside the pool; None for a
        device without one (here)."""
        return None

    def set_malloc_heap_size(self, nbytes) -> None:
        """Size the device's malloc heap; RuntimeError naming the
        malloc_heap_size setting once a kernel that uses it has run (the
        driver refuses it then)."""
        raise NotImplementedError(f"{type(self).__name__} has no device malloc heap")

    # -- host memory, for reclaiming blocks (the reclaim setting) ----------------
    reclaims = False    #: whether the methods below are implemented

    def host_allocate(self, nbytes, flags=0) -> object:
        """A buffer of ``nbytes`` of pinned host memory (for the copy of a
        reclaimed block, or the host cache's blocks, with ``flags`` the
        driver's cuMemHostAlloc flags): an opaque object for
        :meth:`copy_to_host`, :meth:`copy_from_host` and
        :meth:`host_release` (on CUDA its address). Raises
        :class:`HostOutOfMemory` when none can be had."""
        raise NotImplementedError(f"{type(self).__name__} cannot reclaim blocks to host memory")

    def host_release(self, buffer) -> None:
        """Give back a buffer from :meth:`host_allocate` (no copy into or out
        of it may still be running)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reclaim blocks to host memory")

    def copy_to_host(self, address, buffer, nbytes) -> None:
        """Queue a copy of ``nbytes`` at device ``address`` into ``buffer``
        behind all work queued before it (an event recorded after it
        completes once the copy has)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reclaim blocks to host memory")

    def copy_from_host(self, buffer, address, nbytes) -> None:
        """Queue a copy of ``nbytes`` of ``buffer`` to device ``address``
        behind all work queued before it; work queued after it sees the
        bytes."""
        raise NotImplementedError(f"{type(self).__name__} cannot reclaim blocks to host memory")

    # -- mapping pages under reserved addresses (the expandable_segments setting) ---
    page_size = 0       #: bytes of the pages the methods below map (0: not implemented)

    def reserve_addresses(self, nbytes) -> int:
        """Reserve ``nbytes`` (a multiple of :attr:`page_size`) of device
        addresses, no memory behind them (cuMemAddressReserve): the first
        address, a multiple of page_size. Raises DeviceOutOfMemory when no
        range that long is free."""
        raise NotImplementedError(f"{type(self).__name__} cannot map pages")

    def free_addresses(self, address) -> None:
        """Give back a range from :meth:`reserve_addresses`, every page of
        it unmapped."""
        raise NotImplementedError(f"{type(self).__name__} cannot map pages")

    def map_pages(self, address, nbytes) -> None:
        """Back ``nbytes`` at ``address`` (page-aligned, inside a reserved
        range, none of it mapped) with device memory, each page its own
        allocation (cuMemCreate, cuMemMap, cuMemSetAccess), so that any page
        can be unmapped alone. All or nothing: DeviceOutOfMemory, nothing
        mapped, when the device has no room for all of them."""
        raise NotImplementedError(f"{type(self).__name__} cannot map pages")

    def unmap_pages(self, address, nbytes) -> None:
        """Give back the memory of ``nbytes`` of mapped pages at ``address``
        (cuMemUnmap, cuMemRelease); their bytes are lost, the addresses stay
        reserved. No work still queued may use them."""
        raise NotImplementedError(f"{type(self).__name__} cannot map pages")

    def remap_pages(self, address, nbytes, to) -> None:
        """Move the memory behind ``nbytes`` of mapped pages at ``address``
        to ``to`` (page-aligned, in the same reserved range), where nothing
        is mapped but what the move itself leaves: each page's allocation
        is unmapped and mapped again at its new address (cuMemUnmap,
        cuMemMap, cuMemSetAccess), its bytes kept, nothing copied and no
        memory used. All or nothing: what the backend raises, every page
        as before. No work still queued may use them."""
        raise NotImplementedError(f"{type(self).__name__} cannot map pages")
