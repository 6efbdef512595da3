"""The whole cluster's pools from the client: every worker's under
:class:`~numba_alloc.dask.NumbaAllocSetup`, read or changed with one
``client.run`` (so every worker must have the plugin, set up: RuntimeError,
naming the worker, otherwise, as where a worker cannot run the reading,
such as one that cannot import numba_alloc). ``client``: a synchronous
``distributed.Client``."""

from pathlib import Path

from ..api import functions as api
from ..observe.history import history_of, pool_lock
from ..observe.memory_viz import snapshot, write_snapshot
from ..observe.text_table import columns
from ..observe.trace import events_from_history, write_rmm_log
from ..plugin.registry import resolve_pool
from ..units import format_bytes
from .worker_plugin import file_stem, worker_devices

TOTAL = "total"
_LARGEST = ("largest_alloc_size", "max_split_size")    # the totals row takes their largest
# memory_summary's columns: (heading, memory_stats key, bytes?)
_SUMMARY = (("allocated", "allocated_bytes.all.current", True),
            ("peak allocated", "allocated_bytes.all.peak", True),
            ("reserved", "reserved_bytes.all.current", True),
            ("peak reserved", "reserved_bytes.all.peak", True),
            ("reclaimed", "reclaimed_bytes.current", True),
            ("OOMs", "num_ooms", False),
            ("defrags", "num_defragmentations", False))


def _run(client, on_worker):
    """``client.run(on_worker)``: {worker address: its result}. RuntimeError
    naming the first worker (in address order) where it failed: the
    worker's own RuntimeError (worker_devices' names it), or one naming
    the worker's address and its error (as the bare ``Exception:
    ImportError(...)`` distributed gives for a worker that cannot import
    numba_alloc)."""
    results = client.run(on_worker, on_error="return")
    for address in sorted(results):
        error = results[address]
        if isinstance(error, RuntimeError):
            raise error
        if isinstance(error, BaseException):
            text = str(error) if type(error) is Exception else f"{type(error).__name__}: {error}"
            raise RuntimeError(f"worker {address}: {text}") from None
    return results


def _each_device(client, read):
    """``{worker address: {GPU number: read(device)}}`` over every worker."""
    def on_worker(dask_worker):
        return {gpu: read(device) for gpu, device in worker_devices(dask_worker).items()}
    return _run(client, on_worker)


def _rows(client):
    """One row per worker and GPU (``worker``, ``gpu``, then memory_stats'
    keys), in address and GPU order, then the totals row."""
    per_worker = _each_device(client, api.memory_stats)
    rows = [{"worker": address, "gpu": gpu, **stats}
            for address in sorted(per_worker) for gpu, stats in sorted(per_worker[address].items())]
    total = {"worker": TOTAL, "gpu": None}
    for row in rows:
        for key, value in row.items():
            if key in ("worker", "gpu"):
                continue
            total[key] = max(total.get(key, 0), value) if key in _LARGEST else \
                total.get(key, 0) + value
    return rows + [total]


def memory_stats(client):
    """Every worker's and GPU's memory_stats() as one table, with a last
    row of totals (``worker`` "total", ``gpu`` None: the sum of each
    counter, the largest of largest_alloc_size and max_split_size; a sum of
    peaks bounds the cluster's peak from above). A pandas DataFrame indexed
    by (worker, gpu) where pandas is installed, else the rows as a list of
    dicts. A counter some workers lack (NRT's) is missing from their rows."""
    rows = _rows(client)
    try:
        import pandas
    except ImportError:
        return rows
    frame = pandas.DataFrame(rows)
    # object, so that GPU numbers stay ints beside the totals row's None
    # (which the index shows as NaN); pandas would make the column floats
    frame["gpu"] = pandas.Series([row["gpu"] for row in rows], dtype=object)
    return frame.set_index(["worker", "gpu"])


def memory_summary(client):
    """A text table of the cluster's pools: per worker and GPU, bytes
    allocated and reserved with their peaks, reclaimed to host memory,
    out-of-memory errors and defragmentations, then the totals."""
    rows = _rows(client)
    table = [("worker", "gpu", *(heading for heading, _, _ in _SUMMARY))]
    for row in rows:
        table.append((row["worker"], "" if row["gpu"] is None else str(row["gpu"]),
                      *(format_bytes(value) if in_bytes else str(value)
                        for value, (_, _, in_bytes) in zip(_summary_values(row), _SUMMARY))))
    workers, devices = len({r["worker"] for r in rows[:-1]}), len(rows) - 1
    return (f"numba_alloc on {_counted(workers, 'worker')}, {_counted(devices, 'device')}\n"
            + columns(table[0], table[1:], {"worker"}))


def _summary_values(row):
    """The summary's figures of ``row``; the totals row of a cluster with no
    pool has none: zeros."""
    if row["worker"] == TOTAL:
        return [row.get(key, 0) for _, key, _ in _SUMMARY]
    return [row[key] for _, key, _ in _SUMMARY]


def _counted(n, thing):
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _written(client, folder, read, write, suffix):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def on_worker(dask_worker):
        return dask_worker.name, {gpu: read(device)
                                  for gpu, device in worker_devices(dask_worker).items()}
    paths = []
    for name, per_gpu in _run(client, on_worker).values():
        for gpu, data in sorted(per_gpu.items()):
            path = folder / f"{file_stem(name, gpu)}{suffix}"
            write(data, path)
            paths.append(path)
    return sorted(paths)


def dump_snapshots(client, folder):
    """Write each worker's and GPU's :func:`~numba_alloc.snapshot` into
    ``folder`` (made if need be, on the client's machine) as
    ``<worker name>-gpu<N>.pickle``, for pytorch.org/memory_viz; the paths
    written. Their traces are empty unless the pools record history."""
    return _written(client, folder, lambda device: dict(snapshot(device)), write_snapshot,
                    ".pickle")


def _trace_events(device):
    with resolve_pool(device) as pool, pool_lock(pool):
        history = history_of(pool)
        entries = list(history.entries) if history else []
    return events_from_history(entries)


def dump_traces(client, folder):
    """Write each worker's and GPU's recorded history as an RMM CSV log
    (``numba_alloc.dump_trace``'s) into ``folder`` (on the client's
    machine) as ``<worker name>-gpu<N>.csv``; the paths written. A pool
    that records no history (NumbaAllocSetup's ``history``) gives a log
    with its header only."""
    return _written(client, folder, _trace_events, write_rmm_log, ".csv")


def reset_peak_memory_stats(client):
    """Set every peak of every worker's pools to its current value."""
    _each_device(client, api.reset_peak_memory_stats)


def empty_cache(client):
    """Return every worker's pools' fully free segments to their devices."""
    _each_device(client, api.empty_cache)
