"""Global atomics per malloc and per free of the device heap, beside the goal
(issue 26: at most 2 for mixed sizes), without a GPU.

Runs tests/heap_atomics.py under Numba's CUDA simulator (the heap's own
device functions, their atomics counted; a child process with
NUMBA_ENABLE_CUDASIM=1): on a fresh heap, one warp of 16 B blocks, and four
warps of sizes log-uniform from 16 B to 8 KiB freed in a shuffled order,
each twice. Counts, not times: they are the same on any machine, and a GPU
runs the same source.

    python benchmarks/bench_heap_atomics.py
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_malloc import host_line  # noqa: E402

GOAL = 2.0                  # global atomics per malloc and per free, mixed sizes


def counts():
    """tests/heap_atomics.py's figures (its JSON)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "heap_atomics.py")],
                          env=env, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout)


def rows(out):
    """(scenario, round, per malloc, per free, goal, met) per scenario and round."""
    for name, label in (("one_size", "one warp, 16 B"),
                        ("mixed", "4 warps, 16 B-8 KiB log-uniform")):
        for round_ in ("first", "second"):
            malloc, free = out[name][f"malloc_{round_}"], out[name][f"free_{round_}"]
            yield (label, round_, malloc, free, GOAL, malloc <= GOAL and free <= GOAL)


def main():
    print(host_line())
    out = counts()
    print(f"{'case':34} {'round':7} {'malloc':>7} {'free':>7}  goal")
    for label, round_, malloc, free, goal, met in rows(out):
        print(f"{label:34} {round_:7} {malloc:7.3f} {free:7.3f}  <= {goal:g} each: "
              f"{'met' if met else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
