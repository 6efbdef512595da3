"""Record the corpus: real model code's allocations as a GPU's caching
allocator would see them, as RMM CSV logs (gzip-compressed).

What PyTorch's CUDA caching allocator is asked for is storages: one
request per tensor storage that a kernel, a factory function or a copy
makes, of the storage's bytes (a view allocates nothing), and one free when
the storage's last reference goes. PyTorch's CPU allocator is asked for the
same storages by the same code, so this records on the CPU what
``torch.profiler`` (profile_memory on) sees the CPU allocator do: each
allocation and free, its address and bytes, in order. What makes the
recording what a GPU run would ask for:

* the model is built before the recording, then its parameters and buffers
  are copied to fresh storage inside it, one after the other in the order
  ``model.to("cuda")`` copies them (``Module._apply``; a tied parameter
  once), so that the trace begins as a GPU run does, with the parameters
  packed, not with the construction's temporaries between them;
* the inputs are made before the recording (a data loader makes them on
  the host) and each step copies its batch (``to_device``: one storage a
  tensor, as ``.to("cuda")``);
* the optimizers are foreach (``foreach=True``, PyTorch's choice on a
  GPU; on the CPU it would loop tensor by tensor), as are gradient
  clipping's norms;
* the frees of storages made before the recording (the construction's
  parameters, the host batches) are left out.

What stays the CPU's: kernels that differ between CPU and GPU allocate
differently (cuDNN's convolution and RNN workspaces are not here; oneDNN's
LSTM layer's workspace, a GRU's per-step tensors and the CPU's attention
kernel's are); Adam's step counters (4 bytes a parameter, host tensors on
a GPU) are allocations here. One intra-op thread and fixed seeds keep a
recording the same from run to run.

    python benchmarks/record_corpus.py [--out DIR] [--list] [--unseen] [WORKLOAD...]

Writes DIR/tuning/NAME.csv.gz or DIR/held-out/NAME.csv.gz (the workload's
half; DIR: benchmarks/traces) for each workload (default: all). With
``--unseen``, the workloads of corpus_unseen.py (model families the corpus
has none of, issue 40's second check) to DIR/unseen/NAME.csv.gz.
"""

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from corpus_workloads import WORKLOADS, half  # noqa: E402  (the vision workloads)
import corpus_text  # noqa: E402,F401,I100  (registers its workloads after the vision ones)
import corpus_diffusion_graph  # noqa: E402,F401,I100
from corpus_unseen import UNSEEN  # noqa: E402
from record_torch_trace import profiled_events, recorded_only, save, to_fresh_storage  # noqa: E402


def record(workload):
    """The memory events of ``workload`` (a Workload), as TraceEvents."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, inputs, run = workload.build(random.Random(0), torch.Generator().manual_seed(0))
    return recorded_only(profiled_events(lambda: run(to_fresh_storage(model), inputs)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"workloads to record (default: all): {', '.join(WORKLOADS)}")
    parser.add_argument("--out", default=os.path.join(HERE, "traces"),
                        help="folder of the halves' folders (default: benchmarks/traces)")
    parser.add_argument("--list", action="store_true", help="list the workloads and stop")
    parser.add_argument("--unseen", action="store_true",
                        help=f"the unseen group's workloads instead: {', '.join(UNSEEN)}")
    args = parser.parse_args()
    registry = UNSEEN if args.unseen else WORKLOADS
    folder = (lambda name: "unseen") if args.unseen else half
    unknown = [name for name in args.workloads if name not in registry]
    if unknown:
        parser.error(f"no workload {unknown[0]!r}; they are: {', '.join(registry)}")
    if args.list:
        for w in registry.values():
            print(f"{w.name:<20} {folder(w.name):<9} {w.family:<22} {w.what}")
        return
    for name in args.workloads or registry:
        start = time.perf_counter()
        save(record(registry[name]), os.path.join(args.out, folder(name), f"{name}.csv.gz"))
        print(f"  recorded in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
