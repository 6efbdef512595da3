"""What a worker reports at each heartbeat: ``Worker.metrics["numba_alloc"]``,
which the scheduler keeps as ``WorkerState.metrics["numba_alloc"]`` and
``client.scheduler_info()["workers"][address]["metrics"]["numba_alloc"]``
shows: ``{GPU number as a str: {counter: value}}``, with the counters of
:data:`METRIC_KEYS` (bytes, or numbers of events)."""

from ..plugin.registry import resolve_pool

METRIC = "numba_alloc"

# metric -> (the Pool reader, its argument); the memory_stats key it equals
METRIC_KEYS = {
    "allocated_bytes": ("current", "allocated_bytes"),       # allocated_bytes.all.current
    "peak_allocated_bytes": ("peak", "allocated_bytes"),     # allocated_bytes.all.peak
    "reserved_bytes": ("current", "reserved_bytes"),         # reserved_bytes.all.current
    "peak_reserved_bytes": ("peak", "reserved_bytes"),       # reserved_bytes.all.peak
    "reclaimed_bytes": ("current", "reclaimed_bytes"),       # reclaimed_bytes.current
    "num_ooms": ("count", "num_ooms"),
    "num_defragmentations": ("count", "num_defragmentations"),
}


def device_metrics(device):
    """The :data:`METRIC_KEYS` counters of one device (a GPU number or a
    Pool), read at one instant under its pool's lock. Reads counters
    only: retires no frees and waits for nothing."""
    with resolve_pool(device) as pool, pool.lock:
        return {key: getattr(pool, reader)(name) for key, (reader, name) in METRIC_KEYS.items()}


def metrics(devices):
    """``{str(GPU number): device_metrics(device)}`` of ``devices``
    (``{GPU number: device}``); str keys, as JSON (the dashboard's) needs."""
    return {str(gpu): device_metrics(device) for gpu, device in devices.items()}
