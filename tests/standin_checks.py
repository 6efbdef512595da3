"""Scenarios that show what the driver stand-in catches, each run in a
fresh process over it (test_standin.py): ``python standin_checks.py NAME``
prints one JSON line of what happened."""

import json
import os
import sys
import threading

import standin

STANDIN = standin.install(capacity=256 << 20)

import numpy as np  # noqa: E402 (after the stand-in, before CUDA is used)
from numba import cuda  # noqa: E402
from numba.cuda.cudadrv import driver  # noqa: E402
from numba.cuda.cudadrv.devicearray import DeviceNDArray  # noqa: E402

from gpu_kernels import add_one, jit  # noqa: E402


def _what_raised(action):
    """{"raised": the name of the CudaAPIError code ``action()`` raised, or
    None, "errors": what the stand-in recorded}."""
    try:
        action()
    except driver.CudaAPIError as e:
        return {"raised": e.code.name, "errors": STANDIN.errors}
    return {"raised": None, "errors": STANDIN.errors}


def _freed_memory(nbytes=4096):
    """A MemoryPointer to device memory freed since (Numba's default manager)."""
    a = cuda.device_array(nbytes, np.uint8)
    address = a.device_ctypes_pointer.value
    del a
    cuda.current_context().memory_manager.deallocations.clear()     # cuMemFree now
    return driver.MemoryPointer(None, driver.binding.CUdeviceptr(address), nbytes)


def copy_from_freed_memory():
    stale = _freed_memory()
    return _what_raised(lambda: driver.device_to_host(np.zeros(4096, np.uint8), stale, 4096))


def launch_on_freed_memory():
    stale = DeviceNDArray((1024,), (4,), np.dtype(np.float32), gpu_data=_freed_memory())
    return _what_raised(lambda: jit(add_one)[4, 256](stale))


def null_pointer():
    parked = DeviceNDArray((16,), (4,), np.dtype(np.float32),
                           gpu_data=driver.MemoryPointer(None, driver.binding.CUdeviceptr(0), 64))
    return _what_raised(parked.copy_to_host)


def a_block_of_too_many_threads():
    """A launch a GPU refuses: 2048 threads in a block."""
    kernel = jit(add_one)
    array = cuda.to_device(np.zeros(4096, np.float32))
    return _what_raised(lambda: kernel[2, 2048](array))


def work_waits_for_the_host():
    """A launch and an async copy run only when something waits for them;
    a query before that says not done; the synchronous copy after them
    (legacy default stream) sees their result."""
    x = cuda.to_device(np.zeros(1000, np.float32))
    stream = cuda.stream()
    jit(add_one)[4, 256, stream](x)
    done = cuda.event(timing=False)
    done.record(stream)
    before = {"pending": STANDIN.pending, "query": done.query()}
    host = x.copy_to_host()                  # legacy stream: after the blocking stream's work
    return {"before": before, "after": {"pending": STANDIN.pending, "query": done.query(),
                                        "values": sorted(set(host.tolist()))},
            "errors": STANDIN.errors}


def legacy_work_waits_for_another_threads_per_thread_stream():
    """Thread A queues a launch on its per-thread default stream
    (CU_STREAM_PER_THREAD, a blocking stream) and stays alive: an event the
    main thread records on the legacy default stream completes only after
    it. Then A queues another there and exits: the main thread's
    synchronous copy (legacy default stream) sees both."""
    kernel = jit(add_one)
    x = cuda.to_device(np.zeros(1024, np.float32))
    kernel[4, 256](x)                               # compiled, then x back to zeros
    x.copy_to_device(np.zeros(1024, np.float32))
    queued, finish = threading.Event(), threading.Event()

    def thread_a(stay):
        kernel[4, 256, cuda.per_thread_default_stream()](x)
        queued.set()
        if stay:
            finish.wait()
    a = threading.Thread(target=thread_a, args=(True,))
    a.start()
    queued.wait()
    event = cuda.event(timing=False)
    event.record(cuda.legacy_default_stream())
    first = {"pending": STANDIN.pending, "query": event.query()}
    event.synchronize()
    first["after_wait"] = {"pending": STANDIN.pending, "query": event.query()}
    finish.set()
    a.join()
    queued.clear()
    a = threading.Thread(target=thread_a, args=(False,))
    a.start()
    a.join()
    second = {"pending": STANDIN.pending, "values": sorted(set(x.copy_to_host().tolist()))}
    return {"event": first, "copy": second, "errors": STANDIN.errors}


def stream_0_is_per_thread_in_per_thread_mode():
    """CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 (set by the test): a
    launch on stream 0 goes to the calling thread's per-thread default
    stream. Thread A launches over x on stream 0 and stays alive: the main
    thread's synchronous copy of x (on its own per-thread stream) and its
    cuda.default_stream().synchronize() do not wait for A's kernel, an event
    on the legacy default stream does; the main thread's stream-0 launch
    then its synchronous copy see its own kernel."""
    kernel = jit(add_one)
    x = cuda.to_device(np.zeros(1024, np.float32))
    kernel[4, 256](x)                               # compiled, then x back to zeros
    x.copy_to_device(np.zeros(1024, np.float32))
    queued, finish, streams = threading.Event(), threading.Event(), []

    def thread_a():
        kernel[4, 256](x)
        streams.append(STANDIN.queue.pending[-1].stream)
        queued.set()
        finish.wait()
    a = threading.Thread(target=thread_a)
    a.start()
    queued.wait()
    seen = {"a_on_legacy": streams[0] == 1,
            "copy": sorted(set(x.copy_to_host().tolist()))}
    cuda.default_stream().synchronize()
    seen["pending_after_default_sync"] = STANDIN.pending
    event = cuda.event(timing=False)
    event.record(cuda.legacy_default_stream())
    event.synchronize()
    seen["pending_after_legacy_event"] = STANDIN.pending
    finish.set()
    a.join()
    y = cuda.to_device(np.zeros(1024, np.float32))
    kernel[4, 256](y)
    seen["main_launch_on"] = "main's" if STANDIN.queue.pending[-1].stream != 1 else "legacy"
    seen["own_kernel"] = sorted(set(y.copy_to_host().tolist()))
    seen["errors"] = STANDIN.errors
    return seen


def _per_thread_mode():
    """Whether the test set CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1."""
    return os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM") == "1"


def _on_per_thread_stream(kernel, grid, block, *args):
    """Launch on the calling thread's per-thread default stream: stream 0 in
    per-thread mode, else CU_STREAM_PER_THREAD named."""
    if _per_thread_mode():
        kernel[grid, block](*args)
    else:
        kernel[grid, block, cuda.per_thread_default_stream()](*args)


def _run_threads(*targets, events=(), barrier=None):
    """Start a thread per target and join them; an exception in one is
    recorded (its repr), sets ``events`` and breaks ``barrier`` (so that no
    other waits for ever). Returns the exceptions' reprs."""
    raised = []

    def guarded(target):
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - reported
            raised.append(repr(e))
            for event in events:
                event.set()
            if barrier is not None:
                barrier.abort()
    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return raised


def a_freed_block_after_a_per_thread_launch():
    """Thread A launches over x on its per-thread default stream and drops x
    without waiting (round 1: A stays alive meanwhile; round 2: A has
    exited); thread B then has the pool close the free's batch (an event on
    the legacy default stream), makes a synchronous copy of its own (after
    which the event is done: in legacy mode the copy is on the legacy stream,
    in per-thread mode on B's per-thread stream, which follows the legacy
    stream's event), reads the pool's stats (it retires the frees whose event
    is done) and allocates x's size: it gets x's block, and never sees A's
    kernel's writes, before or after the device is synchronized."""
    import numba_alloc
    numba_alloc.install()
    n = 1 << 16
    kernel = jit(add_one)
    warm = cuda.to_device(np.zeros(n, np.float32))
    kernel[64, 256](warm)
    rounds = []
    for stay in (True, False):
        numba_alloc.memory_stats()          # the last round's frees: an event,
        cuda.synchronize()
        numba_alloc.memory_stats()          # done: retired
        x = [cuda.to_device(np.zeros(n, np.float32))]
        address = x[0].device_ctypes_pointer.value
        probe = cuda.to_device(np.zeros(16, np.float32))
        launched, finish, out = threading.Event(), threading.Event(), {}

        def thread_a():
            _on_per_thread_stream(kernel, 64, 256, x.pop())     # x dropped: freed
            launched.set()
            if stay:
                finish.wait()

        def thread_b():
            launched.wait()
            out["pending"] = STANDIN.pending            # A's kernel, not run yet
            numba_alloc.memory_stats()      # closes the batch of frees: an event
            probe.copy_to_host()            # a synchronous copy: the event is done after it
            numba_alloc.memory_stats()      # retires the frees whose event is done
            w = cuda.device_array(n, np.float32)
            w.copy_to_device(np.full(n, 7, np.float32))
            out["same_block"] = w.device_ctypes_pointer.value == address
            out["before_sync"] = sorted(set(w.copy_to_host().tolist()))
            finish.set()
            cuda.synchronize()
            out["after_sync"] = sorted(set(w.copy_to_host().tolist()))
        events = (launched, finish)
        if stay:
            out["raised"] = _run_threads(thread_a, thread_b, events=events)
        else:                               # A's thread joined before B starts
            out["raised"] = (_run_threads(thread_a, events=events)
                             + _run_threads(thread_b, events=events))
        rounds.append(out)
    return {"rounds": rounds, "errors": STANDIN.errors}


