"""The CUDA backend's copies of live blocks (defragmentation): the copy
kernel loaded once a context, its launches of a defragmentation's phases,
and its counters.

A part of :class:`~numba_alloc.backends.cuda_device.CudaDevice`, which
makes the state used here: ``_scratch`` (device memory: the counters, the
idle header and the move tables), ``_words`` (it as int64), ``_counted``
and ``_counts`` (the counters, as move_counters returns them), ``_kernel``,
``_resident`` and ``copy_error``. Called under the pool's lock
(load_copy_kernel without it).
"""

import contextlib

import numpy as np
from numba.cuda.cudadrv.devices import _runtime
from numba.cuda.cudadrv.driver import binding, driver

from ..device import kernels
from ..policy.backend import BLOCKS_MOVED, BYTES_MOVED, DEFRAGMENTATIONS, PhaseCopyError
from ..policy.phase import Phase


class CudaCopies:
    """Loading and launching the copy kernel (numba_alloc.device.kernels)."""

    # while copies run: the counters once the first k phases have run whole, row k
    _started = None

    @property
    def copy_ready(self):
        """True once :meth:`load_copy_kernel` has loaded the copy kernel
        (and no context reset has unloaded it since)."""
        return self._kernel is not None

    def forget_copy_kernel(self):
        """The context's modules were unloaded (Numba's Context.reset):
        refuse to copy until :meth:`load_copy_kernel` loads a new one."""
        self._kernel = None

    def load_copy_kernel(self):
        """Compile the copy kernel (or read it from Numba's on-disk cache)
        and load it into this context by a launch that moves nothing, so
        that a defragmentation never compiles or loads a module. Call it
        without the pool's lock held (compiling takes Numba's compiler lock,
        which a thread may hold while it allocates) and before an arena
        takes the device's free memory. Returns None once loaded; on failure
        returns, and keeps in ``copy_error``, what compiling or loading
        raised (defragmentation is then refused naming it, and nothing is
        left to launch). A new context, one reset since (forget_copy_kernel)
        and a failed load get a new dispatcher (kernels.gpu_copy_moves says
        why); each call launches. A loaded kernel stays loaded while this
        runs: a defragmentation in another thread may be about to launch it.
        RuntimeError, nothing changed, once the context is gone
        (Backend.check_alive)."""
        self.check_alive()
        kernel, resident = self._kernel, self._resident
        try:
            with self._launching():
                new = kernel is None
                if new:
                    kernel = kernels.gpu_copy_moves()
                data = self._array(self._scratch, (kernels.WORD,), np.uint8)
                # the idle header: no moves, nothing counted, nothing written
                kernel[kernels.MIN_BLOCKS, 1](data, data, self._words, kernels.IDLE)
                if new:
                    resident = kernels.resident_blocks(kernel)
        except Exception as e:      # noqa: BLE001 -- reported through copy_error
            self._kernel = None
            self.copy_error = f"the copy kernel could not be loaded: {type(e).__name__}: {e}"
            return self.copy_error
        self._kernel, self._resident, self.copy_error = kernel, resident, None
        return None

    @contextlib.contextmanager
    def _launching(self):
        """This backend's context current for the block, for the driver and
        for Numba: a kernel launch takes its module from the context Numba
        has attached to the calling thread (the one of a Numba call under
        way, which may be another device's: a bring-back inside
        ``copy_to_host`` of this device's array, made while another device
        is current), not from the driver's current one."""
        with self.in_context():
            attached = _runtime._get_attached_context()
            _runtime._set_attached_context(self.context)
            try:
                yield
            finally:
                _runtime._set_attached_context(attached)

    def copy(self, batches, first):
        """Copy one phase and wait for it (start_copies, finish_copies);
        raises what the launch or the device raised. That error is raised
        outside the handler of the PhaseCopyError that wraps it (raised
        inside, it would take the PhaseCopyError, whose ``__cause__`` and
        ``__context__`` it is, as its own ``__context__``), and not held by
        this frame once raised: either would make a reference cycle that
        keeps every frame the error passed through, and all they hold,
        until the garbage collector runs."""
        phase = Phase.of_batches(batches)
        try:
            self.start_copies([phase] if len(phase.moves) else [], first)
            self.finish_copies()
            return
        except PhaseCopyError as e:
            error = e.__cause__
        try:
            raise error
        finally:
            error = None

    def start_copies(self, phases, first):
        """Launch every phase's copies, each phase's moves (between
        whatever segments) as one batch over the span of its segments
        (kernels.phase_span), a launch per LAUNCH_ROWS moves, each cut into
        CHUNKS_PER_BLOCK chunks per block the device holds at once and
        copied by no more blocks than that (kernels.launch_config), on
        numba-cuda's stream 0, which runs a phase's launches after the
        previous phase's: the phases' move tables go up in one upload
        where they fit in the scratch (a later upload, a synchronous
        cuMemcpyHtoD, waits for the launches before it), and nothing waits
        for the launches. Stream 0 is the legacy default stream, or, in a
        program run with CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1, the
        calling thread's per-thread default stream, where the launches and
        the uploads (the synchronous copies go there too) keep that order;
        either way they run between the device synchronization before the
        moves (defrag._quiesce_for_moves) and the one in finish_copies. The
        first upload also sets the kernel's counters to move_counters(), so
        that launches no read saw (a failed phase's, its read refused) are
        never counted. When an upload or a launch fails: the device waited
        for, then PhaseCopyError (the phases launched whole before it
        completed)."""
        kernel, resident = self._kernel, self._resident
        if kernel is None:
            raise RuntimeError("the copy kernel is not loaded: call load_copy_kernel() "
                               "without the pool's lock first")
        spans = [kernels.phase_span(phase) for phase in phases]
        self._started = _counts_by_phase(self._counts, first, spans)
        phase = 0
        with self._launching():
            try:
                memory = [self._array(base, (size,), np.uint8) for (base, size), _, _ in spans]
                target = (kernels.TARGET_CHUNKS if resident is None
                          else kernels.CHUNKS_PER_BLOCK * resident)
                # the first upload also sets the counters (and the idle header,
                # zeros) to self._started[0]: the kernel's may hold launches of
                # a failed phase that no read saw
                start = np.zeros(kernels.TABLE, np.int64)
                start[:kernels.COUNTERS] = self._started[0]
                uploads = kernels.launch_tables(spans, first, target_chunks=target)
                for number, (words, launches) in enumerate(uploads):
                    phase = launches[0][0]
                    if number == 0:
                        words = np.concatenate((start, words))
                    offset = 0 if number == 0 else kernels.TABLE * 8
                    # synchronous, behind the launches of the previous upload
                    driver.cuMemcpyHtoD(binding.CUdeviceptr(self._scratch + offset),
                                        words.ctypes.data, words.nbytes)
                    for phase, at, chunks in launches:
                        blocks, threads = kernels.launch_config(chunks, resident)
                        kernel[blocks, threads](memory[phase], memory[phase], self._words, at)
            except Exception as e:
                done = self._wait(phase)
                raise PhaseCopyError(phase if done is None else min(phase, done)) from e

    def finish_copies(self):
        """Wait for the copies start_copies launched and read the counters;
        PhaseCopyError when the device failed them (its ``done`` as the
        counters tell, 0 when they cannot be read)."""
        if self._started is None:
            return
        with self.in_context():
            try:
                self.context.synchronize()
            except Exception as e:
                done = self._wait(0)
                raise PhaseCopyError(0 if done is None else done) from e
            self._read_counters(len(self._started) - 1)

    def _wait(self, completed):
        """Wait for the device (its error ignored: the caller raises the
        first) and read the counters: :meth:`_read_counters`'s phases,
        ``completed`` as there. No copy still runs when this returns."""
        try:
            self.context.synchronize()
        except Exception:      # noqa: BLE001 - the caller raises the first error
            pass
        return self._read_counters(completed)

    def _read_counters(self, completed):
        """Read the counters once the copies have stopped (also after a
        failure: the pool counts a phase as the change over it, so what ran
        must be in the baseline): the phases completed, by the bytes moved
        since start_copies, or None when the counters cannot be read; they
        are then taken as the copy kernel counted the first ``completed``
        phases run whole (the phases the caller holds completed; the next
        start_copies sets the kernel's counters to that)."""
        counts, self._started = self._started, None
        try:
            driver.cuMemcpyDtoH(self._counted.ctypes.data, binding.CUdeviceptr(self._scratch),
                                self._counted.nbytes)
        except Exception:      # noqa: BLE001 - the caller raises the first error
            self._counts = tuple(counts[completed].tolist())
            return None         # (CUDA's errors are sticky)
        self._counts = tuple(self._counted.tolist())
        return int(np.searchsorted(counts[1:, BYTES_MOVED], self._counts[BYTES_MOVED], "right"))

    def move_counters(self):
        """The counters as read when the last copies completed or failed
        (the device was idle then), or, where that read failed, as the
        copy kernel counted the phases known to have completed (exact:
        the next copies start the kernel's counters from them), so that
        reading stats never waits for the GPU."""
        return self._counts


def _counts_by_phase(before, first, spans):
    """The copy kernel's counters from ``before`` once it has run the first
    k of the phases' ``spans`` (kernels.phase_span) whole, row k (int64):
    each launch adds its moves and their bytes, the first also ``first``."""
    counts = np.zeros((len(spans) + 1, len(before)), np.int64)
    counts[0] = before
    for k, (_, _, rows) in enumerate(spans, 1):
        counts[k, BYTES_MOVED] = rows[:, 2].sum()
        counts[k, BLOCKS_MOVED] = len(rows)
    if spans:
        counts[1, DEFRAGMENTATIONS] = first
    return np.cumsum(counts, axis=0)
