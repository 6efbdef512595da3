"""Scenarios of two devices over the driver stand-in, each run in a fresh
process (test_devices_standin.py): ``python devices_standin.py NAME``
prints one JSON line of what happened. The plugin is Numba's memory
manager; NUMBA_ALLOC_CONF comes from the test."""

import gc
import json
import sys

import standin

STANDIN = standin.install(capacity=256 << 20, devices=2)

import numpy as np  # noqa: E402 (after the stand-in, before CUDA is used)
from numba import cuda  # noqa: E402
from numba.cuda.cudadrv.driver import driver  # noqa: E402

import numba_alloc  # noqa: E402

numba_alloc.install()

FLOATS_A_MIB = 1 << 18


def bring_back_inside_another_devices_call():
    """Device 1's array, reclaimed, is brought back by its copy_to_host made
    while device 0 is current (Numba attaches device 0's context for the
    call), and making room for it on device 1 defragments device 1's pool:
    the copy kernel must run in device 1's context."""
    with cuda.gpus[1]:
        big = cuda.to_device(np.full(8 * FLOATS_A_MIB, 7.0, np.float32))
        smalls = [cuda.to_device(np.full(FLOATS_A_MIB, i, np.float32)) for i in range(8)]
        other = cuda.device_array(8 * FLOATS_A_MIB, np.float32)      # reclaims big
        reclaimed = numba_alloc.memory_stats(1)["reclaimed_bytes.allocated"]
        del other
        smalls[0:8:2] = [None] * 4                  # 4 MiB scattered beside 8 MiB free
        gc.collect()
        filler = cuda.device_array(4 * FLOATS_A_MIB, np.float32)    # into the 8 MiB hole
    cuda.select_device(0)
    host = np.empty(8 * FLOATS_A_MIB, np.float32)
    big.copy_to_host(host)
    kept = [s.copy_to_host().tolist()[:1] for s in smalls if s is not None]
    stats = numba_alloc.memory_stats(1)
    del filler
    return {"reclaimed_before": reclaimed, "big_right": bool((host == 7.0).all()),
            "smalls": kept, "defragmentations": stats["num_defragmentations"],
            "device0_defragmentations": numba_alloc.memory_stats(0)["num_defragmentations"],
            "errors": STANDIN.errors}


@cuda.jit
def _plus_one(source, destination):
    i = cuda.grid(1)
    if i < source.size:
        destination[i] = source[i] + 1