def reclaim_with_per_thread_launches():
    """NUMBA_ALLOC_CONF=reclaim:true,limit:16MiB (set by the test): 4
    threads each own 3 arrays of 4 MiB (48 MiB: 3 x the limit) and add 1 to
    one of them per step on their per-thread default stream, without
    synchronizing: first in turns (thread 0, 1, 2, 3, 0, ...: Events), then
    all at once between barriers. Every launch brings its array back when it
    was reclaimed, reclaiming others; every array's bytes are right at the
    end."""
    import numba_alloc
    numba_alloc.install()
    kernel = jit(add_one)
    workers, per, steps = 4, 3, 9
    n = 1 << 20
    arrays = {(w, i): cuda.to_device(np.full(n, 10 * w + i, np.float32))
              for w in range(workers) for i in range(per)}
    expected = {key: 10 * key[0] + key[1] for key in arrays}
    turns = [threading.Event() for _ in range(workers)]
    barrier = threading.Barrier(workers)

    def worker(w):
        def run():
            for step in range(steps):                  # in turns
                turns[w].wait()
                turns[w].clear()
                key = (w, step % per)
                _on_per_thread_stream(kernel, 1024, 1024, arrays[key])
                expected[key] += 1
                turns[(w + 1) % workers].set()
            for step in range(steps):                  # all at once
                barrier.wait()
                key = (w, (step * 2 + w) % per)
                _on_per_thread_stream(kernel, 1024, 1024, arrays[key])
                expected[key] += 1
        return run
    turns[0].set()
    raised = _run_threads(*(worker(w) for w in range(workers)), events=turns,
                          barrier=barrier)
    stats = numba_alloc.memory_stats()     # before the reads below bring arrays back
    cuda.synchronize()
    wrong = [f"{w}/{i}" for (w, i), a in arrays.items()
             if not (a.copy_to_host() == expected[w, i]).all()]
    return {"wrong": wrong, "raised": raised,
            "reclaimed": stats["reclaimed_bytes.allocated"] > 0,
            "brought_back": stats["reclaimed_bytes.freed"] > 0,
            "errors": STANDIN.errors}


def settings_after_cuda_close():
    """The plugin's pool of GPU 0 in use (a pool-local limit set on it, a
    pinned array alive), then cuda.close() and, before GPU 0 is used
    again, settings changed for every device and for GPU 0: nothing may
    reach the context that is gone, and GPU 0's settings are the device's
    again (its next pool's)."""
    import gc
    import numba_alloc
    numba_alloc.install()
    numba_alloc.configure(limit=0.5)
    a = cuda.device_array(1000)
    pinned = cuda.pinned_array(4096, np.uint8)
    with numba_alloc.device_pool() as pool:
        pool.configure(limit=64 << 20)
    del a
    cuda.close()
    del pinned
    gc.collect()
    raised = []
    for call in (lambda: numba_alloc.configure(malloc_heap_size="16MiB"),
                 lambda: numba_alloc.set_memory_growth("GPU:0", False),
                 lambda: numba_alloc.configure(host_cache_limit="1MiB")):
        try:
            call()
        except Exception as e:      # noqa: BLE001 - what it raised is the result
            raised.append(f"{type(e).__name__}: {e}")
    closed_limit = numba_alloc.settings(0).limit
    b = cuda.device_array(1000)                     # a new context, a new pool
    with numba_alloc.device_pool() as pool:
        new = pool.settings()
    del b
    return {"raised": raised, "limit_after_close": closed_limit, "new_limit": new.limit,
            "new_growth": new.growth, "new_heap": new.malloc_heap_size,
            "errors": STANDIN.errors}


def _device_part(summary):
    """The device's part of a memory_summary (from its "Device memory"
    line to the rule below it), its wrapped lines joined."""
    lines = summary.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Device memory"))
    end = lines.index("-" * 84, first)
    return " ".join(line.strip() for line in lines[first:end])


def a_pool_after_cuda_close():
    """GPU 0's pool held across cuda.close(): what its readers answer and
    what its operations raise (each as "Type: message"), whether its
    counters stayed as they were, and whether GPU 0's next use got a new
    pool; a call that reached the driver with the closed context would be
    among the stand-in's errors."""
    import numba_alloc
    numba_alloc.install()
    a = cuda.to_device(np.ones(1 << 20))
    with numba_alloc.device_pool() as pool:
        pass
    del a
    cuda.close()
    stats = pool.memory_stats()

    def outcome(call):
        try:
            return call()
        except Exception as e:      # noqa: BLE001 - what it raised is the result
            return f"{type(e).__name__}: {e}"
    answers = {name: outcome(call) for name, call in {
        "memory_allocated": lambda: numba_alloc.memory_allocated(pool),
        "max_memory_allocated": lambda: numba_alloc.max_memory_allocated(pool),
        "snapshot_device": lambda: pool.snapshot()["device"],
        "summary": lambda: _device_part(numba_alloc.memory_summary(pool)),
        "html": lambda: "unavailable: its context was closed" in pool._repr_html_()}.items()}
    raised = {name: outcome(call) for name, call in {
        "malloc": lambda: pool.malloc(1024),
        "empty_cache": lambda: numba_alloc.empty_cache(pool),
        "defragment": lambda: numba_alloc.defragment(pool),
        "defragment_for": lambda: pool.defragment(1 << 20),
        "mem_get_info": lambda: numba_alloc.mem_get_info(pool),
        "memory_ledger": lambda: numba_alloc.memory_ledger(pool),
        "limit_bytes": pool.limit_bytes}.items()}
    kept = pool.memory_stats() == stats
    with numba_alloc.device_pool(0) as new:
        fresh = new is not pool and new.backend.context_alive
    return {"answers": answers, "raised": raised, "stats_kept": kept, "new_pool": fresh,
            "errors": STANDIN.errors}


def a_pinned_array_dropped_after_cuda_close():
    """A pinned array of GPU 0's pool held across cuda.close(), dropped
    after it: what the pool's readers then answer or raise (each as
    "Type: message" when it raises), and its host blocks."""
    import gc

    import numba_alloc
    numba_alloc.install()
    a = cuda.to_device(np.ones(1 << 20))
    pinned = cuda.pinned_array(1 << 16, np.float32)
    with numba_alloc.device_pool() as pool:
        pass
    del a
    cuda.close()
    del pinned                  # given back to the closed pool's host cache
    gc.collect()

    def outcome(call):
        try:
            call()
        except Exception as e:      # noqa: BLE001 - what it raised is the result
            return f"{type(e).__name__}: {e}"
        return "answered"
    answers = {name: outcome(call) for name, call in {
        "snapshot": pool.snapshot,
        "summary": lambda: numba_alloc.memory_summary(pool),
        "host_memory_stats": lambda: numba_alloc.host_memory_stats(pool),
        "html": pool._repr_html_}.items()}
    blocks = [(b["size"], b["state"]) for b in pool.host_cache.records()] \
        if answers["snapshot"] == "answered" else None
    return {"answers": answers, "host_blocks": blocks, "errors": STANDIN.errors}


def a_getter_before_install():
    """A getter before numba_alloc.install(), with Numba's own manager
    configured: the RuntimeError it raises makes no context, so the
    install() it advises then works, and the device's pool is ours."""
    import numba_alloc
    try:
        numba_alloc.memory_allocated(0)
        raised = None
    except RuntimeError as e:
        raised = str(e)
    contexts = [device.primary_context is not None for device in driver.driver.devices.values()]
    numba_alloc.install()
    a = cuda.to_device(np.arange(10))
    return {"raised": raised, "contexts": contexts,
            "ours": type(cuda.current_context().memory_manager).__name__ == "NumbaAllocManager"
            and numba_alloc.memory_allocated(0) == 512 and bool(a.copy_to_host()[9] == 9),
            "errors": STANDIN.errors}


def launch_after_a_context_reset():
    """A kernel compiled and loaded before Context.reset() keeps its
    function, which the reset unloaded (CUDA_ERROR_INVALID_HANDLE on a GPU)."""
    kernel = jit(add_one)
    x = cuda.to_device(np.zeros(16, np.float32))
    kernel[1, 16](x)
    cuda.synchronize()
    cuda.current_context().reset()
    y = cuda.to_device(np.zeros(16, np.float32))
    return _what_raised(lambda: kernel[1, 16](y))


def reclaim_on_at_start_up_follows_moves():
    """NUMBA_ALLOC_CONF=reclaim:true (the test sets it) with arrays twice a
    small limit in kernel rotation: every array right."""
    import numba_alloc
    numba_alloc.install()
    arrays = [cuda.to_device(np.full(1 << 20, i, np.float32)) for i in range(8)]   # 8 x 4 MiB
    values = list(range(8))
    kernel = jit(add_one)
    for step in range(24):
        i = (step * 3) % 8
        kernel[64, 256](arrays[i])
        values[i] += 1
    wrong = [i for i, a in enumerate(arrays) if not (a.copy_to_host() == values[i]).all()]
    with numba_alloc.device_pool() as pool:
        reclaimed = pool.memory_stats()["reclaimed_bytes.allocated"]
    return {"wrong": wrong, "reclaimed": reclaimed > 0, "errors": STANDIN.errors}


