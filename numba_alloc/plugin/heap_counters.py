"""Reading a device heap's counters (its header and page words in device
memory) from Python without waiting for the kernels still running: one copy
in flight at a time, the last completed figures otherwise; and the
statistics derived from them."""

import threading
import time

import numpy as np

from ..device import heap_layout as layout


class Completed:
    """The event of a read that completed as it was made (simulated device)."""

    @staticmethod
    def query():
        return True

    @staticmethod
    def synchronize():
        pass


class CounterReader:
    """Reads a heap's header (its counters) from device memory without
    waiting for kernels still running. ``start()`` queues a copy of the
    header into ``host`` after the work queued so far and returns an event
    (``query()``, ``synchronize()``). Thread safe: its state changes under
    ``lock`` (the heap's pool's lock; a private one by default), which a
    read never holds while it waits for its copy (``read()`` polls for at
    most POLL seconds, ``read(wait=True)`` waits): the pool goes on
    meanwhile. ``failure``: why the last copy could not be started or
    given up (a driver call's error, as text), None once one has started."""

    POLL = 0.002        # s a read waits for its copy before answering with an earlier one

    def __init__(self, start, host, lock=None):
        self._start, self._host = start, host
        self._lock = threading.RLock() if lock is None else lock
        self._event = None                      # the copy in flight, if any
        self._copies = 0                        # copies started so far
        self._event_copy = 0                    # the number of the copy in flight
        self._last_copy = 0                     # ... of the copy _last holds
        self._last = np.zeros_like(host)        # the header as of the last completed copy
        # why the last copy could not be started ("Type: message"), None once one starts
        self.failure = None

    def forget(self):
        """Back to zeros (the heap was reset); a copy in flight is ignored."""
        with self._lock:
            self._event = None
            self._last[:] = 0
            self._last_copy = self._copies      # newer than every copy started so far

    def close(self):
        """No more copies (the heap is closed): a read answers with the last
        figures, not up to date. Drops ``start`` (and the device memory view
        it holds)."""
        with self._lock:
            self._event = self._start = None

    def read(self, wait=False):
        """(header, up_to_date): up_to_date when a copy made after all work
        queued before this call has completed (within POLL seconds, or by
        waiting for it with ``wait``); else the header as of the last copy
        that completed (zeros before any), and False. Never raises when a
        copy cannot be started or the device cannot say whether one has
        completed (nor once closed): the last figures, ``failure`` saying
        why."""
        if wait:
            return self._read_waiting()
        with self._lock:
            if self._event is not None and self._completed(self._event, poll=True):
                self._take()
            since = self._copies
            if self._event is None and not self._begin():
                return self._last.copy(), False
            event = self._event
        deadline = time.monotonic() + self.POLL
        done = self._completed(event, poll=True)    # without the lock: the pool's calls go on
        while not done and time.monotonic() < deadline and self._event is event:
            done = self._completed(event, poll=True)
        with self._lock:
            if done and self._event is event:
                self._take()            # (else another read took it, or a reset or close)
            return self._last.copy(), self._last_copy > since

    def _read_waiting(self):
        with self._lock:
            since = self._copies
        while True:
            with self._lock:
                if self._last_copy > since:     # a copy begun after this call completed
                    return self._last.copy(), True
                event = self._event
                if event is None:
                    if not self._begin():
                        return self._last.copy(), False
                    event = self._event
            done = self._completed(event)       # without the lock: other reads go on
            with self._lock:
                if done and self._event is event:
                    self._take()
                elif not done:                  # given up: the device cannot tell
                    return self._last.copy(), self._last_copy > since

    def _completed(self, event, poll=False):
        """Whether ``event``'s copy has completed (``poll``: asked once;
        else waited for). False when the device fails to say: that copy is
        given up (a later read starts another) and ``failure`` says why."""
        try:
            if poll and not event.query():
                return False
            event.synchronize()
            return True
        except Exception as e:      # noqa: BLE001 (a read never raises: the last figures)
            with self._lock:
                self.failure = f"{type(e).__name__}: {e}"
                if self._event is event:
                    self._event = None
            return False

    def _begin(self):
        """Start a copy (under the lock); False when none can be started
        (closed, or the copy failed: ``failure`` says why)."""
        if self._start is None:
            return False
        try:
            self._event = self._start()
        except Exception as e:      # noqa: BLE001 (a read never raises: the last figures)
            self.failure = f"{type(e).__name__}: {e}"
            return False
        self.failure = None
        self._copies += 1
        self._event_copy = self._copies
        return True

    def _take(self):
        self._last[:] = self._host
        self._last_copy = self._event_copy
        self._event = None


def heap_figures(words, classes):
    """A heap's statistics from ``words`` (int64), its header and page words
    (``meta[:HEADER + pages]``, as the kernels left them) and ``classes``,
    its class sizes: (the counters of
    numba_alloc.policy.counters.DEVICE_HEAP_COUNTERS the kernels keep, as a
    dict; per class, keyed by its block size and "large" for page runs,
    num_allocs, num_frees, num_failed, bytes_in_use and live_blocks).

    Derived as the kernels keep them: a size class's allocations are its
    CLASS_ALLOCS plus the grants of its pages, its live blocks the counts of
    its pages, its frees the difference, its bytes its live blocks times its
    size; a run's pages are LARGE; the totals are the sums. Exact once the
    kernels that used the heap have completed."""
    words = np.asarray(words, np.int64)
    header, page_words = words[:layout.HEADER], words[layout.HEADER:]
    state = (page_words >> layout.STATE_SHIFT) - layout.UNASSIGNED     # 0: unassigned
    grants, live = np.zeros((2, layout.LARGE + 1 - layout.UNASSIGNED), np.int64)
    np.add.at(grants, state, (page_words >> layout.GRANT_SHIFT) & layout.GRANT_MASK)
    np.add.at(live, state, page_words & layout.COUNT_MASK)
    run_pages = int(np.count_nonzero(state == layout.LARGE - layout.UNASSIGNED))
    per_class, totals = {}, {"num_allocs": 0, "num_frees": 0, "num_failed": 0,
                             "bytes_in_use": 0}
    for k, name in [*enumerate(classes), (layout.LARGE, "large")]:
        c = layout.CLASS_BASE + layout.CLASS_FIELDS * k
        allocs = int(header[c + layout.CLASS_ALLOCS])
        if k == layout.LARGE:
            frees = int(header[c + layout.CLASS_FREES])
            in_use = run_pages * layout.PAGE
        else:
            allocs += int(grants[k - layout.UNASSIGNED])
            frees = allocs - int(live[k - layout.UNASSIGNED])
            in_use = (allocs - frees) * classes[k]
        figures = {"num_allocs": allocs, "num_frees": frees,
                   "num_failed": int(header[c + layout.CLASS_FAILED]), "bytes_in_use": in_use}
        for field, value in figures.items():
            totals[field] += value
        per_class[name] = {**figures, "live_blocks": allocs - frees}
    counters = {"bytes_in_use": totals["bytes_in_use"],
                "peak_bytes_in_use": int(header[layout.PEAK_BYTES_IN_USE]),
                "num_allocs": totals["num_allocs"], "num_frees": totals["num_frees"],
                "num_failed": totals["num_failed"],
                "num_invalid_frees": int(header[layout.NUM_INVALID_FREES])}
    return counters, per_class
