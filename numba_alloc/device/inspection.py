"""Kernels examined without a GPU: what compiled PTX does with global
memory (the width of each load and store, the atomics, the loop that moves
the most 128-bit words), and the atomics each thread block makes under
Numba's CUDA simulator. For the copy kernel's checks (tests/test_ptx.py,
tests/test_kernels.py) and benchmarks/bench_defrag.py."""

import collections
import re
import threading

import numpy as np

# a global load or store: ld.global[.nc][.v2|.v4].<type><bits>
_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d))?"
                     r"\.[a-z](\d+)\s")
_ATOMIC = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.global\.", re.M)
_LABEL = re.compile(r"^\$?[\w.$]+:\s*$")
_BRANCH = re.compile(r"^(?:@!?%p\d+\s+)?(?:bra|ret|exit)\b")


def _access(line):
    """('ld' or 'st', bits moved) of a global load or store line, else None."""
    match = _ACCESS.match(line)
    if match is None:
        return None
    op, lanes, bits = match.groups()
    return op, int(lanes or 1) * int(bits)


def global_accesses(ptx):
    """{"loads": {bits: sites}, "stores": {bits: sites}, "atomics": sites}
    of PTX text: each global load and store instruction by the bits it
    moves (a vector's lanes together), and the global atomic instructions
    (``atom`` and ``red``)."""
    loads, stores = collections.Counter(), collections.Counter()
    for line in ptx.splitlines():
        access = _access(line)
        if access is not None:
            (loads if access[0] == "ld" else stores)[access[1]] += 1
    return {"loads": dict(loads), "stores": dict(stores), "atomics": len(_ATOMIC.findall(ptx))}


def widest_loop(ptx):
    """The basic block of ``ptx`` with the most 128-bit global loads:
    {"loads": 128-bit loads in it, "loads_before_store": those issued
    before its first global store (in flight together), "instructions":
    its instructions, "per_16_bytes": instructions per 16 bytes loaded}, or
    None when ``ptx`` has no 128-bit global load."""
    best, block = None, []
    for line in ptx.splitlines() + ["$end:"]:
        text = line.strip()
        if _LABEL.match(text):
            best, block = _better(best, block), []
        elif text.endswith(";") and not text.startswith((".", "//")):
            block.append(text)
            if _BRANCH.match(text):         # a block ends at its branch
                best, block = _better(best, block), []
    return best


def _better(best, block):
    loads = before = 0
    stored = False
    for line in block:
        access = _access(line)
        if access == ("ld", 128):
            loads += 1
            before += not stored
        elif access is not None and access[0] == "st":
            stored = True
    if loads == 0 or (best is not None and best["loads"] >= loads):
        return best
    return {"loads": loads, "loads_before_store": before, "instructions": len(block),
            "per_16_bytes": len(block) / loads}


def atomics_per_block(run):
    """Call ``run()``, which launches kernels under Numba's CUDA simulator
    one after another, counting each atomic operation (every method of the
    simulator's ``cuda.atomic``) on an array that is not a NumPy array:
    global memory, as the simulator's shared and local arrays are NumPy
    arrays. Returns {(launch, (block x, y, z)): atomics} for the blocks
    that made any, launches numbered from 0. Patches the simulator's
    kernels and atomics while it runs: not thread safe."""
    from numba.cuda.simulator import kernel, kernelapi
    atomic = kernelapi.FakeCUDAAtomic
    originals = {name: method for name, method in vars(atomic).items()
                 if callable(method) and not name.startswith("_")}
    launch = kernel.FakeCUDAKernel.__call__
    counts, lock, launches = collections.Counter(), threading.Lock(), [-1]

    def counted(method):
        def wrapper(self, array, *args):
            if not isinstance(array, np.ndarray):
                block = threading.current_thread().blockIdx
                with lock:
                    counts[(launches[0], (block.x, block.y, block.z))] += 1
            return method(self, array, *args)
        return wrapper

    def numbered(self, *args):
        launches[0] += 1
        return launch(self, *args)

    try:
        for name, method in originals.items():
            setattr(atomic, name, counted(method))
        kernel.FakeCUDAKernel.__call__ = numbered
        run()
    finally:
        kernel.FakeCUDAKernel.__call__ = launch
        for name, method in originals.items():
            setattr(atomic, name, method)
    return dict(counts)