def a_compaction_phase_is_a_launch_not_one_per_segment_pair():
    """Numba arrays of about 1 MiB over several 20 MiB segments, two of
    every three dropped, then a full compaction (NUMBA_ALLOC_CONF, set by
    the test, turns defrag on): how many copy-kernel launches it made and
    their grids, the blocks of the copy kernel the stand-in's GPU holds at
    once, how many pairs of segments its moves ran between, every array
    right."""
    import numba_alloc
    from numba_alloc.policy.observers import PoolObserver
    numba_alloc.install()
    size = (1 << 18) + 128                      # float32s: 1 MiB + 512 B
    arrays = {i: cuda.to_device(np.full(size, i, np.float32)) for i in range(150)}
    for i in list(arrays):
        if i % 3:
            del arrays[i]
    cuda.current_context().memory_manager.deallocations.clear()

    class Moves(PoolObserver):
        moved = []

        def on_move(self, pool, block, old_address):
            self.moved.append((old_address, block.address))

    with numba_alloc.device_pool() as pool:
        segments = sorted((s["address"], s["total_size"]) for s in pool.snapshot()["segments"])
        pool.add_observer(Moves())
        launches = sum(STANDIN.driver.launches.values())
        grids = len(STANDIN.driver.grids)
        done = pool.defragment()
        resident = pool.backend._resident
    cuda.synchronize()
    launches = sum(STANDIN.driver.launches.values()) - launches
    grids = [(grid[:2], block[0]) for _, grid, block in STANDIN.driver.grids[grids:]]

    def segment_of(address):
        return next(i for i, (start, n) in enumerate(segments) if start <= address < start + n)
    pairs = {(segment_of(old), segment_of(new)) for old, new in Moves.moved}
    wrong = [i for i, a in arrays.items() if not (a.copy_to_host() == i).all()]
    return {"launches": launches, "grids": grids, "resident": resident,
            "moves": len(Moves.moved), "pairs": len(pairs),
            "segments": len(segments), "bytes_moved": done.bytes_moved, "wrong": wrong,
            "errors": STANDIN.errors}


def a_compaction_waits_once_and_a_failed_copy_keeps_what_completed():
    """Numba arrays of about 1 MiB over 20 MiB segments, two of every three
    dropped, compacted (NUMBA_ALLOC_CONF, set by the test, turns defrag
    on) three times: as is, counting the driver calls of its copies; with
    the wait for its copies failing (the device's error), after the copy
    kernel ran every phase; with the launch of its second phase failing.
    Every array right after each."""
    import numba_alloc
    from numba_alloc.device import kernels
    from numba_alloc.policy.errors import DefragmentationError
    numba_alloc.install()
    size = (1 << 18) + 128                      # float32s: 1 MiB + 512 B
    arrays = {}

    def fragmented(first):
        arrays.update({i: cuda.to_device(np.full(size, i, np.float32))
                       for i in range(first, first + 90)})
        for i in list(arrays):
            if i % 3:
                del arrays[i]
        cuda.current_context().memory_manager.deallocations.clear()

    def wrong():
        return [i for i, a in arrays.items() if not (a.copy_to_host() == i).all()]

    out = {}
    with numba_alloc.device_pool() as pool:
        fragmented(0)
        pool.synchronize()
        with STANDIN.recording() as made:
            done = pool.defragment()
        names = [call[0] for call in made]
        out["calls"] = {name: names.count(name) for name in
                        ("cuMemcpyHtoD", "cuCtxSynchronize", "cuMemcpyDtoH")}
        out["moved"], out["wrong"] = done.blocks_moved, wrong()
        for how in ("wait", "launch"):
            fragmented(1000 if how == "wait" else 2000)
            pool.synchronize()
            backend, launch_config = pool.backend, kernels.launch_config
            context, failed = backend.context, []

            def failing_wait(real=context.synchronize):
                if not failed:
                    failed.append(1)
                    raise RuntimeError("the device failed")
                return real()

            def start_then_fail_the_wait(phases, first, start=backend.start_copies):
                start(phases, first)
                context.synchronize = failing_wait

            def failing_launch(*args, **kwargs):
                failed.append(1)
                if len(failed) == 2:
                    raise RuntimeError("the launch failed")
                return launch_config(*args, **kwargs)
            if how == "wait":
                backend.start_copies = start_then_fail_the_wait
            else:
                kernels.launch_config = failing_launch
            try:
                pool.defragment()
                out[how] = None
            except DefragmentationError as e:
                out[how] = str(e)
            finally:
                vars(context).pop("synchronize", None)
                vars(backend).pop("start_copies", None)
                kernels.launch_config = launch_config
            out[how + "_wrong"] = wrong()
        pool.defragment()
        out["final_wrong"] = wrong()
    out["errors"] = STANDIN.errors
    return out


def a_counter_read_refused_after_copies_counts_what_they_moved():
    """Numba arrays of about 1 MiB over 20 MiB segments, two of every three
    dropped, compacted (NUMBA_ALLOC_CONF, set by the test, turns defrag
    on) once for each of the SCENARIO_MODES (comma-separated; by default
    read, launch_and_read, neither): "read", the driver refusing the read
    of the copy kernel's counters once the copies completed;
    "launch_and_read", the second launch (of the second phase) failing and
    the read after it refused; "launch_in_phase_N_and_read", the copies
    cut into a launch a move and the second launch of phase N failing,
    the read after it refused; any other, as is. What each raised, the
    allocated bytes of the blocks it left at a new address (heard by
    on_move), what it added to bytes_defragged and num_defragmentations,
    and every array right after each."""
    import functools
    import numba_alloc
    from numba_alloc.device import kernels
    from numba_alloc.policy.errors import DefragmentationError
    from numba_alloc.policy.observers import PoolObserver
    numba_alloc.install()
    size = (1 << 18) + 128                      # float32s: 1 MiB + 512 B
    arrays = {}
    modes = os.environ.get("SCENARIO_MODES", "read,launch_and_read,neither").split(",")

    class Moved(PoolObserver):
        where = {}                              # block -> its first address

        def on_move(self, pool, block, old_address):
            self.where.setdefault(block, old_address)

    out = {}
    with numba_alloc.device_pool() as pool:
        pool.add_observer(Moved())
        for number, how in enumerate(modes):
            arrays.update({i: cuda.to_device(np.full(size, i, np.float32))
                           for i in range(1000 * number, 1000 * number + 90)})
            for i in list(arrays):
                if i % 3:
                    del arrays[i]
            cuda.current_context().memory_manager.deallocations.clear()
            pool.synchronize()
            launch_config, launch_tables = kernels.launch_config, kernels.launch_tables
            launches = []
            failing = [2]       # the launch that fails, counted from 1; then its phase's launches

            def one_move_a_launch(spans, first, phase, **kwargs):
                uploads = launch_tables(spans, first, capacity=kernels.HEADER + kernels.ROW,
                                        **kwargs)
                phases = [index for _, planned in uploads for index, _, _ in planned]
                failing[0] = phases.index(phase - 1) + 2
                failing.append(phases.count(phase - 1))
                return uploads

            def failing_launch(*args, **kwargs):
                launches.append(1)
                if len(launches) == failing[0]:
                    raise RuntimeError("the launch failed")
                return launch_config(*args, **kwargs)
            refuses = how in ("read", "launch_and_read") or how.startswith("launch_in_phase_")
            if refuses:
                refused = _refuse_once("cuMemcpyDtoH")
            if how.startswith("launch"):
                kernels.launch_config = failing_launch
            if how.startswith("launch_in_phase_"):
                phase = int(how.split("_")[3])
                kernels.launch_tables = functools.partial(one_move_a_launch, phase=phase)
            Moved.where.clear()
            stats = pool.stats.bytes_defragged, pool.stats.num_defragmentations
            try:
                pool.defragment()
                raised = None
            except DefragmentationError as e:
                raised = str(e)
            finally:
                kernels.launch_config, kernels.launch_tables = launch_config, launch_tables
            out[how] = {"raised": raised, "refused": not refuses or refused != [],
                        "moved": sum(block.allocated_size for block, old in Moved.where.items()
                                     if block.address != old),
                        "counted": pool.stats.bytes_defragged - stats[0],
                        "defragmentations": pool.stats.num_defragmentations - stats[1],
                        "phase_launches": failing[1:],
                        "wrong": [i for i, a in arrays.items()
                                  if not (a.copy_to_host() == i).all()]}
    out["errors"] = STANDIN.errors
    return out


def _copies_of(calls, pinned):
    """What the recorded ``calls`` of a round trip show of its copies:
    updates ``pinned`` ({address: bytes} of the live cuMemHostAlloc
    allocations, from the calls) and returns (copies, host ranges outside
    every live pinned allocation, waits issued between two copies of one
    direction)."""
    copies, pageable = [], []
    for call in calls:
        if call.name == "cuMemHostAlloc":
            pinned[call.values] = call.args[0]
        elif call.name == "cuMemFreeHost":
            pinned.pop(call.args[0], None)
        elif call.name.startswith("cuMemcpy"):
            copies.append(call)
            host = {"cuMemcpyDtoHAsync": 0, "cuMemcpyHtoDAsync": 1,
                    "cuMemcpyDtoH": 0, "cuMemcpyHtoD": 1}.get(call.name)
            if host is not None:
                start, size = call.args[host], call.args[2]
                if not any(a <= start and start + size <= a + n for a, n in pinned.items()):
                    pageable.append([call.name, start, size])
    waits = 0
    for name in ("cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync"):
        at = [i for i, c in enumerate(calls) if c.name == name]
        if at:
            waits += sum(1 for c in calls[at[0]:at[-1]] if "Synchronize" in c.name)
    return copies, pageable, waits


def _chunks_of(copies, name, start, size, device_arg):
    """[offset, bytes] of each ``name`` copy whose device range is inside
    [start, start + size), in address order."""
    return sorted([c.args[device_arg] - start, c.args[2]] for c in copies
                  if c.name == name and start <= c.args[device_arg] < start + size)