def _read_from_another_device(by):
    """Device 1's reclaimed array is brought back by a launch on device 1's
    stream 0 that only reads it (the copies that bring it back are queued
    on device 1's legacy default stream, not waited for: the launch follows
    them), then read while device 0 is current (a read after a read: no
    need to wait for device 1's launch), by a copy to the host (``by``
    "copy") or by a launch on device 0 into a device 0 array ("launch"),
    each queued in device 0's context, which does not follow device 1's
    work: the read must wait for the copies first."""
    n = 4 * FLOATS_A_MIB
    with cuda.gpus[1]:
        big = cuda.to_device(np.full(n, 7.0, np.float32))
        other = cuda.device_array(14 * FLOATS_A_MIB, np.float32)    # reclaims big
        reclaimed = numba_alloc.memory_stats(1)["reclaimed_bytes.allocated"]
        del other
        gc.collect()
        beside = cuda.device_array(n, np.float32)
        _plus_one[n // 256, 256](big, beside)           # brings big back, reads it
    cuda.select_device(0)
    if by == "launch":
        out = cuda.device_array(n, np.float32)
        _plus_one[n // 256, 256](big, out)
        values = out.copy_to_host()
    else:
        values = big.copy_to_host()
    return {"reclaimed_before": reclaimed, "values": sorted(set(values.tolist())),
            "errors": STANDIN.errors}


def read_by_a_copy_from_another_device():
    return _read_from_another_device("copy")


def read_by_a_launch_on_another_device():
    return _read_from_another_device("launch")


def _queued_on_device_0_reading(arrays):
    """A launch on device 0 per device 1 array of ``arrays``, each writing
    its array's values plus one into a device 0 array, queued (Numba
    queues it in device 0's context, whose work device 1's
    synchronization does not wait for) and not waited for: the outputs."""
    cuda.select_device(0)
    outs = [cuda.device_array(a.size, np.float32) for a in arrays]
    for a, out in zip(arrays, outs):
        _plus_one[a.size // 256, 256](a, out)
    return outs


def reclaim_while_another_device_reads():
    """Device 1's array read by a launch queued on device 0, then a device
    1 request (growth off: one arena) that reclaims it and writes 1s where
    it was: the launch must have read it first."""
    n = 4 * FLOATS_A_MIB
    with cuda.gpus[1]:
        x = cuda.to_device(np.full(n, 7.0, np.float32))
    [out] = _queued_on_device_0_reading([x])
    with cuda.gpus[1]:
        big = cuda.to_device(np.full(14 * FLOATS_A_MIB, 1.0, np.float32))    # reclaims x
        reclaimed = numba_alloc.memory_stats(1)["reclaimed_bytes.allocated"]
    values = sorted(set(out.copy_to_host().tolist()))
    del big
    return {"reclaimed": reclaimed, "values": values, "errors": STANDIN.errors}


def defragmentation_while_another_device_reads():
    """Device 1's arrays (every other one dropped) read by launches queued
    on device 0, then a device 1 request (growth off) that defragments
    device 1's pool, moving them, and writes 100s where they were: the
    launches must have read them first."""
    with cuda.gpus[1]:
        smalls = [cuda.to_device(np.full(FLOATS_A_MIB, i, np.float32)) for i in range(16)]
        kept = smalls[1::2]
        del smalls
        gc.collect()
        cuda.synchronize()
    outs = _queued_on_device_0_reading(kept)
    with cuda.gpus[1]:
        big = cuda.to_device(np.full(6 * FLOATS_A_MIB, 100.0, np.float32))  # moves them
        defragmentations = numba_alloc.memory_stats(1)["num_defragmentations"]
    values = [sorted(set(out.copy_to_host().tolist())) for out in outs]
    del big
    return {"defragmentations": defragmentations, "values": values, "errors": STANDIN.errors}


PINNED_FLOATS = 1 << 16


def _pinned_given_back_while_device_1_copies_into_it():
    """A pinned array taken while device 0 is current (device 0's pool's
    host cache), an async copy into it queued on a stream of device 1 and
    not waited for, the array dropped: (its address, the stream)."""
    cuda.select_device(0)
    host = cuda.pinned_array(PINNED_FLOATS, np.float32)
    address = host.ctypes.data
    with cuda.gpus[1]:
        source = cuda.to_device(np.full(PINNED_FLOATS, 5.0, np.float32))
        stream = cuda.stream()
        source.copy_to_host(host, stream=stream)
    del host
    gc.collect()
    return address, stream


def pinned_block_waits_for_another_devices_copy():
    """The next pinned array of that size, taken while device 1's copy is
    still queued, gets the block only after device 1's work: filled with 7
    then, it keeps its 7s when device 1's stream is synchronized."""
    address, stream = _pinned_given_back_while_device_1_copies_into_it()
    again = cuda.pinned_array(PINNED_FLOATS, np.float32)
    again[:] = 7.0
    with cuda.gpus[1]:
        stream.synchronize()
    return {"same_block": again.ctypes.data == address, "values": sorted(set(again.tolist())),
            "errors": STANDIN.errors}


def pinned_block_reused_once_every_device_is_done(reset_device_1=False):
    """The blocks given back are covered by an event (recorded at the
    cache's next operation, a read of its stats) on both devices; once both
    have run their work (or device 1 has been reset since: its event is
    gone, never asked), the next pinned array of that size gets the block
    without waiting for a device. The driver calls of that request."""
    address, _ = _pinned_given_back_while_device_1_copies_into_it()
    numba_alloc.host_memory_stats(0)                # the event is recorded now
    if reset_device_1:
        driver.get_device(1).reset()
    else:
        with cuda.gpus[1]:
            cuda.synchronize()
    cuda.synchronize()
    with STANDIN.recording() as calls:
        again = cuda.pinned_array(PINNED_FLOATS, np.float32)
    return {"same_block": again.ctypes.data == address,
            "calls": [c.name for c in calls], "errors": STANDIN.errors}


def pinned_block_reused_after_another_device_is_reset():
    return pinned_block_reused_once_every_device_is_done(reset_device_1=True)


def pinned_block_freed_at_a_reset_after_another_devices_copy():
    """Device 0's reset (its pool's returns its host cache's blocks,
    cuMemFreeHost) while device 1's copy into a block given back is still
    queued: the block is freed only once device 1's work has run. The work
    still queued when it is freed."""
    address, _ = _pinned_given_back_while_device_1_copies_into_it()
    free_host, queued = driver.cuMemFreeHost, []

    def watched(pointer):
        if int(pointer) == address:
            queued.append([work.label for work in STANDIN.queue.pending])
        return free_host(pointer)
    driver.cuMemFreeHost = watched
    try:
        driver.get_device(0).reset()
    finally:
        del driver.cuMemFreeHost
    return {"queued_at_free": queued, "errors": STANDIN.errors}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
