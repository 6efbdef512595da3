"""Events of the real device: on the legacy default stream of a Numba
context (CudaEvent), and over every live context of the process
(AllContextsEvent: the host cache's pinned blocks serve every device).
Each call runs with its event's context current (:func:`current`).
"""

import contextlib

from numba.cuda.cudadrv.driver import CudaAPIError, binding, driver

from ..policy.backend import Event


def _event_done(handle):
    """Whether the event ``handle`` has completed. Calls the driver directly:
    Numba's wrapper logs every CUDA_ERROR_NOT_READY at ERROR level, and the
    pool polls its events often."""
    (status,) = binding.cuEventQuery(handle)
    if status == binding.CUresult.CUDA_SUCCESS:
        return True
    if status == binding.CUresult.CUDA_ERROR_NOT_READY:
        return False
    raise CudaAPIError(status, f"cuEventQuery: {status!r}")


class CudaEvent(Event):
    """A timing-free event recorded on the legacy default stream of the
    backend's context, which completes only after work queued before it on
    every blocking stream of that context (CUDA: one legacy stream a context)."""

    __slots__ = ("_backend", "_event", "_stream")

    def __init__(self, backend):
        self._backend = backend
        with backend.in_context():
            self._event = backend.context.create_event(timing=False)
        self._stream = backend.context.get_legacy_default_stream()

    def record(self):
        with self._backend.in_context():    # the legacy stream is the current context's
            self._event.record(self._stream)

    def query(self):
        return _event_done(self._event.handle)     # the event names its context

    def synchronize(self):
        """Wait until the recorded point has been reached."""
        with self._backend.in_context():
            self._event.synchronize()


@contextlib.contextmanager
def current(handle):
    """The context ``handle`` current inside the block: pushed, and popped
    after, when another context, or none, is current."""
    if int(driver.cuCtxGetCurrent()) == int(handle):
        yield
        return
    driver.cuCtxPushCurrent(handle)
    try:
        yield
    finally:
        driver.cuCtxPopCurrent()


def alive(context):
    """Whether the Numba ``context`` is still its device's primary context
    (Numba's reset releases it: its work and events are gone with it); a
    Context a third party made counts as alive."""
    device = getattr(context, "device", None)
    return getattr(device, "primary_context", context) is context


class OtherContextEvent:
    """A timing-free event of another Numba context, recorded on that
    context's legacy default stream."""

    __slots__ = ("_context", "_event")

    def __init__(self, context):
        self._context = context
        with current(context.handle):
            self._event = context.create_event(timing=False)

    def record(self):
        with current(self._context.handle):
            self._event.record(self._context.get_legacy_default_stream())

    def query(self):
        # a context reset since: its work is gone (done), its event destroyed (not asked)
        return not alive(self._context) or _event_done(self._event.handle)


class AllContextsEvent(Event):
    """An event on the legacy default stream of each of several contexts (a
    CudaEvent in the backend's own, one in each other live one: a legacy
    stream orders only its own context's streams). Completes once every part
    has (one whose context has been reset since counts as done). record()
    raises what the driver raises, the parts before the failing one recorded."""

    __slots__ = ("_parts",)

    def __init__(self, parts):
        self._parts = parts

    def record(self):
        for part in self._parts:
            part.record()

    def query(self):
        return all(part.query() for part in self._parts)
