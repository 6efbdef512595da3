"""What the device heap's functions need of ``cuda`` under the CUDA
simulator, which lacks it: atomics that share one lock (the simulator locks
each kind of operation apart, so its ``add`` and ``cas`` on one element
race each other) and the warp-level primitives (activemask, ballot_sync,
match_any_sync, shfl_sync, shfl_up_sync, syncwarp), gathered from the
simulator's threads."""

import collections
import sys
import threading
import time

WARP = 32                           # lanes of a warp


class _SimulatorAtomics:
    """The atomics the heap uses, for the CUDA simulator, under one lock:
    the simulator's own lock each kind of operation separately, so that its
    ``add`` and ``cas`` on one element race each other."""

    def __init__(self):
        self._lock = threading.Lock()

    def add(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = old + value
        return old

    def max(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = max(old, value)
        return old

    def or_(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = old | value
        return old

    def and_(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = old & value
        return old

    def exch(self, array, index, value):
        with self._lock:
            old = array[index]
            array[index] = value
        return old

    def cas(self, array, index, expected, value):
        with self._lock:
            old = array[index]
            if old == expected:
                array[index] = value
        return old


class _Gathering:
    """Lanes of one warp that reached one activemask() call site together,
    and the values their later ``*_sync`` calls exchange."""

    __slots__ = ("lanes", "deadline", "closed", "slots", "calls")

    def __init__(self, deadline):
        self.lanes, self.deadline, self.closed = 0, deadline, False
        self.slots = {}         # (mask, n-th call with that mask) -> {lane: value}
        self.calls = {}         # (lane, mask) -> calls made


class _SimulatorWarps:
    """Warp-level primitives for the CUDA simulator, which has none: each
    simulated thread is a Python thread, lane ``thread_id % 32`` of warp
    ``thread_id // 32`` of its block.

    ``activemask()`` gathers the lanes of the warp that reach the same call
    site (the caller's code and line) until every lane of the warp not
    known to have ended has, or for at most WINDOW seconds (a lane elsewhere
    or gone is then left out, as a diverged lane is on a GPU). A ``*_sync(mask, ...)`` call is a
    rendezvous of exactly the lanes of ``mask`` within the caller's last
    gathering, as CUDA requires of kernels (every lane of ``mask`` makes the
    same call). Group sizes seen are kept in ``group_sizes`` for tests."""

    WINDOW = 0.05
    STUCK = 60.0                # s: a *_sync whose lanes never all arrive raises

    def __init__(self):
        self._cond = threading.Condition()
        self._open = {}
        self._local = threading.local()
        self._threads = {}      # (launch, block, thread id) -> the thread, once it gathered
        self.group_sizes = collections.Counter()

    def _expected_lanes(self, launch, block, warp):
        """The lanes of a warp not known to have ended."""
        x, y, z = launch._block_dim
        lanes = 0
        for tid in range(warp * WARP, min(warp * WARP + WARP, x * y * z)):
            thread = self._threads.get((launch, block, tid))
            if thread is None or thread.is_alive():
                lanes |= 1 << (tid % WARP)
        return lanes

    def laneid(self):
        return threading.current_thread().thread_id % WARP

    def activemask(self):
        thread = threading.current_thread()
        launch, tid = thread._manager, thread.thread_id
        block = (thread.blockIdx.x, thread.blockIdx.y, thread.blockIdx.z)
        warp, lane = tid // WARP, tid % WARP
        frame = sys._getframe(1)      # the caller: heap_malloc or heap_free
        key = (launch, block, warp, frame.f_code, frame.f_lineno)
        with self._cond:
            if len(self._threads) > 100_000:
                self._threads.clear()
            self._threads[(launch, block, tid)] = thread
            g = self._open.get(key)
            if g is None:
                g = self._open[key] = _Gathering(time.monotonic() + self.WINDOW)
            g.lanes |= 1 << lane
            while not g.closed:
                expected = self._expected_lanes(launch, block, warp)
                left = g.deadline - time.monotonic()
                if g.lanes & expected == expected or left <= 0:
                    g.closed = True
                    if self._open.get(key) is g:
                        del self._open[key]
                    self.group_sizes[bin(g.lanes).count("1")] += 1
                    self._cond.notify_all()
                    break
                self._cond.wait(min(left, 0.005))
        self._local.group = g
        return g.lanes

    def _exchange(self, mask, value):
        lane = self.laneid()
        g = self._local.group
        with self._cond:
            n = g.calls.get((lane, mask), 0)
            g.calls[(lane, mask)] = n + 1
            slot = g.slots.setdefault((mask, n), {})
            slot[lane] = value
            self._cond.notify_all()
            deadline = time.monotonic() + self.STUCK
            while len(slot) < bin(mask).count("1"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"warp collective with mask {mask:#x}: lanes "
                                       f"{sorted(slot)} arrived, the others never did")
                self._cond.wait(0.005)
        return slot

    def ballot_sync(self, mask, predicate):
        return sum(1 << lane for lane, v in self._exchange(mask, bool(predicate)).items() if v)

    def match_any_sync(self, mask, value):
        return sum(1 << lane for lane, v in self._exchange(mask, value).items() if v == value)

    def shfl_sync(self, mask, value, src_lane):
        return self._exchange(mask, value)[src_lane]

    def shfl_up_sync(self, mask, value, delta):
        """The value of lane ``laneid - delta``; a lane below ``delta`` keeps its own."""
        src = self.laneid() - delta
        slot = self._exchange(mask, value)
        return slot[src] if src >= 0 else value

    def syncwarp(self, mask=0xFFFFFFFF):
        """Wait until every lane of ``mask`` has arrived: what a lane did
        before it is seen by the others after it (the simulated threads
        share memory, and the atomics take one lock)."""
        self._exchange(mask, None)


class SimulatorCuda:
    """``cuda`` in this module under the simulator: the running kernel's
    simulated ``cuda`` module (grid, ffs, popc, threadfence, ...), with
    atomics that share one lock and the warp primitives of
    :class:`_SimulatorWarps`."""

    atomic = _SimulatorAtomics()
    warps = _SimulatorWarps()
    activemask = warps.activemask
    ballot_sync = warps.ballot_sync
    match_any_sync = warps.match_any_sync
    shfl_sync = warps.shfl_sync
    shfl_up_sync = warps.shfl_up_sync
    syncwarp = warps.syncwarp

    @property
    def laneid(self):
        return self.warps.laneid()

    def __getattr__(self, name):
        from numba.cuda.simulator.kernel import _get_kernel_context
        return getattr(_get_kernel_context(), name)
