"""Replay an allocation trace (an RMM CSV log, RMM's or ours) through a pool,
and the ``numba-alloc replay`` command.

The events run in file order, one thread. A trace pointer maps to the
block the replay allocated for it. A malformed trace is refused before
anything is allocated; a replay that fails part way (an error in the pool or
the device, an interrupt) frees every block it holds and waits for those
frees before the error goes on, so the pool's blocks and its allocated,
active and requested counts are as before (segments it reserved stay
cached). Real logs are messy, and each oddity is counted, never fatal:

* a free of a pointer the replay does not hold (allocated before logging
  began, or lost): counted as an unknown free and skipped;
* an allocation at a pointer the trace still holds (its free was lost):
  counted as a reused address, the old block freed first;
* a recorded ``allocate failure``: counted and skipped;
* a request the pool cannot meet here (OutOfMemoryError): counted as a
  failed request; the trace's later free of that pointer is skipped.
"""

import dataclasses
import os
import time

from ..plugin import registry
from ..api.functions import install
from ..policy.config import parse_conf
from ..observe.display import replay_html
from ..policy.pool import Pool
from ..plugin.registry import resolve_pool
from ..backends.simulated import SimulatedDevice
from ..observe.summary import format_summary, free_space
from ..units import format_bytes
from ..observe.trace import ALLOCATE, BUNDLED_TRACE, DEALLOCATE, check_events, read_rmm_log
from ..observe.tracking import track


@dataclasses.dataclass
class ReplayReport:
    """What a replay measured. Bytes are ints; ``fragmentation`` is
    ``1 - largest free block / free bytes`` at the end of the trace, before
    the replay releases what the trace still holds; ``host_us_per_op`` is the
    mean host time of the pool's malloc and free calls, in microseconds,
    warm (see :func:`replay_trace`); on a simulated device,
    ``device_us_per_op`` is the part of it the device's own work took (the
    bytes a defragmentation copies, which a GPU moves on the device, and
    the unmapping of the host pages that held a released segment's data),
    and None elsewhere."""
    trace: str
    device: str
    events: int
    allocations: int
    frees: int
    failed_requests: int
    recorded_failures: int
    unknown_frees: int
    reused_addresses: int
    peak_reserved: int
    peak_allocated: int
    peak_live_bytes: int
    fragmentation: float
    host_us_per_op: float
    device_us_per_op: float | None = None

    def format(self):
        """The report as lines of text."""
        return "\n".join([
            f"replay of {self.trace} on {self.device}: {self.events} events",
            f"  allocations {self.allocations}, frees {self.frees}, failed requests "
            f"{self.failed_requests}",
            f"  from the trace: recorded failures {self.recorded_failures}, unknown frees "
            f"{self.unknown_frees}, reused addresses {self.reused_addresses}",
            f"  peak reserved {format_bytes(self.peak_reserved)}, peak allocated "
            f"{format_bytes(self.peak_allocated)}, peak live bytes (requested) "
            f"{format_bytes(self.peak_live_bytes)}",
            f"  fragmentation at the end {self.fragmentation:.3f}, host time "
            f"{self.host_us_per_op:.2f} us per operation"
            + ("" if self.device_us_per_op is None else
               f" ({self.device_us_per_op:.2f} of them the simulated device's work)"),
        ])

    def _repr_pretty_(self, printer, cycle):
        printer.text(self.format())

    def _repr_html_(self):
        return replay_html(self)


