"""Write notebooks/explore.ipynb from the cells below, executed (on the
simulated device where there is no GPU), with its outputs, so that it reads
where notebooks are rendered.

Usage: python notebooks/make_explore.py [--check]
--check runs nothing and exits 1 when the committed notebook's cells are
not the ones below, or a code cell of it has not run.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).with_name("explore.ipynb")
TIMEOUT = 300    # seconds a cell may take

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
named). The outputs saved with it come from a run on the simulated device."""),
    ("code", """\
%matplotlib inline
import os
import tempfile

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from numba import cuda

import numba_alloc

matplotlib.rcParams["figure.dpi"] = 72     # pictures at the text's scale, and a small file

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
pipeline"""),
    ("markdown", """\
## Read the pool

A pool shows itself as a table in human units beside its segment map: one bar
per segment (one device allocation), its blocks coloured by state.
`memory_summary` is the full text report: the counters per pool (current,
peak, total allocated and freed), the largest free block, the fragmentation
(1 - largest free block / free bytes) and one occupancy line per segment."""),
    ("code", """\
if ON_GPU:
    with numba_alloc.device_pool(0) as pool:    # the Pool Numba allocates from on GPU 0
        display(pool)
else:
    display(device)"""),
    ("code", """\
numba_alloc.memory_summary(device)"""),
    ("markdown", """\
## The segment map, before and after a defragmentation

Free memory is scattered: the pool holds more free bytes in one segment than
in any one free block, so a request of that size would need a new segment.
`numba_alloc.defragment(device, nbytes=n)` moves the fewest live bytes (with
the same Numba copy kernel a GPU runs, here under Numba's CUDA simulator) to
open a free range of `n` bytes, and says whether a request of `n` bytes now
fits without reserving memory. The cell first returns the wholly free
segments to the device (`empty_cache`: their memory is one free range
already), asks for the most free bytes any one segment holds, prints what
moved and the pool's free space before and after, and draws both states
side by side. (Without `nbytes`, `defragment`
compacts every segment and returns the ones it empties to the device: the
pool then holds less, the bytes are the device's again.)"""),
    ("code", """\
def free_space(snap):
    \"\"\"(free bytes the pool holds, its largest free block), from a snapshot.\"\"\"
    free = [b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive"]
    return sum(free), max(free, default=0)


def mib(nbytes):
    return f"{nbytes / 2**20:.1f} MiB"


numba_alloc.empty_cache(device)      # wholly free segments go back: what stays is scattered
before = numba_alloc.snapshot(device)
wanted = max(sum(b["size"] for b in s["blocks"] if b["state"] == "inactive")
             for s in before["segments"])      # one segment's free bytes, were they together
result = numba_alloc.defragment(device, nbytes=wanted)
after = numba_alloc.snapshot(device)
print(result)
for name, snap in (("before", before), ("after", after)):
    total_free, largest = free_space(snap)
    print(f"{name:>6}: {mib(total_free)} free in the pool, largest free block {mib(largest)}, "
          f"fragmentation {1 - largest / total_free if total_free else 0:.3f}")
print(f"a request of {mib(wanted)} fits without reserving memory: {result.hole}")

fig = Figure(figsize=(14, 6), layout="constrained")
left, right = fig.subplots(1, 2)
numba_alloc.plot_segments(snapshot=before, ax=left)
numba_alloc.plot_segments(snapshot=after, ax=right)
fig.suptitle(f"before (left) and after (right) opening a free range of {mib(wanted)}")
fig"""),
    ("markdown", """\
## The timeline

Reserved, allocated and requested bytes over the recorded history, one step
per event (`x="time"` spaces them by time instead, where a slow step such as
a defragmentation squeezes the rest into a sliver)."""),
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
os.chdir(tempfile.mkdtemp())       # a scratch directory for the files
numba_alloc.dump_snapshot("snapshot.pickle", device)
print(f"snapshot.pickle: {os.path.getsize('snapshot.pickle')} bytes")

print(numba_alloc.dump_trace("trace.csv", device), "events written to trace.csv")
fresh = numba_alloc.Pool(numba_alloc.SimulatedDevice("2GiB"))
numba_alloc.replay_trace("trace.csv", fresh)"""),
    ("markdown", """\
## Replay a real trace, with different settings

numba_alloc ships the allocation log of a small transformer's training loop
(weights, optimizer state, activations that change with the sequence length,
temporaries), with the oddities of real logs: frees of pointers allocated
before logging began, a lost line, a recorded failure. Replaying it on
simulated devices compares settings without a GPU."""),
    ("code", """\
for settings in ({"max_split_size_mb": 32}, {"garbage_collection_threshold": 0.5}, {}):
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"), **settings)
    report = numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, pool)
    print(f"{str(settings or 'defaults'):40} peak reserved {mib(report.peak_reserved)}, "
          f"fragmentation at the end {report.fragmentation:.3f}")
report      # the last replay's, with the defaults"""),
    ("code", """\
replayed = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"))
numba_alloc.record_history(device=replayed)
numba_alloc.replay_trace(numba_alloc.BUNDLED_TRACE, replayed)
numba_alloc.plot_timeline(replayed)"""),
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
    ("markdown", """\
## What each cell does to the pool

`%load_ext numba_alloc` prints, after every cell that changed a pool, a row
per pool: allocated and reserved bytes before -> after the cell, its peak,
and its allocations, frees, out-of-memory errors, defragmentations and bytes
reclaimed to host memory. After a cell that ran out of memory it also drops
what the traceback keeps alive and says how much that freed.
`%numba_alloc off` stops it; `%%numba_alloc` on a cell's first line adds the
cell's timeline."""),
    ("code", """\
%load_ext numba_alloc"""),
    ("code", """\
scratch = [allocate(4 << 20) for _ in range(4)]
for buffer in scratch:
    release(buffer)
scratch = buffer = None"""),
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


def execute(nb):
    """Run ``nb`` in a fresh kernel, in a temporary directory; return it."""
    import nbclient
    with tempfile.TemporaryDirectory() as workdir:
        nbclient.NotebookClient(nb, kernel_name="python3", timeout=TIMEOUT, record_timing=False,
                                extra_arguments=["--Application.log_level=ERROR"],
                                resources={"metadata": {"path": workdir}}).execute()
    return nb


def same_cells(nb, expected):
    """Whether ``nb`` has the cells of ``expected`` (kind, id, source)."""
    def cells(notebook):
        return [(c.cell_type, c.id, c.source) for c in notebook.cells]
    return cells(nb) == cells(expected)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        committed = nbformat.read(NOTEBOOK, as_version=4)
        ran = all(c.execution_count for c in committed.cells if c.cell_type == "code")
        sys.exit(0 if same_cells(committed, build()) and ran else 1)
    nbformat.write(execute(build()), NOTEBOOK)
    print(f"wrote {NOTEBOOK}")


if __name__ == "__main__":
    main()
