"""Record the workloads of corpus_unseen.py (issue 40's generalisation
check: model families the corpus has never seen) as record_corpus.py
records the corpus's: RMM CSV logs, gzip-compressed.

    python benchmarks/record_unseen.py [--out DIR] [--list] [WORKLOAD...]

Writes DIR/NAME.csv.gz (DIR: benchmarks/traces/unseen) for each workload
(default: all).
"""

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from corpus_unseen import UNSEEN  # noqa: E402
from record_torch_trace import profiled_events, recorded_only, save, to_fresh_storage  # noqa: E402


def record(name):
    """The memory events of workload ``name``, as TraceEvents (as
    record_corpus.record)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model, inputs, run = UNSEEN[name].build(random.Random(0), torch.Generator().manual_seed(0))
    return recorded_only(profiled_events(lambda: run(to_fresh_storage(model), inputs)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD")
    parser.add_argument("--out", default=os.path.join(HERE, "traces", "unseen"))
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    unknown = [name for name in args.workloads if name not in UNSEEN]
    if unknown:
        parser.error(f"no workload {unknown[0]!r}; they are: {', '.join(UNSEEN)}")
    if args.list:
        for w in UNSEEN.values():
            print(f"{w.name:<20} {w.family:<34} {w.what}")
        return
    for name in args.workloads or UNSEEN:
        start = time.perf_counter()
        save(record(name), os.path.join(args.out, f"{name}.csv.gz"))
        print(f"  recorded in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
