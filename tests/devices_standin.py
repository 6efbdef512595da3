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


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