def reclaim_round_trips_through_pinned_chunks():
    """A Pool over the real device backend (CudaDevice: numba-cuda's driver
    layer) with reclaim on and a 128 MiB limit: blocks of 64 MiB, 20 MiB +
    4 KiB and 5,000 bytes filled with random bytes; then, twice, a 110 MiB
    request that only all three reclaimed make room for, its free, and one
    use of the three (they come back), each round's driver calls recorded;
    every byte read back after each round."""
    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice
    backend = CudaDevice(cuda.current_context())
    pool = Pool(backend, reclaim=True, limit=128 << 20)
    blocks = [pool.malloc(n) for n in (64 << 20, (20 << 20) + 4096, 5000)]
    rng = np.random.default_rng(11)
    data = [rng.integers(0, 256, b.allocated_size, dtype=np.uint8) for b in blocks]
    for block, values in zip(blocks, data):
        backend._array(block.address, (block.allocated_size,), np.uint8).copy_to_device(values)
    pinned, rounds = {}, []
    for _ in range(2):
        before = [(b.address, b.allocated_size) for b in blocks]
        with STANDIN.recording() as calls:
            big = pool.malloc(110 << 20)
            reclaimed = [not pool.is_resident(b) for b in blocks]
            pool.free(big)
            with pool.use(*blocks):
                after = [(b.address, b.allocated_size) for b in blocks]
        copies, pageable, waits = _copies_of(calls, pinned)
        intact = [bool((backend._array(a, (n,), np.uint8).copy_to_host() == values).all())
                  for (a, n), values in zip(after, data)]
        rounds.append({
            "reclaimed": reclaimed, "intact": intact, "pageable": pageable, "waits": waits,
            "copy_calls": sorted({c.name for c in copies}),
            "streams": sorted({c.args[3] for c in copies}),
            "out": [_chunks_of(copies, "cuMemcpyDtoHAsync", a, n, 1) for a, n in before],
            "back": [_chunks_of(copies, "cuMemcpyHtoDAsync", a, n, 0) for a, n in after],
            "host_allocs": sum(c.name == "cuMemHostAlloc" for c in calls),
            "host_frees": sum(c.name == "cuMemFreeHost" for c in calls)})
    with STANDIN.recording() as calls:          # the check's control: a copy to NumPy
        backend._array(blocks[2].address, (5000,), np.uint8).copy_to_host()
    control = _copies_of(calls, pinned)
    return {"rounds": rounds, "legacy": int(driver.binding.CU_STREAM_LEGACY),
            "control": {"copy_calls": [c.name for c in control[0]], "pageable": control[1]},
            "errors": STANDIN.errors}


def a_user_program():
    """What a user does, every byte checked (NUMBA_ALLOC_CONF, set by the
    test: reclaim on at start-up, defrag on, a 64 MiB limit): many arrays
    allocated and freed; a defragmentation under slices and views of views,
    read back and written by a kernel after the move; reclaim turned off and
    on again; arrays three times the limit in kernel rotation."""
    import numba_alloc
    numba_alloc.install()
    rng = np.random.default_rng(7)
    kernel = jit(add_one)
    live, expected = {}, {}
    for i in range(400):                            # churn: sizes from 1 KiB to 1 MiB
        if live and rng.random() < 0.45:
            key = list(live)[int(rng.integers(len(live)))]
            del live[key], expected[key]
        else:
            n = int(rng.integers(256, 1 << 18))
            live[i] = cuda.to_device(np.full(n, i % 1000, np.float32))
            expected[i] = i % 1000
    gap = cuda.device_array(1 << 20, np.float32)     # freed below: a hole before base
    base = cuda.to_device(np.arange(1 << 20, dtype=np.float32))     # 4 MiB
    del gap
    part = base[1000:500_000]
    view = part[10:200_000:3]                       # a strided view of a view
    before = base.device_ctypes_pointer.value
    moved = numba_alloc.defragment().blocks_moved
    after = base.device_ctypes_pointer.value
    reference = np.arange(1 << 20, dtype=np.float32)
    part_ok = bool((part.copy_to_host() == reference[1000:500_000]).all())
    kernel[64, 256](view)                           # after the move
    reference[1000:500_000][10:200_000:3] += 1
    base_ok = bool((base.copy_to_host() == reference).all())
    churn_ok = all((a.copy_to_host() == expected[k]).all() for k, a in live.items())
    numba_alloc.configure(reclaim=False)
    numba_alloc.configure(reclaim=True)
    rotation = [cuda.to_device(np.full(1 << 21, i, np.float32)) for i in range(24)]  # 3 x limit
    values = list(range(24))
    for step in range(60):
        i = (step * 7) % 24
        kernel[128, 256](rotation[i])
        values[i] += 1
    rotation_ok = all((a.copy_to_host() == values[i]).all() for i, a in enumerate(rotation))
    with numba_alloc.device_pool() as pool:
        stats = pool.memory_stats()
    return {"moved": moved > 0, "base_moved": before != after, "part": part_ok,
            "base": base_ok, "churn": churn_ok, "rotation": rotation_ok,
            "reclaimed": stats["reclaimed_bytes.allocated"] > 0, "errors": STANDIN.errors}


def _outside_the_pool(pool):
    """Bytes of live device memory that are neither the pool's (its
    segments, its backend's scratch) nor the loaded modules' globals."""
    segments = sum(s["total_size"] for s in pool.snapshot()["segments"])
    segments += pool.backend.scratch_bytes
    module_globals = sum(a.size for library in STANDIN.driver.libraries.values()
                         for a in library._globals.values())
    live = sum(a.size for a in STANDIN.driver.memory.live("device"))
    return live - segments - module_globals


def host_arrays_are_staged_in_the_pool():
    """Kernels given NumPy arrays (plain, cuda.In, cuda.InOut; numba-cuda
    0.30 cannot take them on another stream: cuda-core's "NumPy only
    supports stream=None") in a loop, with the plugin: after each
    launch, before any wait, every byte of device memory is the pool's (or a
    module's globals); the arrays come back right; the staging is counted
    and given back. Then a host array over the pool's limit (set by the
    test): OutOfMemoryError from the launch, the pool as before."""
    import numba_alloc
    numba_alloc.install()
    kernel = jit(add_one)
    outside, staged, right = [], 0, True
    for step in range(24):
        n = 1000 + 4099 * step
        host = np.full(n, step, np.float32)
        if step % 3 == 0:
            kernel[32, 128](host)                           # copied in and back
        elif step % 3 == 1:
            kernel[32, 128](cuda.InOut(host))
        else:
            kernel[32, 128](cuda.In(host))                  # not copied back
        staged += (host.nbytes + 511) // 512 * 512
        with numba_alloc.device_pool() as pool:
            outside.append(_outside_the_pool(pool))
        expected = step if step % 3 == 2 else step + 1
        right = right and bool((host == expected).all())
    cuda.synchronize()
    with numba_alloc.device_pool() as pool:
        stats = pool.memory_stats()
        before = pool.snapshot()
    ledger = numba_alloc.memory_ledger()
    module_globals = sum(a.size for library in STANDIN.driver.libraries.values()
                         for a in library._globals.values())
    huge = np.zeros(24 << 20, np.uint8)                     # over the test's 16 MiB limit
    try:
        kernel[32, 128](huge)
        raised = None
    except numba_alloc.OutOfMemoryError:
        raised = "OutOfMemoryError"
    with numba_alloc.device_pool() as pool:
        after = pool.snapshot()
    return {"outside": outside, "right": right, "staged": staged,
            "staged_allocated": stats["staged_bytes.allocated"],
            "staged_current": stats["staged_bytes.current"],
            "staged_peak": stats["staged_bytes.peak"],
            "staged_blocks": stats["staged.allocated"],
            "allocated_now": stats["allocated_bytes.all.current"],
            "ledger_outside": ledger["outside the pool, other processes included"],
            "ledger_used": ledger["device used"], "module_globals": module_globals,
            "driver_used": sum(a.size for a in STANDIN.driver.memory.live("device")),
            "raised": raised, "ooms": after["stats"]["num_ooms"] - before["stats"]["num_ooms"],
            "unchanged": {k: v for k, v in after["stats"].items() if k != "num_ooms"}
            == {k: v for k, v in before["stats"].items() if k != "num_ooms"}
            and after["segments"] == before["segments"],
            "errors": STANDIN.errors}


def _resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def freed_memory_goes_back_to_the_host():
    """Numba's own manager: 40 device and 40 pinned arrays of 16 MiB, each
    written and freed before the next (1280 MiB in all); how much the
    process grew, and what freed pinned memory reads as now."""
    before = _resident_bytes()
    pinned = []
    for i in range(40):
        device = cuda.to_device(np.full(4 << 20, i + 1, np.float32))
        host = cuda.pinned_array(4 << 20, np.float32)
        host[:] = i + 1
        pinned.append(host.ctypes.data)
        del device, host
        cuda.current_context().memory_manager.deallocations.clear()     # cuMem*Free* now
    import ctypes
    return {"grown": _resident_bytes() - before,
            "zeros": all(ctypes.string_at(a, 64) == bytes(64) for a in pinned),
            "errors": STANDIN.errors}