def replay_trace(trace, device=None) -> "ReplayReport":
    """Replay ``trace`` (a path to an RMM CSV log, an open text file of one,
    or a sequence of :class:`~numba_alloc.observe.trace.TraceEvent`) through a pool
    and return a :class:`ReplayReport`. ``device``: a Pool (such as
    ``Pool(SimulatedDevice("16GiB"))``), a GPU number, or None (the current
    GPU). The pool ends holding what it held before (its cache aside), also
    when the replay raises. Raises ValueError or TypeError naming the line
    (``trace[i]`` for events) of a malformed trace, before allocating.

    The host time is warm: the trace first runs untimed through a
    throwaway pool on a simulated device of the same size and policy
    settings, so that the first use of the pool's code paths in this
    process (importing the out-of-memory error's modules and numba.cuda
    for them, the copy kernel's module for a defragmentation: on a 2-core
    VM, 50-100 us per operation of the bundled trace, against 3 us warm) is
    not counted. The replay takes twice the time for it. The throwaway
    device holds data only when ``device``'s does; replaying on a GPU,
    loading the GPU's copy kernel may still be counted."""
    if hasattr(trace, "read"):
        events, name = read_rmm_log(trace), str(getattr(trace, "name", "trace"))
    elif isinstance(trace, (str, bytes, os.PathLike)):
        events, name = read_rmm_log(trace), os.fsdecode(trace)
    else:
        events, name = check_events(trace, "trace"), "events"
    with resolve_pool(device) as pool:
        settings = pool.settings()
        simulated = isinstance(pool.backend, SimulatedDevice)
        warm_up = Pool(SimulatedDevice(pool.backend.memory_info()[1],
                                       holds_data=simulated and pool.backend.holds_data),
                       **{key: getattr(settings, key) for key in _POLICY_SETTINGS})
    _replay(events, warm_up, lambda call, argument: call(argument))
    host_ns = [0, 0, 0]   # nanoseconds in pool calls, pool calls, the simulated device's work

    with resolve_pool(device) as pool:
        simulated = pool.backend if isinstance(pool.backend, SimulatedDevice) else None

    def timed(call, argument):
        start = time.perf_counter_ns()
        working = simulated.device_ns if simulated is not None else 0
        try:
            return call(argument)
        finally:
            host_ns[0] += time.perf_counter_ns() - start
            host_ns[1] += 1
            if simulated is not None:
                host_ns[2] += simulated.device_ns - working

    with resolve_pool(device) as pool, track("replay", pool) as region:
        allocated_before, reserved_before = (pool.current("allocated_bytes"),
                                             pool.current("reserved_bytes"))
        counts, peak_live, fragmentation = _replay(events, pool, timed)
        device_name = f"{pool.backend.name} device {pool.backend.device_id}"
    return ReplayReport(
        trace=name, device=device_name, events=len(events), **counts,
        peak_reserved=reserved_before + region.reserved.peak,
        peak_allocated=allocated_before + region.bytes.peak,
        peak_live_bytes=peak_live, fragmentation=fragmentation,
        host_us_per_op=host_ns[0] / host_ns[1] / 1000 if host_ns[1] else 0.0,
        device_us_per_op=(None if simulated is None else
                          host_ns[2] / host_ns[1] / 1000 if host_ns[1] else 0.0))


# the settings the warm-up pool copies: those that choose the pool's code paths
_POLICY_SETTINGS = ("max_split_size_mb", "growth", "limit", "garbage_collection_threshold",
                    "defrag")


def _replay(events, pool, call):
    """Run checked ``events`` through ``pool``, each malloc and free made
    as ``call(pool.malloc or pool.free, argument)``; (the counts of
    :class:`ReplayReport`, peak live bytes, fragmentation at the end).
    Frees what it holds and waits for those frees before returning or
    raising."""
    counts = dict.fromkeys(("allocations", "frees", "failed_requests", "recorded_failures",
                            "unknown_frees", "reused_addresses"), 0)
    live = {}          # trace pointer -> block
    failed = set()     # trace pointers whose allocation failed here
    live_bytes = peak_live = 0
    try:
        for e in events:
            if e.action == ALLOCATE:
                old = live.get(e.pointer)
                if old is not None:
                    counts["reused_addresses"] += 1
                    call(pool.free, old)
                    del live[e.pointer]
                    live_bytes -= old.size
                failed.discard(e.pointer)
                try:
                    block = call(pool.malloc, e.size)
                except MemoryError as error:
                    # (its module imports numba.cuda: at the first failure only)
                    from ..observe.out_of_memory import OutOfMemoryError
                    if not isinstance(error, OutOfMemoryError):
                        raise
                    counts["failed_requests"] += 1
                    failed.add(e.pointer)
                    continue
                live[e.pointer] = block
                counts["allocations"] += 1
                live_bytes += block.size
                peak_live = max(peak_live, live_bytes)
            elif e.action == DEALLOCATE:
                block = live.get(e.pointer)
                if block is None:
                    if e.pointer in failed:
                        failed.discard(e.pointer)
                    else:
                        counts["unknown_frees"] += 1
                    continue
                call(pool.free, block)
                del live[e.pointer]
                counts["frees"] += 1
                live_bytes -= block.size
            else:
                counts["recorded_failures"] += 1
        pool.synchronize()
        fragmentation = free_space(pool.snapshot()["segments"])[2]
    except BaseException:
        _free_all(pool, live)
        raise
    _free_all(pool, live)
    return counts, peak_live, fragmentation


