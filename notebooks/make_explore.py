"""Write notebooks/explore.ipynb (outputs stripped) from the cells below.

Usage: python notebooks/make_explore.py [--check]
--check exits 1 when the committed notebook differs from what this writes.
"""

import argparse
import sys
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).with_name("explore.ipynb")

CELLS = [
    ("markdown", """\
# Your first hour with numba_alloc

This notebook switches numba_alloc on, runs a small workload, reads the pool's
counters, draws its segment map before and after a defragmentation and its
timeline, writes a snapshot for PyTorch's memory viewer, replays an allocation
trace, and looks at the driver's view through NVML.

It runs on the GPU when there is one, and otherwise on a **simulated device**:
the same pool policy over host memory. Every function below takes `device`:
a GPU number, or a `numba_alloc.Pool` (which is how the simulated device is
named)."""),
    ("code", """\
%matplotlib inline
import os
import tempfile

import numpy as np
from matplotlib.figure import Figure
from numba import cuda

import numba_alloc

ON_GPU = cuda.is_available()
if ON_GPU:
    numba_alloc.install()      # before CUDA is first used: Numba fixes its manager per context
    device = 0
else:
    device = numba_alloc.Pool(numba_alloc.SimulatedDevice("2GiB"))
print("running on", "GPU 0" if ON_GPU else "a simulated device of 2 GiB (no GPU here)")"""),
    ("markdown", """\
## Switch on the history

`record_history` keeps a ring of the pool's events (allocations, frees, segments
reserved and returned, defragmentation moves, out-of-memory errors) with their
times and, with `stacks=True`, the Python line that caused each."""),
    ("code", """\
numba_alloc.record_history(device=device, max_entries=50_000, stacks=True)"""),
    ("markdown", """\
## A small workload

A pipeline keeps one large field, and every step allocates temporaries of
changing sizes, keeps a few results and frees the rest in a shuffled order:
the pattern that scatters free memory. `track` counts what each region
allocated (peak, current, total), nested as RMM's counters."""),
    ("code", """\
rng = np.random.default_rng(0)


def allocate(nbytes):
    if ON_GPU:
        return cuda.device_array(nbytes, dtype=np.uint8)
    return device.malloc(nbytes)


def release(buffer):
    # On the GPU the pool gets the block back when the last reference goes.
    if not ON_GPU:
        device.free(buffer)


field = allocate(64 << 20)
results = []
with numba_alloc.track("pipeline", device) as pipeline:
    for phase in ("warm-up", "steps"):
        with numba_alloc.track(phase, device):
            for step in range(5 if phase == "warm-up" else 25):
                sizes = rng.integers(1 << 10, 6 << 20, size=12)
                temporaries = [allocate(int(n)) for n in sizes]
                results.append(temporaries.pop(int(rng.integers(len(temporaries)))))
                for i in rng.permutation(len(temporaries)):
                    release(temporaries[i])
                    temporaries[i] = None
print(pipeline.report())"""),
    ("markdown", """\
## Read the pool

`memory_summary` prints the counters per pool (current, peak, total allocated
and freed), the largest free block, the fragmentation (1 - largest free block
/ free bytes) and one occupancy line per segment."""),
    ("code", """\
print(numba_alloc.memory_summary(device))"""),
    ("markdown", """\
## The segment map, before and after a defragmentation

Each bar is a segment (one device allocation); its blocks are coloured by
state. `numba_alloc.defragment` moves live blocks together (with the same
Numba copy kernel a GPU runs, here under Numba's CUDA simulator for small
batches) and returns the segments it empties to the device; the cell draws
both states side by side and prints what moved."""),
    ("code", """\
before = numba_alloc.snapshot(device)
result = numba_alloc.defragment(device)
print(result)
fig = Figure(figsize=(14, 6), layout="constrained")
left, right = fig.subplots(1, 2)
numba_alloc.plot_segments(snapshot=before, ax=left)
numba_alloc.plot_segments(device, ax=right)
fig.suptitle("before (left) and after (right) defragmentation")
fig"""),
    ("markdown", """\
## The timeline

Reserved, allocated and requested bytes over the recorded history."""),
    ("code", """\
numba_alloc.plot_timeline(device)"""),
    ("markdown", """\
## Snapshots for PyTorch's memory viewer, and traces

`dump_snapshot` writes a pickle in the format of
`torch.cuda.memory._dump_snapshot`: drop it on https://pytorch.org/memory_viz
to browse the segments and the history (with the stacks recorded above).
`dump_trace` writes the history as RMM's CSV allocation log, which
`replay_trace` (or `numba-alloc replay`) runs through a fresh pool."""),
    ("code", """\
workdir = tempfile.mkdtemp()
snapshot_path = os.path.join(workdir, "snapshot.pickle")
numba_alloc.dump_snapshot(snapshot_path, device)
print(f"{snapshot_path}: {os.path.getsize(snapshot_path)} bytes")

trace_path = os.path.join(workdir, "trace.csv")
print(numba_alloc.dump_trace(trace_path, device), "events written")
fresh = numba_alloc.Pool(numba_alloc.SimulatedDevice("2GiB"))
print(numba_alloc.replay_trace(trace_path, fresh).format())"""),
    ("markdown", """\
## Replay a real trace, with different settings

numba_alloc ships the allocation log of a small transformer's training loop
(weights, optimizer state, activations that change with the sequence length,
temporaries), with the oddities of real logs: frees of pointers allocated
before logging began, a lost line, a recorded failure. Replaying it on
simulated devices compares settings without a GPU."""),
    ("code", """\
for settings in ({}, {"max_split_size_mb": 32}, {"garbage_collection_threshold": 0.5}):
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"), **settings)
    report = numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, pool)
    print(f"{settings or 'defaults'}:\\n{report.format()}\\n")

replayed = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"))
numba_alloc.record_history(device=replayed)
numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, replayed)
numba_alloc.plot_timeline(replayed, x="event")"""),
    ("markdown", """\
## The driver's view

`device_info` reads nvidia-smi's fields through NVML beside the pool's own
reserved and allocated bytes: what the driver counts as used includes the CUDA
context and every other allocator in the process."""),
    ("code", """\
if ON_GPU:
    for key, value in numba_alloc.device_info(0).items():
        print(f"{key:24} {value}")
else:
    try:
        numba_alloc.device_info(0)
    except RuntimeError as error:
        print("no GPU here:", error)"""),
]


def build():
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"},
                   "language_info": {"name": "python"}}
    for number, (kind, source) in enumerate(CELLS):
        new_cell = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
        cell = new_cell[kind](source)
        cell.id = f"cell-{number:02d}"
        nb.cells.append(cell)
    return nb


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = nbformat.writes(build())
    if args.check:
        sys.exit(0 if NOTEBOOK.read_text() == text else 1)
    NOTEBOOK.write_text(text)
    print(f"wrote {NOTEBOOK}")


if __name__ == "__main__":
    main()