def pinned_arrays_come_from_the_host_cache():
    """With the plugin: a 64 MiB cuda.pinned_array allocated, filled, copied
    to the device and dropped 100 times; a mapped array a kernel writes; a
    managed array counted while it lives;
    then host_cache_limit (a 32 MiB cap refused while 64 MiB are in use,
    taken once they are not: the cached block goes back) and a request over
    it."""
    import numba_alloc
    numba_alloc.install()
    calls = []
    allocate_host = STANDIN.driver.memory.allocate_host

    def counted(*args, **kwargs):
        calls.append(args[0])
        return allocate_host(*args, **kwargs)
    STANDIN.driver.memory.allocate_host = counted
    device = cuda.device_array(1 << 26, np.uint8)
    right = True
    for i in range(100):
        host = cuda.pinned_array(1 << 26, np.uint8)
        host[:4096] = i % 251
        device.copy_to_device(host)                 # asynchronous from pinned memory
        right = right and int(device[4095]) == i % 251
        del host
    mapped = cuda.mapped_array(1000, np.float32)
    mapped[:] = 1
    jit(add_one)[4, 256](mapped)
    cuda.synchronize()
    right = right and bool((mapped == 2).all())
    stats = numba_alloc.host_memory_stats()
    managed = cuda.managed_array(3000, np.float64)
    managed_stats = [numba_alloc.memory_stats()["managed_bytes.current"]]
    del managed
    cuda.current_context().memory_manager.deallocations.clear()    # its cuMemFree now
    managed_stats.append(numba_alloc.memory_stats()["managed_bytes.current"])
    held = cuda.pinned_array(1 << 26, np.uint8)
    try:
        numba_alloc.configure(host_cache_limit="32MiB")
        refused = None
    except RuntimeError as e:
        refused = str(e)
    unchanged = numba_alloc.settings().host_cache_limit is None
    del held
    cuda.synchronize()
    numba_alloc.configure(host_cache_limit="32MiB")
    after = numba_alloc.host_memory_stats()
    try:
        cuda.pinned_array(1 << 26, np.uint8)
        over = None
    except numba_alloc.HostOutOfMemoryError as e:
        over = str(e)
    return {"calls": calls, "right": right, "num_host_alloc": stats["num_host_alloc"],
            "mapped_bytes": stats["mapped_bytes.current"], "managed_bytes": managed_stats,
            "requests": stats["active_requests.allocated"],
            "refused": refused, "unchanged": unchanged,
            "freed_by_limit": after["num_host_free"], "held_after": after["allocated_bytes.current"],
            "over": over, "errors": STANDIN.errors}


def a_third_partys_context_object():
    """numba-cuda's Test3rdPartyContext, around Numba's own use: a Context
    built over the retained primary context and a raw CUdevice, pushed,
    used by Numba, popped; once before Numba has a pool and once while
    Numba's arrays live. numba_alloc's functions keep reporting the pool
    the arrays come from, and the foreign Context reserves nothing."""
    import numba_alloc
    numba_alloc.install()
    kernel = jit(add_one)

    def third_party(work):
        dev = driver.binding.CUdevice(0)
        handle = driver.driver.cuDevicePrimaryCtxRetain(dev)
        ctx = driver.Context(dev, handle)
        try:
            ctx.push()
            same = int(cuda.current_context().handle) == int(ctx.handle)
            work()
        finally:
            ctx.pop()
            driver.driver.cuDevicePrimaryCtxRelease(dev)
        return same, ctx.memory_manager.pool

    first = cuda.device_array(10)

    def fill():
        kernel[1, 32](first)
    same_before, foreign_pool_before = third_party(fill)
    with numba_alloc.device_pool() as pool:
        numba_pool = pool
    kept = cuda.device_array(5000, np.float32)
    same_during, foreign_pool_during = third_party(lambda: None)
    with numba_alloc.device_pool() as pool:
        reported = pool is numba_pool
        stats = pool.memory_stats()
    return {"same": [same_before, same_during],
            "foreign_pools": [foreign_pool_before is None, foreign_pool_during is None],
            "reported": reported, "allocated": stats["allocated_bytes.all.current"],
            "right": first.copy_to_host().tolist() == [1.0] * 10,
            "outside": _outside_the_pool(numba_pool), "kept": kept.nbytes,
            "errors": STANDIN.errors}


def malloc_heap_size_before_the_first_kernel():
    """NUMBA_ALLOC_CONF=malloc_heap_size:32MiB (set by the test) sizes CUDA's
    device malloc heap when the context starts; after a kernel, configure()
    refuses a new size, changing nothing; with NRT on, an out-of-memory
    error names the heap."""
    import numba_alloc
    from numba.cuda.cudadrv.driver import binding as numba_binding
    numba_alloc.install()
    heap = numba_binding.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE
    cuda.current_context()
    at_start = int(driver.driver.cuCtxGetLimit(heap))
    numba_alloc.configure(malloc_heap_size="48MiB")         # no kernel yet: taken
    before_kernel = int(driver.driver.cuCtxGetLimit(heap))
    jit(add_one)[1, 32](cuda.device_array(32, np.float32))
    try:
        numba_alloc.configure(malloc_heap_size="64MiB")
        refused = None
    except RuntimeError as e:
        refused = str(e)
    after = int(driver.driver.cuCtxGetLimit(heap))
    setting = numba_alloc.settings().malloc_heap_size
    messages = []
    for nrt_on in (False, True):
        cuda.config.CUDA_ENABLE_NRT = nrt_on
        try:
            cuda.device_array(1 << 40, np.uint8)
        except numba_alloc.OutOfMemoryError as e:
            messages.append(str(e))
    cuda.config.CUDA_ENABLE_NRT = False
    summary = str(numba_alloc.memory_summary())
    return {"at_start": at_start, "before_kernel": before_kernel, "refused": refused,
            "after": after, "setting": setting, "messages": messages,
            "summary_names_heap": "CUDA device malloc heap" in summary,
            "errors": STANDIN.errors}


def an_arena_leaves_room_for_the_malloc_heap():
    """NUMBA_ALLOC_CONF=growth:false,limit:40MiB (set by the test): the
    headroom an arena without a limit leaves counts the device malloc heap
    (the driver carves it when a kernel using malloc loads); once the arena
    is reserved, a heap larger than the device's free memory is refused,
    changing nothing."""
    import numba_alloc
    numba_alloc.install()
    cuda.device_array(32, np.float32)
    with numba_alloc.device_pool() as pool:
        backend = pool.backend
    GiB = 1 << 30
    before = backend.headroom(80 * GiB)
    numba_alloc.configure(malloc_heap_size="64MiB")    # the arena holds 40 MiB of 256: it fits
    after = backend.headroom(80 * GiB)
    free = backend.memory_info()[0]
    try:
        numba_alloc.configure(malloc_heap_size=free + (1 << 20))
        refused = None
    except RuntimeError as e:
        refused = str(e)
    return {"before": before, "after": after, "refused": refused,
            "setting": numba_alloc.settings().malloc_heap_size,
            "heap": backend.malloc_heap_size(), "errors": STANDIN.errors}


def _a_worker():
    """What NumbaAllocSetup uses of a Dask worker: its name and metrics."""
    from types import SimpleNamespace
    return SimpleNamespace(name="worker-0", metrics={}, plugins={})


def _set_up_refused(plugin, worker, error):
    """What ``plugin.setup(worker)`` raised (an ``error``), or None."""
    try:
        plugin.setup(worker)
    except error as e:
        return str(e)
    return None


def dask_set_up_on_a_gpu_worker():
    """NumbaAllocSetup on a worker whose CUDA Numba has not used yet: Numba's
    manager becomes numba_alloc, with the plugin's settings, and the
    worker's metric reads the pool Numba's arrays come from."""
    import numba_alloc
    from numba_alloc.dask import NumbaAllocSetup
    worker = _a_worker()
    plugin = NumbaAllocSetup("limit:64MiB", defrag=True)
    plugin.setup(worker)
    kept = cuda.to_device(np.arange(1 << 18, dtype=np.float32))     # 1 MiB
    metric = worker.metrics["numba_alloc"](worker)
    settings = numba_alloc.settings(0)
    plugin.teardown(worker)
    return {"manager": type(cuda.current_context().memory_manager).__name__,
            "metric": metric, "kept": kept.nbytes, "limit": settings.limit,
            "defrag": settings.defrag, "metric_after_teardown": "numba_alloc" in worker.metrics,
            "errors": STANDIN.errors}


def dask_set_up_after_numba_used_cuda():
    """NumbaAllocSetup on a worker where a task already used CUDA with
    Numba's own manager (and GPU 0 was given a setting of its own): a
    RuntimeError that names the worker and what to do, and the worker's
    metrics and settings untouched."""
    import numba_alloc
    from numba_alloc.dask import NumbaAllocSetup
    cuda.device_array(16)
    numba_alloc.set_memory_growth(0, False)
    worker = _a_worker()
    raised = _set_up_refused(NumbaAllocSetup("limit:64MiB,growth:true"), worker, RuntimeError)
    return {"raised": raised, "metrics": sorted(worker.metrics),
            "limit": numba_alloc.settings().limit, "growth": numba_alloc.settings().growth,
            "gpu_growth": numba_alloc.settings(0).growth, "errors": STANDIN.errors}


def dask_set_up_whose_pool_is_refused():
    """NumbaAllocSetup(expandable_segments=True) on a worker whose GPU
    cannot map pages (stood in): the pool cannot be made with it, a
    ValueError names the worker, the settings are put back, and a task's
    allocation then works."""
    import numba_alloc
    from numba_alloc.dask import NumbaAllocSetup
    standin.binding.ATTRIBUTES["VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED"] = 0
    worker = _a_worker()
    raised = _set_up_refused(NumbaAllocSetup(expandable_segments=True), worker, ValueError)
    expandable = numba_alloc.settings().expandable_segments
    right = bool((cuda.to_device(np.arange(100)).copy_to_host() == np.arange(100)).all())
    return {"raised": raised, "metrics": sorted(worker.metrics), "expandable": expandable,
            "right": right, "errors": STANDIN.errors}


