"""The stand-in driver's asynchronous work: streams, events, and the order
CUDA gives their work.

Queued work (a launch, an async copy or memset, an event's record point)
runs only when the host blocks on it: a synchronize of its stream, its
context (cuCtxSynchronize: "Blocks until the current context has completed
all preceding requested tasks"; no other context's) or an event recorded
after it, a synchronous call that CUDA orders after it (a copy or memset on
the default stream: the work its context's default stream follows; and
cuMemFree, cuMemFreeHost, cuMemHostUnregister and a primary context's reset,
below), or a test stepping the stand-in (:meth:`Queue.step`). A query never runs work: it answers from what has
run, as of a GPU that is as slow as it may be. Then a piece runs after
everything it depends on:

* the work queued before it on its stream;
* on the legacy default stream (handle 0 or CU_STREAM_LEGACY), the work
  queued before it on every blocking stream of its context; on a blocking
  stream, its context's legacy default stream's work queued before it
  (non-blocking streams order with neither). Every context has a legacy
  default stream of its own, and every thread's per-thread default stream
  (CU_STREAM_PER_THREAD, one per thread and context) is a blocking stream
  of its context, kept after its thread exits. CUDA's "Stream
  synchronization behavior" (driver API): "The legacy default stream is an
  implicit stream which synchronizes with all other streams in the same
  CUcontext except for non-blocking streams", "When an action is taken in
  the legacy stream ... the legacy stream first waits on all blocking
  streams, the action is queued in the legacy stream, and then all
  blocking streams wait on the legacy stream", and "The per-thread default
  stream is not a non-blocking stream and will synchronize with the legacy
  default stream if both are used in a program". Work of one context never
  orders work of another but through cuStreamWaitEvent;
* what its stream was told to wait for (cuStreamWaitEvent).

Handle 0, and the calls that take no stream (cuMemcpyHtoD, cuMemcpyDtoH,
cuMemcpyDtoD, cuMemsetD8), are the default stream: the legacy one, or in
per-thread mode (``Queue(per_thread_default=True)``: a program run with
CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1, which makes cuda-bindings
call the driver's per-thread-default-stream entry points) the calling
thread's per-thread default stream. CUDA's "Stream synchronization
behavior" (driver API): "The default stream, used when 0 is passed as a
cudaStream_t or by APIs that operate on a stream implicitly, can be
configured to have either legacy or per-thread synchronization behavior",
and "The per-thread default stream is an implicit stream local to both the
thread and the CUcontext, and which does not synchronize with other
streams (just like explicitly created streams)": a thread's stream-0 work
then follows the legacy stream's earlier work (and later legacy work
follows it), but not other threads' per-thread streams. CU_STREAM_LEGACY
is the legacy stream in either mode.

One piece of work runs at a time, on the thread that waited for it, whole:
the cyclic garbage collector is off while it runs, so that a finalizer it
would call (numba-cuda's deallocations, whose cuMemFree waits for the
device) cannot run later work in the middle of it; a wait from inside a
piece is refused and recorded. A piece that fails (an address no longer where it was, a kernel that raised)
is recorded in the stand-in's errors and answers the wait with
CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU's sticky error would surface there.
"""

import gc
import itertools
import threading

LEGACY = 1                  # CU_STREAM_LEGACY; handle 0 means it too (legacy mode)
PER_THREAD = 2              # CU_STREAM_PER_THREAD; handle 0 means it too (per-thread mode)
NON_BLOCKING = 1            # CU_STREAM_NON_BLOCKING


class WorkFailed(Exception):
    """Queued work that could not run as it was queued; already recorded."""


class Work:
    """One piece of queued work: ``run()`` does it (None: a marker, as an
    event's record point); ``deps`` must have run first."""

    __slots__ = ("serial", "stream", "context", "run", "deps", "done", "failed", "label",
                 "time")

    def __init__(self, serial, stream, context, run, deps, label):
        self.serial, self.stream, self.context = serial, stream, context
        self.run, self.deps = run, deps
        self.done = self.failed = False
        self.label, self.time = label, None

    def __repr__(self):
        state = "done" if self.done else "queued"
        return (f"<work #{self.serial} {self.label} on stream {self.stream:#x} of context "
                f"{self.context:#x}, {state}>")


