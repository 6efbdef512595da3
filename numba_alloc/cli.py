"""``numba-alloc``: run a Numba program under the pool, or the bundled demo."""

import argparse
import os
import runpy
import sys

from . import registry, replay
from .bench import command as bench
from .summary import format_summary


def _report_all():
    pools = sorted(registry.pools().items())
    if not pools:
        print("numba_alloc: no device memory was allocated through the pool", file=sys.stderr)
    for _, pool in pools:
        print(format_summary(pool), file=sys.stderr)


def _run(args):
    from .api import install
    os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_alloc"   # for child processes
    install()
    sys.argv = [args.script] + args.args
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        _report_all()
    return 0


def _demo(args):
    from numba import cuda
    if args.trace:
        return replay.demo(simulated=args.simulated or not cuda.is_available(),
                           capacity=args.capacity)
    if cuda.is_available() and not args.simulated:
        from . import demo
        from .api import install
        install()
        pool = demo.run_gpu(steps=args.steps, scale=args.scale)
        print(f"demo: {args.steps} steps of a Numba smoother on {cuda.get_current_device().name}")
    else:
        from . import demo
        pool = demo.run_simulated(steps=args.steps, scale=args.scale, capacity=args.capacity)
        print(f"demo: {args.steps} steps on a simulated device of {args.capacity} "
              "(no GPU in use; figures come from the simulation)")
    print(format_summary(pool))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="numba-alloc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a Python script with numba_alloc as "
                                          "Numba's memory manager, then print the report")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    demo = commands.add_parser("demo", help="run the bundled workload (GPU if there is "
                                            "one, else a simulated device) and print the report")
    demo.add_argument("--steps", type=int, default=40)
    demo.add_argument("--scale", type=float, default=8.0, help="MiB of the main array")
    demo.add_argument("--simulated", action="store_true", help="use the simulated device "
                                                                "even when there is a GPU")
    demo.add_argument("--capacity", default="1GiB", help="simulated device size")
    demo.add_argument("--trace", action="store_true", help="replay the bundled trace of a "
                                                           "training loop instead")
    replay.add_arguments(commands.add_parser(
        "replay", help="replay an allocation trace (RMM's CSV log) through the pool"))
    bench.add_arguments(commands.add_parser(
        "bench", help="run the kernels/ workloads under each memory manager, side by side "
                      "(on a simulated device without a GPU)"))
    args = parser.parse_args(argv)
    return {"run": _run, "demo": _demo, "replay": replay.run,
            "bench": bench.main}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