def dask_set_up_with_reclaim_refused():
    """NumbaAllocSetup(reclaim=True) on a worker whose numba-cuda the
    reclaim hooks do not support (stood in): the ValueError, and Numba's
    contexts made afterwards keep Numba's own manager."""
    import numba_alloc.plugin.activity
    from numba_alloc.dask import NumbaAllocSetup
    numba_alloc.plugin.activity.unsupported_reason = lambda: "numba-cuda 9.9 is not supported"
    worker = _a_worker()
    raised = _set_up_refused(NumbaAllocSetup(reclaim=True), worker, ValueError)
    return {"raised": raised, "metrics": sorted(worker.metrics),
            "manager": type(cuda.current_context().memory_manager).__name__,
            "errors": STANDIN.errors}


def dask_set_up_whose_history_cannot_start():
    """NumbaAllocSetup("limit:64MiB", defrag=True, history=True) on a GPU
    worker: the pool is made with the plugin's settings, then the driver
    refuses (once) the cuMemGetInfo that starting its history makes (the
    pool's snapshot). Set-up fails, a RuntimeError naming the worker (also
    in ``failure``), the driver's error its cause; the settings, the
    metric and the history as before it; a second set-up works."""
    import numba_alloc
    from numba_alloc.dask import NumbaAllocSetup, worker_plugin
    from numba_alloc.observe.history import history_of
    record, refused = worker_plugin.record_history, []

    def record_refused(*args, **kwargs):
        if not refused:
            refused.append(_refuse_once("cuMemGetInfo"))
        return record(*args, **kwargs)
    worker_plugin.record_history = record_refused
    worker = _a_worker()
    plugin = NumbaAllocSetup("limit:64MiB", defrag=True, history=True)
    try:
        plugin.setup(worker)
        raised = message = None
    except RuntimeError as e:
        raised, message = e.__cause__.code.name, str(e)

    def seen():
        settings = numba_alloc.settings(0)
        with numba_alloc.device_pool() as pool:
            recording = history_of(pool) is not None
        return {"limit": settings.limit, "defrag": settings.defrag,
                "defaults": [numba_alloc.settings().limit, numba_alloc.settings().defrag],
                "metrics": sorted(worker.metrics), "recording": recording}
    failed = seen()
    failure = plugin.failure
    plugin.setup(worker)
    return {"raised": raised, "message": message, "refused": refused[0], "failure": failure,
            "failed": failed, "again": seen(), "errors": STANDIN.errors}


def dask_unspill_lands_in_the_pool():
    """A Numba array Dask spilled to host memory (its dask serializer) and
    unspilled: distributed's deserializer hands it to RMM where rmm can be
    imported (here a stand-in that records the call); once
    numba_alloc.dask has registered its own, the array is a block of the
    pool, with the same values, and RMM is not asked."""
    import numba_alloc
    from distributed.protocol import numba as distributed_numba
    from distributed.protocol.serialize import deserialize, serialize
    from numba_alloc.dask import unspill
    numba_alloc.install()
    asked_rmm = []

    def rmm_device_buffer(header, frames):
        """As distributed.protocol.rmm's: the bytes in device memory RMM
        allocates (here cuMemAlloc, outside the pool)."""
        asked_rmm.append(header["shape"])
        host = np.asarray(memoryview(frames[0])).view(np.uint8)
        memory = driver.MemoryPointer(None, driver.driver.cuMemAlloc(host.nbytes), host.nbytes)
        driver.host_to_device(memory, host, host.nbytes)
        return DeviceNDArray((host.nbytes,), (1,), np.dtype(np.uint8), gpu_data=memory)
    distributed_numba.dask_deserialize_rmm_device_buffer = rmm_device_buffer
    original = cuda.to_device(np.arange(5000, dtype=np.float32).reshape(50, 100))
    header, frames = serialize(original, serializers=("dask",))
    out = {"asked_rmm": [], "in_pool": [], "right": []}
    with numba_alloc.device_pool() as pool:
        for registered in (False, True):
            if registered:
                unspill.register()
            asked, allocated = len(asked_rmm), numba_alloc.memory_allocated(pool)
            back = deserialize(header, frames)
            address = back.device_ctypes_pointer.value
            live = [(b["address"], b["size"]) for s in pool.snapshot()["segments"]
                    for b in s["blocks"] if b["state"] == "active_allocated"]
            out["asked_rmm"].append(len(asked_rmm) - asked)
            out["in_pool"].append(any(start <= address < start + size for start, size in live))
            out["right"].append(bool((back.copy_to_host() == original.copy_to_host()).all()))
        out["grew"] = numba_alloc.memory_allocated(pool) - allocated
    return {**out, "nbytes": back.nbytes, "shape": list(back.shape), "errors": STANDIN.errors}


