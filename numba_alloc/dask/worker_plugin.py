"""The WorkerPlugin that sets numba_alloc up on each Dask worker, as
dask-cuda's RMMSetup sets RMM up: :class:`NumbaAllocSetup`.

On a GPU worker it makes numba_alloc Numba's memory manager, applies the
settings, and creates the worker's GPU context and pool at once (before
any task uses CUDA); with ``simulate`` it gives the worker a pool on a
:class:`~numba_alloc.SimulatedDevice` instead. It adds
``Worker.metrics["numba_alloc"]`` (numba_alloc.dask.metrics), can record each
pool's history, and writes each pool's trace to a log directory when it
is torn down (the worker closes, or the plugin is unregistered).
"""

import os
import re
from pathlib import Path

from distributed import Worker, WorkerPlugin, get_worker

from ..api.functions import install
from ..backends.simulated import SimulatedDevice
from ..observe.history import (DEFAULT_MAX_ENTRIES, checked_max_entries, history_of,
                                record_history)
from ..observe.trace import dump_trace
from ..plugin import registry
from ..policy.config import Settings, parse_conf, parse_settings
from ..policy.pool import Pool
from ..units import parse_size
from ..validate import as_flag
from . import unspill
from .metrics import METRIC, metrics
from .portable_pickle import PLUGIN_NAME, portable_reduce
_ON_DASK = ("on Dask: register NumbaAllocSetup before any task on the worker uses CUDA, "
            "or start the workers with NUMBA_CUDA_MEMORY_MANAGER=numba_alloc in their "
            "environment; without a GPU, NumbaAllocSetup(simulate=capacity) gives each "
            "worker a simulated device")


def _checked_settings(conf, settings, capacity):
    """The settings of ``conf`` (NUMBA_ALLOC_CONF's syntax) updated by the
    keywords ``settings``, parsed; TypeError or ValueError naming the bad
    one (or the combination that cannot be used, also on a simulated
    device of ``capacity`` bytes unless it is None)."""
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"conf must be a str in NUMBA_ALLOC_CONF's syntax "
                        f"('key:value,key:value') or None, got {conf!r}")
    try:
        parsed = parse_conf(conf or "")
    except ValueError as e:
        raise ValueError(f"conf={conf!r} is invalid: {e}") from None
    parsed.update(parse_settings(settings))
    combined = Settings(**parsed)       # the combination (ValueError)
    if capacity is not None:
        combined.check_limit_of(capacity)
    return parsed