def _free_all(pool, live):
    """Free every block of ``live`` (trace pointer -> block), emptying it,
    and wait for the frees, so that the pool's counts are back to before
    the replay. When a free raises, the others are still freed; then the
    first error is raised."""
    errors = []
    for block in live.values():
        try:
            pool.free(block)
        except BaseException as e:
            errors.append(e)
    live.clear()
    pool.synchronize()
    if errors:
        raise errors[0]


def add_arguments(parser):
    """The options of ``numba-alloc replay``."""
    from .arguments import capacity, validated
    parser.add_argument("trace", nargs="?", default=str(BUNDLED_TRACE),
                        help="an RMM CSV allocation log, gzip-compressed or not (default: "
                             "the bundled trace of a training loop)")
    parser.add_argument("--capacity", default=None, type=capacity,
                        help="size of the simulated device (default 16GiB; not with "
                             "--device)")
    parser.add_argument("--defrag", action="store_true", help="replay with defrag:on")
    parser.add_argument("--conf", default="", type=validated(parse_conf),
                        help="more settings, as NUMBA_ALLOC_CONF: 'key:value,key:value'")
    parser.add_argument("--device", nargs="?", type=int, const=0, default=None,
                        metavar="GPU", help="replay on this GPU (default 0) through "
                                            "Numba under the plugin, not on a simulated device")


def run(args):
    """``numba-alloc replay``: replay on a simulated device of
    ``args.capacity`` (of sizes only: a replay reads no data), or on GPU
    ``args.device`` under the plugin; print the report and the pool's
    summary. Returns the exit status, 0. Raises
    UsageError for settings that do not go together, a GPU that is not
    there, or a trace that cannot be read or is malformed."""
    from .arguments import UsageError, gpu_available
    settings = parse_conf(args.conf)
    if args.defrag:
        settings["defrag"] = True
    if args.device is not None and args.capacity is not None:
        raise UsageError("argument --device: not allowed with --capacity (the size of a "
                         "simulated device; a GPU's pool is capped by --conf limit:SIZE)")
    if args.device is not None:      # checked before the settings change anything
        if not gpu_available():
            raise UsageError("argument --device: Numba finds no usable CUDA GPU here")
        from numba import cuda
        if not 0 <= args.device < len(cuda.gpus):
            raise UsageError(f"argument --device: no GPU {args.device} (there are "
                             f"{len(cuda.gpus)})")
    try:
        if args.device is None:
            device = Pool(SimulatedDevice(args.capacity or "16GiB", holds_data=False),
                          **settings)
        else:
            registry.configure(**settings)
    except ValueError as error:
        raise UsageError(f"argument --conf: {error}") from None
    if args.device is not None:
        install()
        device = args.device
    try:
        report = replay_trace(args.trace, device)
    except OSError as error:        # unreadable: refused before allocating
        raise UsageError(f"can't read the trace {args.trace!r}: "
                         f"{error.strerror or error}") from None
    except ValueError as error:     # malformed: refused before allocating
        raise UsageError(error) from None
    _print(report, device)      # (a closed stdout is main's to handle, not the trace's)
    return 0


def demo(simulated, capacity):
    """``numba-alloc demo --trace``: replay the bundled trace on the current
    GPU under the plugin, or on a simulated device of ``capacity`` when
    ``simulated``. Returns the exit status, 0."""
    if simulated:
        device = Pool(SimulatedDevice(capacity, holds_data=False))
        print(f"demo: the bundled training-loop trace on a simulated device of {capacity} "
              "(no GPU in use; figures come from the simulation)")
    else:
        install()
        device = None
        print("demo: the bundled training-loop trace on the current GPU")
    _print(replay_trace(str(BUNDLED_TRACE), device), device)
    return 0


def _print(report, device):
    """Print ``report`` and the abbreviated summary of ``device``'s pool."""
    print(report.format())
    with resolve_pool(device) as pool:
        print(format_summary(pool, abbreviated=True))
