"""The array-provider interface the workloads are written against, and the
record of what they allocate.

A workload asks an :class:`Arrays` for device arrays (:meth:`~Arrays.empty`,
:meth:`~Arrays.to_device`), launches kernels on them
(:meth:`~Arrays.launch`), reads results (:meth:`~Arrays.to_host`) and frees
every array it allocated (:meth:`~Arrays.free`). The provider times every
allocation and free on the host and keeps the live and peak-live bytes in its
:class:`AllocationLog`; it tells its probe (the memory manager's view) after
every allocation and at every :meth:`~Arrays.checkpoint` (time the probe
takes is left out of the wall time).

Implementations: :class:`kernels.gpu.CudaArrays` (``numba.cuda`` under the
process's memory manager) and :class:`kernels.simulated.SimulatedArrays`
(numba_alloc's pool on a simulated device).
"""

import contextlib
import time
from abc import ABC, abstractmethod

import numpy as np


class OutOfMemory(Exception):
    """The memory manager could not serve an allocation (it is counted)."""


class DeviceArray:
    """A workload's handle on one device array: ``shape``, ``dtype``,
    ``size``, ``nbytes``; ``data`` is the provider's own object (None once
    freed)."""

    __slots__ = ("shape", "dtype", "nbytes", "data", "serial")

    def __init__(self, shape, dtype, nbytes, data, serial):
        self.shape, self.dtype, self.nbytes = shape, dtype, nbytes
        self.data, self.serial = data, serial

    @property
    def size(self):
        return int(np.prod(self.shape))


class NoProbe:
    """A probe that watches nothing (warm-up runs, unit tests)."""

    def after_alloc(self):
        pass

    def checkpoint(self):
        pass


class AllocationLog:
    """Host nanoseconds of every allocation and free, the sizes allocated,
    each array's lifetime, live and peak-live bytes, and failed allocations."""

    def __init__(self):
        self.alloc_ns = []
        self.free_ns = []
        self.sizes = []         # bytes asked for, in allocation order
        self.lifetimes = []     # allocations made while each array lived, in free order
        self.live = 0
        self.peak_live = 0
        self.ooms = 0

    def allocated(self, ns, nbytes):
        self.alloc_ns.append(ns)
        self.sizes.append(nbytes)
        self.live += nbytes
        self.peak_live = max(self.peak_live, self.live)

    def freed(self, ns, array):
        self.free_ns.append(ns)
        self.lifetimes.append(len(self.sizes) - 1 - array.serial)
        self.live -= array.nbytes

    def summary(self):
        """The figures the benchmark reports (times in seconds and
        microseconds, sizes in bytes)."""
        alloc = np.asarray(self.alloc_ns, dtype=np.float64)
        p50, p99 = np.percentile(alloc, [50, 99]) / 1e3 if alloc.size else (0.0, 0.0)
        return {
            "allocs": len(self.alloc_ns),
            "frees": len(self.free_ns),
            "alloc_host_s": (sum(self.alloc_ns) + sum(self.free_ns)) / 1e9,
            "alloc_p50_us": float(p50),
            "alloc_p99_us": float(p99),
            "peak_live": self.peak_live,
            "live_at_end": self.live,
            "smallest_alloc": min(self.sizes, default=0),
            "largest_alloc": max(self.sizes, default=0),
            "ooms": self.ooms,
        }


class Arrays(ABC):
    """Device arrays for a workload. ``computes`` is False for a provider
    that replays allocations without data: its :meth:`to_host` returns None
    and workloads then skip their checks, so a workload's allocation sequence
    must not depend on device data."""

    computes = True

    def __init__(self, probe=None):
        self.log = AllocationLog()
        self.probe = probe or NoProbe()
        self.untimed_ns = 0
        self._untimed_depth = 0

    # -- what workloads call ---------------------------------------------------
    def empty(self, shape, dtype=np.float32):
        """A new uninitialized array. Raises :class:`OutOfMemory` (after
        counting it) when the memory manager cannot serve it."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        shape = tuple(int(n) for n in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        start = time.perf_counter_ns()
        try:
            data = self._allocate(shape, dtype, nbytes)
        except Exception as error:
            if not self._is_out_of_memory(error):
                raise
            self.log.ooms += 1
            raise OutOfMemory(f"{nbytes} bytes: {error}") from error
        elapsed = time.perf_counter_ns() - start
        array = DeviceArray(shape, dtype, nbytes, data, len(self.log.sizes))
        self.log.allocated(elapsed, nbytes)
        with self.untimed():
            self.probe.after_alloc()
        return array

    def to_device(self, host):
        """A new array holding a copy of the NumPy array ``host`` (only the
        allocation is timed)."""
        host = np.ascontiguousarray(host)
        array = self.empty(host.shape, host.dtype)
        self._copy_in(array, host)
        return array

    def free(self, array):
        """Release ``array``; using it afterwards is an error."""
        if array.data is None:
            raise ValueError("array freed twice")
        start = time.perf_counter_ns()
        self._release(array)
        elapsed = time.perf_counter_ns() - start
        self.log.freed(elapsed, array)

    @abstractmethod
    def launch(self, kernel, shape, *args):
        """Run ``kernel`` (a plain function of :mod:`kernels.linalg`'s
        kind) over a grid covering ``shape`` (an int or a 2-tuple);
        ``args`` are DeviceArrays and scalars."""

    @abstractmethod
    def to_host(self, array):
        """A NumPy copy of ``array`` after the work queued before it (None
        when the provider does not compute)."""

    @abstractmethod
    def synchronize(self):
        """Wait for all queued work."""

    def checkpoint(self):
        """The end of a workload step: the probe samples the manager."""
        with self.untimed():
            self.probe.checkpoint()

    @contextlib.contextmanager
    def untimed(self):
        """Host-only work (the probe's readings, preparing references,
        checking results): its time is left out of the workload's wall
        time. No allocation inside."""
        self._untimed_depth += 1
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self._untimed_depth -= 1
            if not self._untimed_depth:         # nested sections count once
                self.untimed_ns += time.perf_counter_ns() - start

    # -- what providers implement --------------------------------------------
    @abstractmethod
    def _allocate(self, shape, dtype, nbytes):
        """The provider's array object for a new allocation."""

    @abstractmethod
    def _release(self, array):
        """Free ``array.data`` and set it to None."""

    @abstractmethod
    def _copy_in(self, array, host):
        """Copy ``host`` into ``array`` (stream-ordered)."""

    @abstractmethod
    def _is_out_of_memory(self, error):
        """True when ``error`` from :meth:`_allocate` means out of memory."""