def file_stem(worker_name, gpu):
    """The start of the file names a worker's GPU is written to
    (``<worker name>-gpu<number>``, the name's characters other than
    letters, digits, ``.``, ``_`` and ``-`` made ``_``)."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', str(worker_name))}-gpu{gpu}"


class NumbaAllocSetup(WorkerPlugin):
    """Sets numba_alloc up on each worker: ``client.register_plugin(NumbaAllocSetup(...))``
    (the workers there and those that join later).

    ``conf``: settings in NUMBA_ALLOC_CONF's syntax (``"limit:0.8,defrag:true"``);
    keyword ``settings`` (those of :func:`numba_alloc.configure`) override
    it. Without either, a GPU worker keeps its environment's NUMBA_ALLOC_CONF.
    ``simulate``: None (the worker's GPU, through Numba), or a capacity (bytes,
    or a size such as ``"16GiB"``) for a pool on a simulated device per
    worker. ``history``: record each pool's history from the start
    (``max_entries`` newest events kept). ``log_directory``: write each
    pool's history as an RMM CSV log, ``<worker name>-gpu<N>.csv``, into this
    directory (on the worker's machine) when the plugin is torn down;
    turns ``history`` on.

    Bad arguments raise TypeError or ValueError naming them here, before
    anything is registered (with ``simulate``, a fractional limit too small
    for that capacity too). On a GPU worker, setting up raises (and so
    ``register_plugin`` does), naming the worker and leaving its settings as
    they were (numba_alloc stays Numba's memory manager once installed):
    RuntimeError where Numba already has a context with another memory
    manager, or no GPU can be reached; ValueError or RuntimeError for
    settings the worker cannot apply (an invalid NUMBA_ALLOC_CONF, reclaim
    where its numba-cuda's internals differ, a setting its pool in use can
    no longer change); RuntimeError on a worker that cannot import
    numba_alloc, and for any other error (a driver's), naming the step that
    met it and the settings applied, the error its ``__cause__``. The plugin stays in the worker's ``plugins`` after a
    failed set-up (distributed adds it first), and the client functions
    then raise RuntimeError naming the worker and the failure.
    """

    name = PLUGIN_NAME

    def __init__(self, conf=None, *, simulate=None, history=False,
                 max_entries=DEFAULT_MAX_ENTRIES, log_directory=None, **settings):
        if simulate is not None:
            simulate = parse_size(simulate, "simulate")
            if simulate == 0:
                raise ValueError("simulate must be a capacity above 0 bytes, or None (the GPU)")
        self.settings = _checked_settings(conf, settings, simulate)
        history = as_flag(history, "history")
        if log_directory is not None and not isinstance(log_directory, (str, os.PathLike)):
            raise TypeError(f"log_directory must be a str or path-like, or None, "
                            f"got {log_directory!r}")
        max_entries = checked_max_entries(max_entries)
        self.simulate = simulate
        self.history = history or log_directory is not None
        self.max_entries = max_entries
        self.log_directory = None if log_directory is None else os.fspath(log_directory)
        self._pools = {}     # GPU number -> simulated Pool (simulate only)
        self._recording = []   # pools whose history this plugin started
        self.failure = None     # why setup() failed on this worker: "worker ...: Error: ..."

    def __reduce__(self):
        """Pickled so that a worker without numba_alloc unpickles it too
        (numba_alloc.dask.portable_pickle)."""
        return portable_reduce(self)

    def setup(self, worker):
        """Set the worker up: its pool, history, metric and the unspilling
        of Numba arrays into the pool. What it raises (:meth:`_set_up`)
        names the worker, and is kept in ``failure``."""
        self.failure = None
        try:
            self._set_up(worker)
        except Exception as e:
            self.failure = str(e)
            raise

    def _set_up(self, worker):
        """All or nothing: should any step fail (making the pool, starting
        its history), the history started is stopped and, on a GPU worker,
        the settings are put back (numba_alloc stays Numba's memory manager
        once installed: it is fixed per context). What it raises names the
        worker and has the error met as its ``__cause__``: a ValueError for
        a ValueError (a setting refused, which it names), else a
        RuntimeError that also names the step and the settings it applied
        (and the error's type, unless a RuntimeError)."""
        state = registry.settings_state() if self.simulate is None else None
        recording = []
        settings = (", ".join(f"{key}={value!r}" for key, value in self.settings.items())
                    or ("the worker's NUMBA_ALLOC_CONF" if self.simulate is None
                        else "the defaults"))
        step = f"making its pool with {settings}"
        try:
            if self.simulate is None:
                devices = self._set_up_gpu()
            else:
                devices = {0: Pool(SimulatedDevice(self.simulate), **self.settings)}
            if self.history:
                step = f"starting its pool's history: history=True, max_entries={self.max_entries}"
                for device in devices.values():
                    record_history("all", max_entries=self.max_entries, device=device)
                    recording.append(device)
        except BaseException as e:
            for device in recording:
                record_history(None, device=device)
            if state is not None:
                registry.restore_settings(state)
            if isinstance(e, ValueError):   # a setting refused, named
                raise ValueError(f"worker {worker.name}: {e}") from e
            if isinstance(e, Exception):
                why = e if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
                raise RuntimeError(f"worker {worker.name}: {why} ({step})") from e
            raise
        self._recording.extend(recording)
        if self.simulate is not None:
            self._pools = devices       # once nothing can fail: a failed set-up keeps none
        worker.metrics[METRIC] = lambda _worker: metrics(self.devices())

    def _set_up_gpu(self):
        """numba_alloc as Numba's manager with the settings, the worker's
        GPU context and pool made, Dask's Numba deserializer into the pool;
        {GPU number: GPU number}. The settings are applied first (they may
        be refused there, changing nothing); should install() be refused or
        the pool not be made with them, :meth:`_set_up` puts them back."""
        registry.configure(**self.settings)     # (nothing changed if it raises)
        try:
            install()
        except RuntimeError as e:
            raise RuntimeError(f"{e}; {_ON_DASK}") from e
        with registry.resolve_pool(None) as pool:   # the worker's GPU: its context and pool now
            gpu = pool.backend.device_id
        unspill.register()
        return {gpu: gpu}

    def devices(self):
        """``{GPU number: what the per-device functions take}``: the GPU
        number of each device Numba has used (a GPU worker), or the
        simulated Pool."""
        if self.simulate is not None:
            return dict(self._pools)
        return {gpu: gpu for gpu in sorted(registry.pools())}

    def teardown(self, worker):
        """Write the logs (``log_directory``), stop the history this plugin
        started and remove the metric; a GPU worker keeps numba_alloc as
        Numba's memory manager (it is fixed per context). The history stops
        and the metric goes also when writing a log fails (which raises):
        distributed has dropped the plugin by then, and nothing else would
        stop the history."""
        worker.metrics.pop(METRIC, None)
        try:
            if self.log_directory is not None:
                folder = Path(self.log_directory)
                folder.mkdir(parents=True, exist_ok=True)
                for gpu, device in self.devices().items():
                    with registry.resolve_pool(device) as pool:
                        recorded = history_of(pool) is not None
                    if recorded:
                        dump_trace(folder / f"{file_stem(worker.name, gpu)}.csv", device=device)
        finally:
            for device in self._recording:
                record_history(None, device=device)
            self._recording = []
            self._pools = {}


async def dask_setup(worker):
    """The worker preload ``numba_alloc.dask`` (``dask worker --preload
    numba_alloc.dask``, dask-cuda-worker's ``--preload``, or
    ``LocalCUDACluster(preload=["numba_alloc.dask"])``): NumbaAllocSetup()
    on the worker as it starts, before it joins the scheduler, with the
    settings of its environment's NUMBA_ALLOC_CONF. A set-up that fails
    raises; distributed logs it and starts the worker anyway, and the
    client functions (numba_alloc.dask.memory_stats, ...) raise
    RuntimeError naming the worker and the failure. TypeError for a
    scheduler or a nanny."""
    if not isinstance(worker, Worker):
        raise TypeError(f"numba_alloc.dask is a worker preload (dask worker --preload "
                        f"numba_alloc.dask), not one for a {type(worker).__name__}")
    await worker.plugin_add(NumbaAllocSetup(), catch_errors=False)


def worker_pools(worker=None):
    """``{GPU number: Pool}`` of a worker under :class:`NumbaAllocSetup`
    (``worker``: None for the one running the calling task). Raises
    ValueError outside a task (no worker) and RuntimeError where the plugin
    is not registered."""
    plugin = _plugin(worker or get_worker())
    pools = {}
    for gpu, device in plugin.devices().items():
        with registry.resolve_pool(device) as pool:
            pools[gpu] = pool
    return pools


def _plugin(worker):
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, NumbaAllocSetup):
        raise RuntimeError(f"worker {worker.name} has no NumbaAllocSetup plugin: "
                           "client.register_plugin(numba_alloc.dask.NumbaAllocSetup(...)) first")
    if plugin.failure is not None:
        raise RuntimeError(f"{plugin.failure} (NumbaAllocSetup failed to set the worker up: "
                           "mend that and register it again)")
    return plugin


def worker_devices(worker):
    """``{GPU number: device argument}`` of ``worker`` (see
    :meth:`NumbaAllocSetup.devices`); RuntimeError without the plugin."""
    return _plugin(worker).devices()
