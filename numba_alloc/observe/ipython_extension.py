"""The IPython extension: ``%load_ext numba_alloc``.

After every cell it prints a table with one row per pool the cell changed:
allocated and reserved bytes before -> after, the cell's peak of allocated
bytes, and the allocations, frees, out-of-memory errors, defragmentations
and bytes reclaimed to host memory during the cell (the pool's counters'
change; a cell that resets them shows their change from the reset). It
follows every pool of the session: the plugin's per-GPU pools and every
:class:`~numba_alloc.Pool` alive or made by a cell, so it works on a
SimulatedDevice without a GPU. A cell that changed no pool prints nothing.

``%numba_alloc off`` / ``%numba_alloc on`` stop and resume it;
``%%numba_alloc`` runs one cell recording the history of every pool and
shows its timeline (:func:`numba_alloc.plot_timeline`, which needs the
``plot`` extra) besides the table.

After a cell that raised a MemoryError (such as
:class:`numba_alloc.OutOfMemoryError`), or a cell another cell ran
(``get_ipython().run_cell``) that did, at once, the extension drops what the
traceback holds: ``sys.last_traceback``, ``last_value``, ``last_type``
(and ``last_exc``) and the locals of the traceback's frames, which keep the
failed cell's arrays alive (PyTorch issue #27600), and prints how many
allocated bytes that freed: what becomes garbage frees its block if it is
a Numba array or an :class:`~numba_alloc.OwnedBlock` (``Pool.malloc_owned``),
not a ``Pool.malloc`` handle, which the pool keeps until ``Pool.free``. The exception object itself stays (IPython's
``%tb`` then has no frames to show).

Runs in IPython's main thread; the per-cell cost is reading each pool's
counters twice and one observer call per allocation while a cell runs.
"""

import gc
import sys
import traceback

from ..plugin.registry import pools as plugin_pools
from ..policy.live_pools import live_pools, stop_when_pool_made, when_pool_made
from ..policy.observers import PoolObserver
from ..units import format_bytes
from .history import history_of, record_history
from .text_table import columns

HEADER = ["pool", "allocated", "reserved", "peak", "allocs", "frees", "OOMs",
          "defrags", "reclaimed"]


class PoolFigures:
    """The counters of one pool that a cell's row compares, read at one
    instant under the pool's lock: ``allocated``, ``reserved`` (bytes now),
    ``allocs``, ``frees`` (blocks handed out and freed so far), ``ooms``,
    ``defrags`` (counts so far), ``reclaimed`` (bytes moved to host memory
    so far), ``resets`` (how many times the counters were reset)."""

    __slots__ = ("allocated", "reserved", "allocs", "frees", "ooms", "defrags", "reclaimed",
                 "resets")

    def __init__(self, pool):
        with pool.lock:
            self.allocated = pool.current("allocated_bytes")
            self.reserved = pool.current("reserved_bytes")
            self.allocs, self.frees = pool.accumulated("allocation")
            self.ooms = pool.count("num_ooms")
            self.defrags = pool.count("num_defragmentations")
            self.reclaimed = pool.accumulated("reclaimed_bytes")[0]
            self.resets = pool.stats.accumulated_resets


class CellWatch(PoolObserver):
    """One pool during one cell: its figures at the start (``before``, all
    zero for a pool made during the cell) and the peak of its allocated
    bytes since (``peak``, updated under the pool's lock)."""

    def __init__(self, pool):
        self.pool = pool
        with pool.lock:
            self.before = PoolFigures(pool)
            self.peak = self.before.allocated
            pool.add_observer(self)

    def _rise(self, pool):
        allocated = pool.stats.current("allocated_bytes")
        if allocated > self.peak:
            self.peak = allocated

    def on_malloc(self, pool, block):
        self._rise(pool)

    def on_bring_back(self, pool, block, old_address):
        self._rise(pool)

    def finish(self):
        """(the figures now, the cell's peak), detaching the watch."""
        self.pool.remove_observer(self)
        after = PoolFigures(self.pool)
        return after, max(self.peak, after.allocated)


def pool_name(pool, namespace):
    """"GPU:n" for the plugin's pool of GPU n, else the name of a variable
    of ``namespace`` holding ``pool``, else the pool's backend."""
    for device_id, plugin_pool in plugin_pools().items():
        if plugin_pool is pool:
            return f"GPU:{device_id}"
    for name, value in namespace.items():
        if value is pool and not name.startswith("_"):
            return name
    return repr(pool.backend)


def cell_row(name, before, after, peak):
    """The table row (strings) of one pool's change from ``before`` to
    ``after`` (:class:`PoolFigures`) with the cell's ``peak`` in bytes;
    the counts are ``after``'s alone when the counters were reset between
    (their change since the reset)."""
    counted = _ZERO if after.resets != before.resets else before
    return [name,
            f"{format_bytes(before.allocated)} -> {format_bytes(after.allocated)}",
            f"{format_bytes(before.reserved)} -> {format_bytes(after.reserved)}",
            format_bytes(peak),
            str(after.allocs - counted.allocs), str(after.frees - counted.frees),
            str(after.ooms - counted.ooms), str(after.defrags - counted.defrags),
            format_bytes(after.reclaimed - counted.reclaimed)]


class _Zero:
    """The counts of a pool whose counters were reset: they start at zero."""
    allocs = frees = ooms = defrags = reclaimed = 0


_ZERO = _Zero()


def _changed(before, after):
    return any(getattr(before, name) != getattr(after, name) for name in PoolFigures.__slots__)