def staging_a_host_argument_moves_no_argument():
    """With defrag on and growth off (NUMBA_ALLOC_CONF, set by the test):
    every other 1 MiB array freed, then a kernel given a device array and a
    5 MiB NumPy array, which only a defragmentation could make room for.
    Staging the NumPy array must not move the device array, whose address
    the launch has read: the launch is out of memory, or right. With
    SCENARIO_RECLAIM_MID_LAUNCH set, another thread turns the pool's reclaim
    on while the launch (begun with it off: its arrays untracked) stages the
    NumPy array."""
    import gc
    import os
    import threading
    import numba_alloc
    from numba_alloc.plugin import staging
    numba_alloc.install()
    if os.environ.get("SCENARIO_RECLAIM_MID_LAUNCH"):
        allocate = staging.PoolMemoryResource.allocate

        def reclaim_turned_on(self, size, *, stream=None):
            with numba_alloc.device_pool() as pool:
                other = threading.Thread(target=pool.configure, kwargs={"reclaim": True})
            other.start()
            other.join()
            return allocate(self, size, stream=stream)
        staging.PoolMemoryResource.allocate = reclaim_turned_on

    @cuda.jit
    def add(x, y, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = x[i] + y[i]

    def run():
        n = 1 << 18                                 # 1 MiB of float32
        arrays = [cuda.to_device(np.full(n, j, np.float32)) for j in range(39)]
        x, out = arrays[2], arrays[4]
        keep = arrays[::2] + [arrays[38]]
        del arrays
        gc.collect()
        cuda.current_context().memory_manager.deallocations.clear()
        cuda.synchronize()
        host_y = np.full(5 * n, 1000, np.float32)
        defrags = numba_alloc.get_num_defragmentations()
        try:
            add[256, 256](x, host_y, out)
            cuda.synchronize()
            raised = None
        except Exception as e:      # noqa: BLE001 - what it raised is the result
            raised = type(e).__name__
        result = {"raised": raised, "right": bool((out.copy_to_host() == 1002).all()),
                  "x_intact": bool((x.copy_to_host() == 2).all()),
                  "defragmentations": numba_alloc.get_num_defragmentations() - defrags}
        del keep
        return result
    return {**run(), "errors": STANDIN.errors}


def an_argument_extension_allocating_moves_no_argument():
    """With defrag on and reclaim off (NUMBA_ALLOC_CONF, set by the test):
    a kernel with a numba-cuda argument extension that copies NumPy
    arguments to the device (cuda.to_device: the pool), given a tuple of
    pool arrays and then a 3 MiB host array only a defragmentation could
    make room for. The launch has read the tuple's addresses when the
    extension allocates: nothing may move (OutOfMemoryError), and the
    arrays keep their bytes."""
    import gc
    import numba_alloc
    numba_alloc.install()

    class ToDevice:
        def prepare_args(self, ty, val, stream=0, retr=None):
            if isinstance(val, np.ndarray):
                return ty, cuda.to_device(val, stream=stream)
            return ty, val

    def bump(arrays, host):
        i = cuda.grid(1)
        if i < 16:
            for a in arrays:
                a[i] += 1

    kernel = cuda.jit(bump, extensions=[ToDevice()])
    size = (1 << 18) + 128                          # 1 MiB + 512 B of float32
    arrays = []
    while True:                                     # fill the limit
        try:
            arrays.append(cuda.to_device(np.full(size, len(arrays), np.float32)))
        except numba_alloc.OutOfMemoryError:
            break
    held = arrays[::2]                              # values 0, 2, 4, ...
    keep = tuple(held[:8])
    del arrays
    gc.collect()
    cuda.current_context().memory_manager.deallocations.clear()
    cuda.synchronize()
    addresses = [a.device_ctypes_pointer.value for a in keep]
    try:
        kernel[1, 32](keep, np.zeros(3 << 18, np.float32))
        raised = None
    except numba_alloc.OutOfMemoryError as e:
        raised = str(e)
    cuda.synchronize()
    return {"raised": raised, "defragmentations": numba_alloc.get_num_defragmentations(),
            "moved": [a.device_ctypes_pointer.value != b for a, b in zip(keep, addresses)],
            "values": [float(a.copy_to_host()[0]) for a in keep], "errors": STANDIN.errors}


def _refuse_once(name):
    """Make the stand-in's driver refuse its next ``name`` call (a cu*
    function) with CUDA_ERROR_UNKNOWN, then answer as before (also when
    numba-cuda has called it before); returns a list that holds ``name``
    once it has refused."""
    from cuda.bindings import driver as real
    functions = STANDIN.binding._functions
    original, refused = functions[name], []
    vars(driver.driver).pop(name, None)     # Numba's driver keeps what it first looked up

    def refuse_once(*args):
        if refused:
            return original(*args)
        refused.append(name)
        return (real.CUresult.CUDA_ERROR_UNKNOWN,)
    functions[name] = refuse_once
    vars(driver.driver).pop(name, None)     # bound at its first call: bind the refusing one
    return refused


def a_pool_set_up_that_fails_gives_its_memory_back():
    """The driver refuses a call the plugin's pool set-up makes (the
    SCENARIO_CALL variable names it) once: the first array raises, a retry
    works, and no device memory is left outside the pool (the failed
    set-up's scratch went back)."""
    import os
    import numba_alloc
    numba_alloc.install()
    name = os.environ["SCENARIO_CALL"]
    refused = _refuse_once(name)
    try:
        cuda.device_array(1000)
        raised = None
    except Exception as e:      # noqa: BLE001 - what it raised is the result
        raised = type(e).__name__
    retry = cuda.device_array(1000)
    retry.copy_to_device(np.arange(1000.0))
    with numba_alloc.device_pool() as pool:
        outside = _outside_the_pool(pool)
        ours = pool is cuda.current_context().memory_manager.pool
    return {"raised": raised, "refused": refused == [name], "outside": outside,
            "ours": ours, "right": retry.copy_to_host()[:3].tolist() == [0.0, 1.0, 2.0],
            "errors": STANDIN.errors}


def a_failed_cuda_close_can_be_retried():
    """The plugin's pool with a live array and a cached free block; the
    driver refuses (CUDA_ERROR_UNKNOWN) the SCENARIO_CALL variable's call
    once while cuda.close() returns the pool's memory: what each close
    raised (up to three), whether the pool held across them still answers
    with its own figures, then whether GPU 0's next use works with a new
    pool and its bytes read back."""
    import gc
    import os
    import numba_alloc
    numba_alloc.install()
    name = os.environ["SCENARIO_CALL"]
    live = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
    if os.environ.get("SCENARIO_LAUNCH"):       # a module loaded, a free's event queued
        jit(add_one)[64, 256](live)
        jit(add_one)[64, 256](live[::-1])
    freed = cuda.to_device(np.arange(1 << 18, dtype=np.float32))
    del freed
    gc.collect()
    with numba_alloc.device_pool() as old:
        pass
    refused = _refuse_once(name)
    closes = []
    for _ in range(3):
        try:
            cuda.close()
            closes.append(None)
            break
        except driver.CudaAPIError as e:
            closes.append(e.code.name)
    del live
    gc.collect()
    try:
        kept = old.memory_stats()["num_device_alloc"] > 0 and old.snapshot()["device"] is None
    except Exception as e:      # noqa: BLE001 - what it raised is the result
        kept = f"{type(e).__name__}: {e}"
    try:
        again = cuda.to_device(np.arange(1000, dtype=np.float32))
        right = again.copy_to_host()[:3].tolist() == [0.0, 1.0, 2.0]
        with numba_alloc.device_pool() as pool:
            new = pool is not old and pool.backend.context_alive
    except driver.CudaAPIError as e:
        right, new = e.code.name, False
    return {"closes": closes, "refused": refused == [name], "right": right, "new_pool": new,
            "kept": kept, "errors": [e for e in STANDIN.errors if e[0] != name]}


def expandable_segments_map_pages_under_one_range():
    """A Pool over the real device backend (CudaDevice) with
    expandable_segments and defrag on, a 28 MiB limit: eight 3 MiB blocks
    of random bytes grow one mapped run page by page (the driver's virtual
    memory calls, no cuMemAlloc); every other one freed, empty_cache gives
    the whole free pages back (cuMemUnmap, cuMemRelease: cuMemGetInfo's
    free grows); 14 MiB, which fits only once the live blocks slide
    together, is served, and the blocks' bytes follow them; reset unmaps
    every page and frees the range. Every byte read back at each step."""
    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice

    from invariants import check
    backend = CudaDevice(cuda.current_context())
    copy_error = backend.load_copy_kernel()
    pool = Pool(backend, expandable_segments=True, defrag=True, limit=28 << 20)
    rng = np.random.default_rng(5)
    live = {}

    def intact():
        return all(bool((backend._array(b.address, (b.size,), np.uint8).copy_to_host()
                         == data).all()) for b, data in live.items())

    def names(calls, *wanted):
        return {name: sum(c.name == name for c in calls) for name in wanted}

    with STANDIN.recording() as calls:
        for _ in range(8):
            block = pool.malloc(3 << 20)
            live[block] = rng.integers(0, 256, block.size, dtype=np.uint8)
            backend._array(block.address, (block.size,), np.uint8).copy_to_device(live[block])
    grown = names(calls, "cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                  "cuMemAlloc")
    check(pool)
    steps = {"grown": grown, "pages": len(backend._page_handles), "intact_grown": intact()}
    for block in list(live)[::2]:
        pool.free(block)
        del live[block]
    pool.synchronize()
    free_before = backend.memory_info()[0]
    with STANDIN.recording() as calls:
        pool.empty_cache()
    check(pool)
    steps.update(emptied=names(calls, "cuMemUnmap", "cuMemRelease"),
                 freed_bytes=backend.memory_info()[0] - free_before,
                 pages_after_empty=len(backend._page_handles), intact_emptied=intact())
    big = pool.malloc(14 << 20)
    check(pool)
    steps.update(big_served=big is not None,
                 defragmentations=pool.memory_stats()["num_defragmentations"],
                 reserved=pool.stats.current("reserved_bytes"), intact_slid=intact())
    pool.free(big)
    live.clear()
    pool.reset()
    steps.update(pages_after_reset=len(backend._page_handles),
                 ranges_after_reset=len(backend._reserved),
                 live_mappings=sum(a.physical is not None for a in STANDIN.memory.live()))
    return {**steps, "copy_error": copy_error, "page_size": backend.page_size,
            "errors": STANDIN.errors}


def a_failed_move_table_upload_keeps_no_frame_alive():
    """expandable_segments_map_pages_under_one_range's pool after its
    empty_cache: the 14 MiB request fits only once page_room slides the
    live blocks down, and the driver refuses (once) the upload of the copy
    kernel's move table (cuMemcpyHtoD). The request raises
    DefragmentationError; once it is handled, what only the request's
    frames held is freed at once with the garbage collector off (no
    reference cycle through the backend's error keeps the frames); every
    block keeps its bytes; the request is then served."""
    import gc
    import weakref

    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice
    from numba_alloc.policy.errors import DefragmentationError

    from invariants import check
    backend = CudaDevice(cuda.current_context())
    copy_error = backend.load_copy_kernel()
    pool = Pool(backend, expandable_segments=True, defrag=True, limit=28 << 20)
    rng = np.random.default_rng(5)
    live = {}
    for _ in range(8):
        block = pool.malloc(3 << 20)
        live[block] = rng.integers(0, 256, block.size, dtype=np.uint8)
        backend._array(block.address, (block.size,), np.uint8).copy_to_device(live[block])
    for block in list(live)[::2]:
        pool.free(block)
        del live[block]
    pool.synchronize()
    pool.empty_cache()

    class Held:
        pass

    def request(held):
        return pool.malloc(14 << 20)
    held = Held()
    alive = weakref.ref(held)
    refused = _refuse_once("cuMemcpyHtoD")
    gc.collect()
    gc.disable()
    try:
        try:
            request(held)
            raised = None
        except DefragmentationError as e:
            raised = str(e)
        del held
        freed = alive() is None
    finally:
        gc.enable()
    check(pool)
    intact = all(bool((backend._array(b.address, (b.size,), np.uint8).copy_to_host()
                       == data).all()) for b, data in live.items())
    served = pool.malloc(14 << 20) is not None
    check(pool)
    return {"raised": raised, "refused": refused, "freed": freed, "intact": intact,
            "served": served, "copy_error": copy_error, "errors": STANDIN.errors}


def expandable_segments_runs_move_by_remapping_their_pages():
    """A Pool over CudaDevice with expandable_segments and defrag on, a 10
    MiB limit: 3 MiB blocks of random bytes at 0 and 6 MiB of the range,
    each in a run of two pages (the block between freed, empty_cache), so
    that a 4 MiB request fits only once the second run moves down against
    the first. With SCENARIO_CODE (an error code name) the driver refuses
    the remap's second cuMemMap: the request raises, the pages, stats and
    bytes are as before, then it is served. Reports the driver calls of
    the request that is served and whether every byte is right."""
    import os

    from cuda.bindings import driver as real

    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice

    from invariants import check
    functions = STANDIN.binding._functions
    armed = {}

    def refusing(original):
        def call(*args):
            left = armed.get("cuMemMap")
            if left is not None:
                left[0] -= 1
                if not left[0]:
                    del armed["cuMemMap"]
                    return (getattr(real.CUresult, os.environ["SCENARIO_CODE"]),)
            return original(*args)
        return call
    functions["cuMemMap"] = refusing(functions["cuMemMap"])
    backend = CudaDevice(cuda.current_context())
    copy_error = backend.load_copy_kernel()
    pool = Pool(backend, expandable_segments=True, defrag=True, limit=10 << 20)
    rng = np.random.default_rng(7)
    blocks = [pool.malloc(3 << 20) for _ in range(3)]
    pool.free(blocks.pop(1))
    pool.synchronize()
    pool.empty_cache()
    live = {}
    for block in blocks:
        live[block] = rng.integers(0, 256, block.size, dtype=np.uint8)
        backend._array(block.address, (block.size,), np.uint8).copy_to_device(live[block])

    def intact():
        return all(bool((backend._array(b.address, (b.size,), np.uint8).copy_to_host()
                         == data).all()) for b, data in live.items())

    def state():
        return (sorted(backend._page_handles.items()),
                pool.memory_stats()["reserved_bytes.all.current"], [b.address for b in blocks])
    out = {"runs": len(pool._runs()), "refused": None}
    if "SCENARIO_CODE" in os.environ:
        before = state()
        armed["cuMemMap"] = [2]
        try:
            pool.malloc(4 << 20)
        except Exception as e:      # noqa: BLE001 - what it raised is the result
            out["refused"] = type(e).__name__
        check(pool)
        out.update(as_before=state() == before, intact_refused=intact())
    moved = blocks[1].address
    with STANDIN.recording() as calls:
        served = pool.malloc(4 << 20)
    check(pool)
    counts = {name: sum(c.name == name for c in calls)
              for name in ("cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease")}
    out.update(served=served is not None, calls=counts, moved=blocks[1].address != moved,
               reserved=pool.stats.current("reserved_bytes"), runs_after=len(pool._runs()),
               intact=intact())
    pool.reset()
    return {**out, "copy_error": copy_error, "errors": STANDIN.errors,
            "live_mappings": sum(a.physical is not None for a in STANDIN.memory.live())}


def numba_arrays_follow_runs_moved_by_remapping():
    """The plugin with expandable_segments and defrag on and a 10 MiB limit
    (NUMBA_ALLOC_CONF, set by the test): two 3 MiB arrays in runs of two
    pages apart (the array between them dropped, empty_cache), then a 4
    MiB array, which fits only once the second run moves down by
    remapping; every array reads back right after."""
    import gc
    import numba_alloc
    numba_alloc.install()
    n = (3 << 20) // 4
    arrays = [cuda.to_device(np.arange(n, dtype=np.float32) + j) for j in range(3)]
    del arrays[1]
    gc.collect()
    cuda.current_context().memory_manager.deallocations.clear()
    cuda.synchronize()
    numba_alloc.empty_cache()
    first = arrays[1].device_ctypes_pointer.value
    with STANDIN.recording() as calls:
        big = cuda.to_device(np.full(1 << 20, 7, np.float32))
    remapped = (sum(c.name == "cuMemMap" for c in calls)
                - sum(c.name == "cuMemCreate" for c in calls))
    right = [bool((a.copy_to_host() == np.arange(n, dtype=np.float32) + j).all())
             for a, j in zip(arrays, (0, 2))]
    return {"right": right, "big_right": bool((big.copy_to_host() == 7).all()),
            "moved": arrays[1].device_ctypes_pointer.value != first, "remapped": remapped,
            "errors": STANDIN.errors}


def expandable_segments_refused_unmaps_and_releases_leave_nothing_behind():
    """A Pool over CudaDevice with expandable_segments on, the driver
    refusing (CUDA_ERROR_UNKNOWN) once: the SCENARIO_CASE names which.
    'unmap': empty_cache's second cuMemUnmap of a three-page free block;
    'release': empty_cache's cuMemRelease of a free page; 'rollback': a
    request's third cuMemMap and then the first cuMemUnmap undoing it.
    After each: the pool's invariants (the device maps exactly the pages
    of its mapped segments), what raised, the reserved bytes, a request
    that is then served and whose bytes read back, and once the pool is
    reset no page, handle or range left on the device."""
    import os

    from cuda.bindings import driver as real

    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice

    from invariants import check
    functions = STANDIN.binding._functions
    armed = {}                      # call name -> calls left until the refused one

    def refusing(name, original):
        def call(*args):
            if name in armed:
                armed[name] -= 1
                if not armed[name]:
                    del armed[name]
                    return (real.CUresult.CUDA_ERROR_UNKNOWN,)
            return original(*args)
        return call
    for name in ("cuMemMap", "cuMemUnmap", "cuMemRelease"):
        functions[name] = refusing(name, functions[name])
    backend = CudaDevice(cuda.current_context())
    pool = Pool(backend, expandable_segments=True, limit=64 << 20)
    case = os.environ["SCENARIO_CASE"]
    keep = pool.malloc(2 << 20)
    if case == "rollback":
        armed.update(cuMemMap=3, cuMemUnmap=1)
        action = lambda: pool.malloc(9 << 20)       # noqa: E731
    else:
        freed = pool.malloc(6 << 20 if case == "unmap" else 2 << 20)
        last = pool.malloc(2 << 20)                 # the free block stays inside the run
        pool.free(freed)
        pool.synchronize()
        armed.update({"unmap": {"cuMemUnmap": 2}, "release": {"cuMemRelease": 1}}[case])
        action = pool.empty_cache
    reserved = pool.stats.current("reserved_bytes")
    try:
        action()
        raised = None
    except Exception as e:      # noqa: BLE001 - what it raised is the result
        raised = type(e).__name__
    check(pool)
    out = {"raised": raised, "refused": not armed,
           "reserved_change": pool.stats.current("reserved_bytes") - reserved}
    block = pool.malloc(9 << 20)
    data = np.arange(block.size, dtype=np.uint64).astype(np.uint8)
    backend._array(block.address, (block.size,), np.uint8).copy_to_device(data)
    out["right"] = bool((backend._array(block.address, (block.size,), np.uint8)
                         .copy_to_host() == data).all())
    check(pool)
    for b in (block, keep) + (() if case == "rollback" else (last,)):
        pool.free(b)
    pool.reset()
    out.update(left={"pages": len(backend._page_handles), "stray": len(backend._stray),
                     "unreleased": len(backend._unreleased), "ranges": len(backend._reserved),
                     "handles": len(STANDIN.memory._physical),
                     "mappings": sum(a.physical is not None for a in STANDIN.memory.live())})
    return {**out, "errors": STANDIN.errors}


def ipc_export_under_expandable_segments():
    """The plugin with expandable_segments on (NUMBA_ALLOC_CONF, set by the
    test): a 4 MiB array lies in mapped pages, which the stand-in's
    cuIpcGetMemHandle refuses (cuMemCreate memory, as CUDA's does): its
    export first moves it into a segment of its own (cuMemAlloc), and it
    and a view of it keep their bytes at the new address; a 1 KiB array
    (the small pool's cuMemAlloc segment) exports where it is. With
    SCENARIO_RECLAIMED set (and reclaim on), the 4 MiB array is in host
    memory when exported: it comes back, into mapped pages, and moves."""
    import os
    import numba_alloc
    numba_alloc.install()
    big = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
    if os.environ.get("SCENARIO_RECLAIMED"):
        pressure = [cuda.device_array(1 << 20, np.float32) for _ in range(4)]
        if big.gpu_data.block.segment is not None:
            raise AssertionError("the array was not reclaimed")
        del pressure
    tail = big[1000:]
    small = cuda.device_array(256, np.float32)
    old = big.gpu_data.block.address
    mapped = [big.gpu_data.block.segment is None or big.gpu_data.block.segment.mapped,
              small.gpu_data.block.segment.mapped]
    big_handle = big.get_ipc_handle()
    handle = small.get_ipc_handle()
    return {"mapped": mapped, "moved": big.device_ctypes_pointer.value != old,
            "big_mapped_after": big.gpu_data.block.segment.mapped,
            "big_pins": big.gpu_data.block.pinned, "big_size": big_handle._ipc_handle.size,
            "right": bool((big.copy_to_host() == np.arange(1 << 20, dtype=np.float32)).all()
                          and (tail.copy_to_host() == np.arange(1000, 1 << 20,
                                                                dtype=np.float32)).all()),
            "small_pins": small.gpu_data.block.pinned, "small_size": handle._ipc_handle.size,
            "errors": STANDIN.errors}


def expandable_segments_refused_mapping_leaves_nothing_behind():
    """A Pool over CudaDevice with expandable_segments on: the driver
    refuses a request's third cuMemMap (SCENARIO_CODE: an error code name),
    then its second cuMemCreate: the request raises (OUT_OF_MEMORY: the
    pool's OutOfMemoryError), the pool's stats are as before, no page of it
    stays mapped or allocated on the device, and the same request then
    works, its bytes right."""
    import os

    from cuda.bindings import driver as real

    from numba_alloc import Pool
    from numba_alloc.backends.cuda_device import CudaDevice

    from invariants import check
    functions = STANDIN.binding._functions
    code = getattr(real.CUresult, os.environ["SCENARIO_CODE"])
    armed = {}                      # call name -> [calls left until the refused one]

    def refusing(name, original):
        def call(*args):
            left = armed.get(name)
            if left is not None:
                left[0] -= 1
                if not left[0]:
                    del armed[name]
                    return (code,)
            return original(*args)
        return call
    for name in ("cuMemMap", "cuMemCreate"):    # before numba-cuda's driver caches them
        functions[name] = refusing(name, functions[name])
    backend = CudaDevice(cuda.current_context())
    pool = Pool(backend, expandable_segments=True)
    first = pool.malloc(3 << 20)                # a run of two pages
    outcomes = []
    for name, nth in (("cuMemMap", 3), ("cuMemCreate", 2)):
        armed[name] = [nth]
        stats, device_bytes = pool.memory_stats(), STANDIN.memory.device_bytes
        try:
            pool.malloc(9 << 20)
            raised = None
        except Exception as e:      # noqa: BLE001 - what it raised is the result
            raised = type(e).__name__
        check(pool)
        outcomes.append({"call": name, "raised": raised, "refused": name not in armed,
                         "stats_changed": sorted(k for k, v in pool.memory_stats().items()
                                                 if stats.get(k) != v),
                         "device_bytes_kept": STANDIN.memory.device_bytes == device_bytes,
                         "pages": len(backend._page_handles)})
    block = pool.malloc(9 << 20)
    data = np.arange(block.size, dtype=np.uint64).astype(np.uint8)
    backend._array(block.address, (block.size,), np.uint8).copy_to_device(data)
    right = bool((backend._array(block.address, (block.size,), np.uint8).copy_to_host()
                  == data).all())
    pool.free(first)
    pool.free(block)
    pool.reset()
    return {"outcomes": outcomes, "right": right,
            "left": len(STANDIN.memory._physical) + len(backend._page_handles),
            "errors": [e for e in STANDIN.errors if "refuse" not in e[1]]}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
