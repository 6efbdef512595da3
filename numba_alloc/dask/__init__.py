"""numba_alloc across a Dask cluster: :class:`NumbaAllocSetup`, the WorkerPlugin that sets the pool up on every worker (a GPU through Numba's EMM plugin, or a simulated device), each worker's counters in ``Worker.metrics["numba_alloc"]``, and the whole cluster's memory as one table (:func:`memory_stats`, :func:`memory_summary`, :func:`dump_snapshots`, :func:`dump_traces`, :func:`reset_peak_memory_stats`, :func:`empty_cache`). Needs the ``dask`` extra (distributed). Imports the layers below (api, observe, plugin, backends, policy); beside the command line, neither imports the other.

    from distributed import Client
    import numba_alloc.dask

    client = Client(...)
    client.register_plugin(numba_alloc.dask.NumbaAllocSetup("limit:0.8", defrag=True))
    ...
    print(numba_alloc.dask.memory_summary(client))

or, as workers start: ``dask-cuda-worker ... --preload numba_alloc.dask``
(:func:`dask_setup`), with NUMBA_ALLOC_CONF in their environment.
"""

try:
    import distributed  # noqa: F401
except ImportError as error:
    raise ImportError("numba_alloc.dask needs distributed: pip install 'numba-alloc[dask]'",
                      name=error.name) from error

from .cluster import (dump_snapshots, dump_traces, empty_cache, memory_stats, memory_summary,
                      reset_peak_memory_stats)
from .metrics import METRIC
from .worker_plugin import NumbaAllocSetup, dask_setup, worker_pools

__all__ = ["NumbaAllocSetup", "dask_setup", "worker_pools", "METRIC", "memory_stats",
           "memory_summary", "dump_snapshots", "dump_traces", "reset_peak_memory_stats",
           "empty_cache"]