class CellMemory:
    """The extension's state in one IPython shell: the watches of the cell
    running (pool -> :class:`CellWatch`), whether it reports (``on``), and
    the pools whose history one ``%%numba_alloc`` cell records."""

    def __init__(self, shell):
        self.shell = shell
        self.on = True
        self.depth = 0      # cells running (a cell may run another: shell.run_cell)
        self.watches = {}
        self.recording = None       # None, or the pools %%numba_alloc started recording

    # -- IPython's events ---------------------------------------------------
    def pre_run_cell(self, info=None):
        self.depth += 1
        if self.on and self.depth == 1:
            for pool in live_pools():
                self.watches[pool] = CellWatch(pool)

    def new_pool(self, pool):
        """when_pool_made's hook: a pool made while a cell runs is watched too."""
        if self.recording is not None:
            record_history(device=pool)
            self.recording.append(pool)
        if self.on and self.depth:
            self.watches[pool] = CellWatch(pool)

    def post_run_cell(self, result):
        if self.depth == 0:
            return      # the cell that loaded the extension
        self.depth -= 1
        if self.depth:      # the outer cell reports; a nested cell's arrays go now
            self._drop_out_of_memory_traceback(result, list(self.watches))
            return
        watches, self.watches = self.watches, {}
        rows = []
        for pool, watch in watches.items():
            after, peak = watch.finish()
            if _changed(watch.before, after):      # a pool made and left untouched: none
                rows.append(cell_row(pool_name(pool, self.shell.user_ns),
                                     watch.before, after, peak))
        if not self.on:
            return      # (%numba_alloc off in this cell)
        if rows:
            print(columns(HEADER, rows, {"pool"}))
        self._drop_out_of_memory_traceback(result, list(watches))

    def _drop_out_of_memory_traceback(self, result, pools):
        """After a cell (or a cell it ran) that raised a MemoryError, drop
        its traceback and say what that freed of ``pools`` (all live pools
        when empty)."""
        if self.on and isinstance(result.error_in_exec, MemoryError):
            freed = drop_traceback(result.error_in_exec, pools or live_pools())
            print(f"numba_alloc: dropped the failed cell's traceback "
                  f"(sys.last_traceback and its frames' locals): freed {format_bytes(freed)}")

    def _detach(self):
        for watch in self.watches.values():
            watch.pool.remove_observer(watch)
        self.watches = {}

    # -- the magics ---------------------------------------------------------
    def line_magic(self, line):
        """%numba_alloc on|off; another word is IPython's UsageError (one
        line, no traceback)."""
        from IPython.core.error import UsageError

        word = line.strip()
        if word not in ("on", "off"):
            raise UsageError(f"%numba_alloc takes 'on' or 'off', got {word!r}")
        self.on = word == "on"

    def cell_magic(self, line, cell):
        """%%numba_alloc: run ``cell`` recording every pool's history, then
        show the timeline of each pool that recorded events during the
        cell. The cell runs as one block of statements (its last
        expression's value is not displayed); what it raises is the cell's
        error; arguments are IPython's UsageError."""
        from IPython.core.error import UsageError
        from IPython.display import display

        from .plots import plot_timeline, require_matplotlib
        if line.strip():
            raise UsageError(f"%%numba_alloc takes no arguments, got {line.strip()!r}")
        require_matplotlib("%%numba_alloc")
        started, recorded = [], {}     # events each pool had recorded before the cell
        for pool in live_pools():
            if history_of(pool) is None:
                record_history(device=pool)
                started.append(pool)
            recorded[pool] = history_of(pool).recorded
        self.recording = started
        try:
            self.shell.ex(self.shell.transform_cell(cell))
        finally:
            self.recording = None
            for pool in live_pools():
                history = history_of(pool)
                if history is not None and history.recorded > recorded.get(pool, 0):
                    display(plot_timeline(device=pool))
            for pool in started:
                record_history(enabled=False, device=pool)


def drop_traceback(error, pools):
    """Drop what ``error``'s traceback holds: sys.last_traceback,
    last_value, last_type and last_exc, and the locals of the traceback's
    frames; collect the garbage. Returns the bytes of allocated blocks that
    ``pools`` gave back by it."""
    before = sum(pool.current("allocated_bytes") for pool in pools)
    for name in ("last_traceback", "last_value", "last_type", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    traceback.clear_frames(error.__traceback__)
    for frame, _ in traceback.walk_tb(error.__traceback__):
        # before Python 3.13 a frame keeps a dict of its locals once read
        # (as IPython's traceback display reads them): reading it again
        # after the clear empties it
        frame.f_locals  # noqa: B018
    gc.collect()
    return before - sum(pool.current("allocated_bytes") for pool in pools)


_loaded = {}    # shell -> its CellMemory


def load(shell):
    """Start reporting in ``shell`` (an IPython InteractiveShell); loading
    it again changes nothing."""
    if shell in _loaded:
        return
    state = _loaded[shell] = CellMemory(shell)
    shell.events.register("pre_run_cell", state.pre_run_cell)
    shell.events.register("post_run_cell", state.post_run_cell)
    shell.register_magic_function(state.line_magic, "line", "numba_alloc")
    shell.register_magic_function(state.cell_magic, "cell", "numba_alloc")
    when_pool_made(state.new_pool)


def unload(shell):
    """Stop reporting in ``shell`` and remove the magics."""
    state = _loaded.pop(shell, None)
    if state is None:
        return
    shell.events.unregister("pre_run_cell", state.pre_run_cell)
    shell.events.unregister("post_run_cell", state.post_run_cell)
    stop_when_pool_made(state.new_pool)
    for kind in ("line", "cell"):
        shell.magics_manager.magics[kind].pop("numba_alloc", None)
    state._detach()
