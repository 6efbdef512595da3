"""The user's path (the plugin's memalloc plus release, section 2 of
bench_core.py) of two or more checkouts of numba_alloc, side by side in one
run: for a change that must not slow it down.

Each checkout runs its own ``benchmarks/bench_core.py --section memalloc``
in a fresh interpreter that imports that checkout's package (PYTHONPATH,
checked), one process per checkout in turn, the order reversed every other
turn, ``--turns`` times. A process reports the median of its rounds for
the plugin and for Numba's floor (an AutoFreePointer and a dict, no
plugin): the floor is the control, the same code in every checkout. A
ratio is the median over turns of a checkout's time over the first
checkout's in the same turn, with its range.

    git worktree add /tmp/before COMMIT
    python benchmarks/compare_checkouts.py /tmp/before . [--turns 6] [--pairs 50000] [--rounds 15]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run_section(root, pairs, rounds):
    """(plugin us, floor us): medians over the rounds of one fresh process
    running ``root``'s bench_core section 2 with ``root``'s package."""
    env = dict(os.environ, PYTHONPATH=root)
    check = subprocess.run([sys.executable, "-c", "import numba_alloc; print(numba_alloc.__file__)"],
                           env=env, cwd=root, capture_output=True, text=True, check=True)
    found = os.path.realpath(check.stdout.strip())
    if not found.startswith(os.path.realpath(root) + os.sep):
        raise SystemExit(f"{root}: python imports numba_alloc from {found}, not from the checkout")
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "bench_core.py"),
                           "--section", "memalloc", "--pairs", str(pairs), "--rounds", str(rounds)],
                          env=env, cwd=root, capture_output=True, text=True, check=True)
    times = json.loads(proc.stdout.splitlines()[-1])
    return statistics.median(times["plugin"]), statistics.median(times["floor"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", help="checkouts; the first is the baseline")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if len(args.roots) < 2:
        parser.error("roots: give at least two checkouts")
    roots = [os.path.abspath(root) for root in args.roots]
    plugin = {root: [] for root in roots}
    floor = {root: [] for root in roots}
    for turn in range(args.turns):
        for root in (roots if turn % 2 == 0 else roots[::-1]):
            p, f = run_section(root, args.pairs, args.rounds)
            plugin[root].append(p)
            floor[root].append(f)
        print(f"turn {turn + 1}: " + ", ".join(
            f"{os.path.basename(root) or root} {plugin[root][-1]:.2f}" for root in roots), flush=True)
    base = roots[0]
    print(f"\nmemalloc + release, us (median of turns); ratio to {args.roots[0]} "
          "(median of per-turn ratios, range)")
    print(f"{'checkout':<30} {'plugin':>8} {'ratio':>22} {'floor':>8} {'floor ratio':>22}")
    for root in roots:
        cells = []
        for times in (plugin, floor):
            ratios = sorted(a / b for a, b in zip(times[root], times[base]))
            cells += [f"{statistics.median(times[root]):>8.2f}",
                      f"{statistics.median(ratios):>6.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})"]
        print(f"{os.path.relpath(root):<30} {cells[0]} {cells[1]:>22} {cells[2]} {cells[3]:>22}")


if __name__ == "__main__":
    main()
