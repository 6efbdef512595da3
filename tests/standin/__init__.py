"""A checking stand-in for the CUDA driver, under numba-cuda's real driver
layer: with :func:`install` (before anything uses CUDA) numba-cuda's
Context, Device, memory managers, device arrays, streams, events and kernel
launches run unchanged over it, on a machine without a GPU.

* memory.py: device memory as one reserved host mapping, allocations
  ranges of it; every address a call takes is checked against the live
  allocations (a kernel's array may run from one into another) (a freed, null or foreign address
  is refused with the driver's error and recorded);
* work.py: asynchronous work: launches, async copies and memsets run only
  when something waits for them, and then check that every address they
  use is still in the allocation it was in when they were queued;
* binding.py: the ``cu*`` functions numba-cuda calls (cuda.bindings'
  convention, its real types and constants), recorded on request
  (:meth:`StandIn.recording`);
* core.py: what numba-cuda takes from cuda-core (compiled, calling the real
  driver): the device object, streams, module loading, the launch;
* kernels.py: kernels compile through NVVM and nvJitLink as on a GPU and run
  as their Python functions, on NumPy views of the stand-in's memory:
  compiled for the CPU where their threads are independent (cpu.py; kept on
  disk for the next process, cpu_cache.py), else under the CUDA simulator.

What it cannot show stays GPU-only: timing, device atomics' real
concurrency, NVML, IPC opened in another process, anything compiled that
reaches the driver (CuPy, RMM). Checked against numba-cuda 0.30: install()
refuses another major.minor.
"""

import contextlib
import os
import sys
import threading

from . import binding, core, kernels, memory, work

SUPPORTED_NUMBA_CUDA = ("0.30",)


class StandIn:
    """The installed stand-in: ``driver`` (its state: memory, queue,
    contexts, errors), ``binding`` (what numba-cuda calls)."""

    def __init__(self, capacity, devices, per_thread_default=False):
        self.memory = memory.Memory(capacity)
        self.driver = None
        self.queue = work.Queue(lambda call, message: self.driver.record_error(call, message),
                                per_thread_default)
        self.driver = binding.StandInDriver(self.memory, self.queue, devices)
        self.binding = binding.Binding(binding.make_functions(self.driver))
        self._restore = []

    @property
    def errors(self):
        """(call, message) of every refused call and failed piece of work."""
        return list(self.driver.errors)

    def step(self, count=1):
        """Run the ``count`` oldest pieces of queued work; how many ran."""
        return self.queue.step(count)

    @contextlib.contextmanager
    def recording(self):
        """Inside the block, every driver call is appended to the list it
        yields (binding.Call: name, args, values), in call order."""
        calls = self.driver.calls = []
        try:
            yield calls
        finally:
            self.driver.calls = None

    @property
    def pending(self):
        """Pieces of work queued and not yet run."""
        return len(self.queue.pending)

    def _patch(self, owner, name, value):
        self._restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)


_installed = None
_lock = threading.Lock()

PER_THREAD_DEFAULT_STREAM = "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"


def per_thread_default_from_environment():
    """Whether the program runs in per-thread default stream mode: what
    cuda-bindings reads of CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM when
    it loads the driver ("When set to 1, the default stream is the
    per-thread default stream. When set to 0, the default stream is the
    legacy default stream. This defaults to 0"; numba-cuda 0.30 leaves PTDS
    to it): an integer, non-zero for the per-thread mode."""
    value = os.environ.get(PER_THREAD_DEFAULT_STREAM, "").strip()
    try:
        return bool(int(value or "0"))
    except ValueError:
        raise RuntimeError(f"{PER_THREAD_DEFAULT_STREAM}={value!r}: cuda-bindings reads an "
                           "integer (1: the per-thread default stream)") from None


def install(capacity=8 << 30, devices=1):
    """Put the stand-in under numba-cuda (a GPU of ``capacity`` bytes, and
    ``devices`` of them), before any CUDA use in this process; handle 0 is
    the per-thread default stream when CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM
    says so now (read here, as cuda-bindings reads it when it loads).
    Returns the StandIn. RuntimeError under the CUDA simulator or on an unsupported
    numba-cuda."""
    global _installed
    import numba_cuda
    from numba.cuda import config
    if config.ENABLE_CUDASIM:
        raise RuntimeError("the driver stand-in runs numba-cuda's real driver layer: unset "
                           "NUMBA_ENABLE_CUDASIM")
    version = ".".join(numba_cuda.__version__.split(".")[:2])
    if version not in SUPPORTED_NUMBA_CUDA:
        raise RuntimeError(f"the driver stand-in was written against numba-cuda "
                           f"{SUPPORTED_NUMBA_CUDA}, not {numba_cuda.__version__}: check "
                           "what its driver layer calls and extend the stand-in")
    from cuda.bindings import driver as real_binding
    from cuda.core.utils import StridedMemoryView
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import devicearray, devices as numba_devices
    from numba.cuda.cudadrv import driver as numba_driver
    with _lock:
        if _installed is not None:
            return _installed
        standin = StandIn(capacity, devices, per_thread_default_from_environment())
        for module in list(sys.modules.values()):
            if getattr(module, "binding", None) is real_binding:
                standin._patch(module, "binding", standin.binding)
        standin._patch(numba_driver, "ExperimentalDevice",
                       lambda devnum: core.Device(standin, devnum))
        standin._patch(numba_driver, "ExperimentalStream", core.Stream)
        standin._patch(numba_driver, "load_module_image", core.load_module_image(standin))
        standin._patch(dispatcher, "launch", core.launch(standin))
        core.StridedMemoryView._real = StridedMemoryView
        standin._patch(devicearray, "StridedMemoryView", core.StridedMemoryView)
        standin._patch(devicearray, "Buffer", core.Buffer)
        driver = numba_driver.driver
        for name in [n for n in vars(driver) if n.startswith("cu")]:
            delattr(driver, name)           # functions bound to the real library
        driver.is_initialized, driver.initialization_error, driver.pid = False, None, None
        driver.devices.clear()
        numba_driver._ActiveContext._tls_cache.__dict__.pop("ctx_devnum", None)
        numba_devices._runtime.gpus.__dict__.pop("lst", None)  # a cached_property
        _installed = standin
        return standin


def installed():
    """The installed StandIn, or None."""
    return _installed


__all__ = ["StandIn", "install", "installed", "kernels"]