class StreamState:
    __slots__ = ("handle", "blocking", "context", "last", "waits", "alive")

    def __init__(self, handle, blocking, context):
        self.handle, self.blocking, self.context = handle, blocking, context
        self.last, self.waits, self.alive = None, [], True


class EventState:
    __slots__ = ("handle", "timing", "context", "recorded", "alive")

    def __init__(self, handle, timing, context):
        self.handle, self.timing, self.context = handle, timing, context
        self.recorded, self.alive = None, True


class Queue:
    """Every stream and event of the stand-in, and their work;
    ``per_thread_default``: handle 0 is the calling thread's per-thread
    default stream (else the legacy one)."""

    def __init__(self, record_error, per_thread_default=False):
        self._record_error = record_error
        self.per_thread_default = per_thread_default
        self.lock = threading.RLock()       # the queue's state; work runs under it too
        self._serials = itertools.count(1)
        self._handles = itertools.count(0x5000, 0x10)
        self._clock = itertools.count(1)    # microseconds of the stand-in's GPU
        self.streams = {}                   # handle -> StreamState of the created streams
        self.legacy = {}                    # context -> StreamState of its legacy stream
        self.events = {}
        self.pending = []                   # work not yet run, in queue order
        # (thread, context) -> StreamState of that thread's per-thread default
        # stream in that context, every one made, while it may still order
        # work (the legacy stream waits for all of them, its thread alive or not)
        self.per_thread = {}
        self._running = None                # (the Work running now, its thread's ident)

    # -- streams and events ----------------------------------------------------
    def create_stream(self, flags, context):
        with self.lock:
            handle = next(self._handles)
            self.streams[handle] = StreamState(handle, not flags & NON_BLOCKING, context)
            return handle

    def destroy_stream(self, handle):
        """cuStreamDestroy: work already queued still runs (as CUDA does)."""
        with self.lock:
            state = self.streams.get(handle)
            if state is None:
                return False
            state.alive = False
            del self.streams[handle]
            return True

    def stream(self, handle, context):
        """The StreamState of ``handle`` (CU_STREAM_LEGACY: ``context``'s
        legacy default stream; CU_STREAM_PER_THREAD: this thread's in
        ``context``; 0: the default stream, one of them by the mode), or None."""
        handle = int(handle)
        if handle == 0 and self.per_thread_default:
            handle = PER_THREAD
        with self.lock:
            if handle in (0, LEGACY):
                state = self.legacy.get(context)
                if state is None:
                    state = self.legacy[context] = StreamState(LEGACY, True, context)
                return state
            if handle == PER_THREAD:
                key = (threading.current_thread(), context)
                state = self.per_thread.get(key)
                if state is None:
                    state = self.per_thread[key] = StreamState(next(self._handles), True,
                                                               context)
                return state
            return self.streams.get(handle)

    def create_event(self, flags, context):
        with self.lock:
            handle = next(self._handles)
            self.events[handle] = EventState(handle, not flags & 0x2, context)
            return handle

    def destroy_event(self, handle):
        with self.lock:
            state = self.events.pop(int(handle), None)
            if state is not None:
                state.alive = False
            return state is not None

    def forget_context(self, context):
        """A primary context's reset (its work run first): its streams and
        events are destroyed with it (CUDA: "Destroy all allocations and
        reset all state on the primary context"), so that a later use of
        their handles is refused."""
        with self.lock:
            for table in (self.streams, self.events):
                for handle in [h for h, state in table.items() if state.context == context]:
                    table.pop(handle).alive = False
            for key in [key for key in self.per_thread if key[1] == context]:
                self.per_thread.pop(key).alive = False
            legacy = self.legacy.pop(context, None)
            if legacy is not None:
                legacy.alive = False

    # -- queueing ----------------------------------------------------------------
    def enqueue(self, stream, run, label):
        """Queue ``run`` (None: a marker) on StreamState ``stream``."""
        with self.lock:
            deps = self._before(stream) + stream.waits
            stream.waits = []
            work = Work(next(self._serials), stream.handle, stream.context, run,
                        [d for d in deps if not d.done], label)
            stream.last = work
            self.pending.append(work)
            return work

    def _before(self, stream):
        """The work that work queued on ``stream`` now must follow (but what
        the stream was told to wait for): the stream's own, and on a legacy
        stream every blocking stream's of its context, on a blocking stream
        its context's legacy stream's."""
        deps = [stream.last] if stream.last is not None else []
        legacy = self.legacy.get(stream.context)
        if stream is legacy:
            deps += [s.last for s in self._all_streams()
                     if s.blocking and s.context == stream.context and s is not stream
                     and s.last is not None]
        elif stream.blocking and legacy is not None and legacy.last is not None:
            deps.append(legacy.last)
        return deps

    def _all_streams(self):
        """Every stream that may still order work: the created ones, every
        context's legacy one, and every thread's per-thread default stream
        (in every context), but for those of threads that exited with
        nothing queued there left to run (no later work can go there:
        dropped)."""
        gone = [key for key, state in self.per_thread.items()
                if not key[0].is_alive() and not state.waits
                and (state.last is None or state.last.done)]
        for key in gone:
            del self.per_thread[key]
        return (list(self.streams.values()) + list(self.legacy.values())
                + list(self.per_thread.values()))

    def wait_event(self, stream, event):
        """cuStreamWaitEvent: later work on ``stream`` waits for what
        ``event`` recorded (nothing if it recorded nothing)."""
        with self.lock:
            if event.recorded is not None and not event.recorded.done:
                stream.waits.append(event.recorded)

    def record(self, event, stream):
        with self.lock:
            event.recorded = self.enqueue(stream, None, f"record of event {event.handle:#x}")

    # -- running -------------------------------------------------------------------
    def finish(self, work):
        """Run ``work`` and everything it depends on; WorkFailed (already
        recorded) if a piece run now failed."""
        if work is None:
            return
        running = self._running
        if running is not None and running[1] == threading.get_ident():
            self._record_error("work", f"a wait for {work!r} from inside {running[0]!r}, "
                                       "which must run whole first")
            raise WorkFailed(running[0])
        failed = None
        with self.lock:
            stack = [work]
            while stack:
                top = stack[-1]
                if top.done:
                    stack.pop()
                    continue
                waiting = [d for d in top.deps if not d.done]
                if waiting:
                    stack.extend(waiting)
                    continue
                stack.pop()
                self._run(top)
                if top.failed and failed is None:
                    failed = top
        if failed is not None:
            raise WorkFailed(failed)

    def _run(self, work):
        if work.done:       # a finalizer run by a collection in finish() waited for it
            return
        work.done = True
        self.pending.remove(work)
        work.time = next(self._clock)
        if work.run is None:
            return
        collecting = gc.isenabled()
        gc.disable()
        self._running = (work, threading.get_ident())
        try:
            work.run()
        except WorkFailed:
            work.failed = True
        except Exception as e:      # noqa: BLE001 (recorded: the GPU's sticky error)
            work.failed = True
            self._record_error("work", f"{work!r} raised {type(e).__name__}: {e}")
        finally:
            self._running = None
            if collecting:
                gc.enable()

    def synchronize_stream(self, stream):
        self.finish(stream.last)

    def synchronize_context(self, context):
        """Everything queued so far in ``context`` (cuCtxSynchronize; a
        primary context's reset), and what it depends on."""
        self._finish_all(lambda work: work.context == context)

    def synchronize_all(self):
        """Everything queued so far, in every context (cuMemFree,
        cuMemFreeHost, cuMemHostUnregister: binding.py)."""
        self._finish_all(lambda work: True)

    def _finish_all(self, chosen):
        with self.lock:
            pending = [work for work in self.pending if chosen(work)]
        failed = None
        for work in pending:
            try:
                self.finish(work)
            except WorkFailed as e:
                failed = e
        if failed is not None:
            raise failed

    def before_synchronous_call(self, stream):
        """What a synchronous copy or memset on ``stream`` (the current
        context's default stream: its legacy one, or in per-thread mode the
        caller's per-thread one) waits for: what work queued there now
        follows (legacy: every blocking stream's work of its context; a
        per-thread stream: its own and its context's legacy stream's)."""
        with self.lock:
            lasts = self._before(stream)
        for work in lasts:
            self.finish(work)

    def step(self, count=1):
        """Run the ``count`` oldest pieces of queued work (and what they
        depend on); how many ran."""
        ran = 0
        for _ in range(count):
            with self.lock:
                if not self.pending:
                    break
                work = self.pending[0]
            try:
                self.finish(work)
            except WorkFailed:
                pass
            ran += 1
        return ran
