"""The ``numba-alloc`` command: ``run`` (a Python program with numba_alloc as
Numba's memory manager, as ``python`` runs it), ``demo``, ``replay``,
``summary`` (of a snapshot file) and ``bench``.

An error in a command's arguments, or in a file or device they name, is one
line on stderr, ``numba-alloc CMD: error: ...``, with exit status 2, as
argparse reports its own; a command raises :class:`UsageError` for it. So
is an invalid ``NUMBA_ALLOC_CONF``, for every command. When
stdout is a pipe closed early (``numba-alloc demo | head``), the command
ends quietly with status 141, as a program stopped by SIGPIPE does.
"""

import argparse
import contextlib
import importlib.util
import os
import re
import runpy
import sys

from ..version import __version__
from ..plugin import registry
from . import replay, summary
from .bench import command as bench
from .arguments import UsageError, capacity, gpu_available, positive
from ..observe.out_of_memory import OutOfMemoryError
from ..observe.summary import format_summary, out_of_memory_message

EPIPE_STATUS = 141      # 128 + SIGPIPE
DEMO_MOST_STEPS = 100_000   # demo --steps: about 15 s on a simulated device
DEMO_MOST_SCALE = 1 << 43   # demo --scale, in MiB: arrays of 2**63 bytes, what a driver can count


def _gpu_pools():
    """[(pool, name)] of the plugin's pools the program used, by GPU number
    then in the order made, those whose context it closed (cuda.close())
    among them: ``gpu<N>``, and for a GPU used again after cuda.close()
    (a new context, a new pool) ``gpu<N>-<k>``, its k-th pool after the first."""
    named, made = [], {}
    for device_id, pool in sorted(registry.made_pools(), key=lambda item: item[0]):
        k = made[device_id] = made.get(device_id, -1) + 1
        named.append((pool, f"gpu{device_id}" + (f"-{k}" if k else "")))
    return named


def _report_all():
    """The report of each of the plugin's pools the program used on stderr."""
    pools = _gpu_pools()
    if not pools:
        print("numba_alloc: no device memory was allocated through the pool", file=sys.stderr)
    for pool, _ in pools:
        print(format_summary(pool), file=sys.stderr)


def _program(args):
    """(script or module, its arguments, whether a module) of ``run``."""
    if args.module is not None:
        if not args.module:
            raise UsageError("argument -m: expected a module name")
        return args.module[0], args.module[1:] + args.program, True
    if not args.program:
        raise UsageError("expected a script, or -m and a module")
    script = args.program[0]
    if not os.path.exists(script):
        raise UsageError(f"can't open file {os.path.abspath(script)!r}: no such file")
    return script, args.program[1:], False


def _output_paths(path, pools):
    """[(pool, file)] for ``path`` and the program's ``pools`` (in the
    order made): ``path`` itself for one pool, else with a name before the
    extension: the plugin's pools named by their GPU (s.gpu1.pickle; see
    :func:`_gpu_pools`), then the program's own by their place among them
    (s.pool0.pickle)."""
    if len(pools) == 1:
        return [(pools[0], path)]
    root, ext = os.path.splitext(path)
    followed = {id(pool) for pool in pools}
    paths = [(pool, f"{root}.{name}{ext}") for pool, name in _gpu_pools()
             if id(pool) in followed]
    gpus = {id(pool) for pool, _ in paths}
    others = [pool for pool in pools if id(pool) not in gpus]
    return paths + [(pool, f"{root}.pool{k}{ext}") for k, pool in enumerate(others)]


def _check_writable(option, path):
    """UsageError, before the program runs, when ``path`` is empty or a
    folder, or its folder is not there."""
    if not path:
        raise UsageError(f"argument {option}: the path is empty")
    if os.path.isdir(path):
        raise UsageError(f"argument {option}: {path!r} is a folder: give a file's path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"argument {option}: no folder {folder!r} to write {path!r} in")


def _follow_pools():
    """Record the history of every Pool made from now on (the plugin's per
    GPU and the program's own, such as one on a SimulatedDevice) from its
    start; the list they join in the order made, which keeps them alive
    for their files."""
    from ..observe.history import record_history
    from ..policy.live_pools import when_pool_made
    made = []

    def follow(pool):
        record_history(device=pool)
        made.append(pool)
    when_pool_made(follow)
    return made


def _write_files(args, pools):
    """Write the snapshot (--snapshot) and recorded trace (--trace) of each
    of ``pools``; an error is one line on stderr (the program's status
    stands)."""
    from ..observe.memory_viz import dump_snapshot
    from ..observe.trace import dump_trace
    for option, path, write in (("--snapshot", args.snapshot, dump_snapshot),
                                ("--trace", args.trace, dump_trace)):
        if path is None:
            continue
        if not pools:
            print(f"numba-alloc run: {option}: nothing written: the program made no pool "
                  "(no device memory was allocated through numba_alloc)", file=sys.stderr)
        for pool, file in _output_paths(path, pools):
            try:
                write(file, device=pool)
            except OSError as error:
                print(f"numba-alloc run: error: argument {option}: can't write {file!r}: "
                      f"{error.strerror or error}", file=sys.stderr)
            else:
                print(f"numba-alloc run: wrote {file}", file=sys.stderr)


def _show(error):
    """Print ``error`` through sys.excepthook, as Python prints an uncaught
    exception, its traceback starting at the program's own code."""
    ours = (globals(), vars(runpy))
    tb = error.__traceback__
    while tb is not None and any(tb.tb_frame.f_globals is g for g in ours):
        tb = tb.tb_next
    sys.excepthook(type(error), error, error.with_traceback(tb).__traceback__)


def _run(args):
    """``numba-alloc run``: install numba_alloc (running the program without
    it, with a note, where there is no usable GPU), then run the script or
    module as ``python`` does: sys.argv, sys.path[0] (the script's folder, or
    the current one for -m), ``__main__``, SystemExit passed on, any other
    exception shown as Python shows it with status 1 (130 for
    KeyboardInterrupt). The report of the plugin's pools (each the program
    used, also those whose context it closed: cuda.close()) goes to stderr
    when the program ends, also when it fails; then, with --snapshot or
    --trace, the snapshot or recorded trace of each pool the program made
    (the plugin's, and its own, such as one on a SimulatedDevice; history
    is recorded from each pool's start) is written."""
    from ..api.functions import install
    target, argv, module = _program(args)
    for option, path in (("--snapshot", args.snapshot), ("--trace", args.trace)):
        if path is not None:
            _check_writable(option, path)
    without = None      # why the program runs without numba_alloc, said once it is found
    registry.keep_made_pools()      # for the report, also of pools whose context is closed
    try:
        install()
    except RuntimeError as error:
        without = f"numba-alloc run: the program runs without numba_alloc: {error}"
    else:
        os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_alloc"   # for child processes
    pools = _follow_pools() if args.snapshot is not None or args.trace is not None else []
    sys.argv = [target] + argv
    if not getattr(sys.flags, "safe_path", False):     # python -P, PYTHONSAFEPATH (3.11+)
        # runpy puts a folder or zip file given as the script first itself
        sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.realpath(target))
    if module:
        try:
            found = importlib.util.find_spec(target)
        except ImportError as error:        # a parent package is missing or fails to import
            raise UsageError(f"error while finding module {target!r}: {error}") from None
        if found is None:
            raise UsageError(f"no module named {target!r}")
    if without is not None:
        print(without, file=sys.stderr)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(target), run_name="__main__")   # __file__ as python
    except SystemExit:
        raise
    except BaseException as error:
        _show(error)
        return 130 if isinstance(error, KeyboardInterrupt) else 1
    finally:
        with contextlib.suppress(OSError):   # stdout closed: the report goes to stderr anyway
            sys.stdout.flush()
        _report_all()
        _write_files(args, pools)
    return 0


def _demo(args):
    """``numba-alloc demo``: the smoother on the GPU, or on a simulated
    device; the pool's summary at its peak and after the run."""
    from . import demo
    if args.trace:
        for option, value in (("--steps", args.steps), ("--scale", args.scale)):
            if value is not None:
                raise UsageError(f"argument --trace: not allowed with {option} (the trace "
                                 "replays the training loop it recorded)")
        return replay.demo(simulated=args.simulated or not gpu_available(),
                           capacity=args.capacity)
    steps = 40 if args.steps is None else args.steps
    scale = 8.0 if args.scale is None else args.scale
    on_gpu = gpu_available() and not args.simulated
    try:
        if on_gpu:
            from numba import cuda

            from ..api.functions import install
            install()
            pool, peak = demo.run_gpu(steps=steps, scale=scale)
            where = f"on {cuda.get_current_device().name}"
        else:
            pool, peak = demo.run_simulated(steps=steps, scale=scale,
                                            capacity=args.capacity)
            where = (f"on a simulated device of {args.capacity} "
                     "(no GPU in use; figures come from the simulation)")
    except MemoryError as error:      # numba_alloc's OutOfMemoryError, or NumPy's
        reason = str(error)
        if isinstance(error, OutOfMemoryError):     # the demo's options, not the pool's settings
            options = "a smaller --scale" if on_gpu else "a smaller --scale or a larger --capacity"
            reason = out_of_memory_message(error.report, hint=options)
        raise UsageError(f"--scale {scale:g} does not fit: {reason.splitlines()[0]}") from None
    print(f"demo: {steps} step{'' if steps == 1 else 's'} of a Numba smoother {where}")
    print(f"The pool at its peak (step {peak.step}, while that step's arrays were live):")
    print(peak.summary)
    print("The pool after the run (every array freed):")
    print(format_summary(pool, abbreviated=True))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, taking a value that starts with a minus and a
    digit ("--capacity -1GiB") as the option's value, for its type to
    refuse with its own message (argparse reads only plain negative numbers
    so, and took "-1GiB" for an option: "expected one argument")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"-\.?\d")


def make_parser():
    """The argument parser of ``numba-alloc`` and its subcommands."""
    parser = _Parser(
        prog="numba-alloc",
        description="numba_alloc, a pooling GPU memory allocator for Numba CUDA: run a "
                    "program under it, replay an allocation trace, report a snapshot, "
                    "benchmark it, or run the demo.")
    parser.add_argument("--version", action="version", version=f"numba-alloc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="one of these (numba-alloc COMMAND --help tells more)")

    def command(name, summary):
        return commands.add_parser(name, help=summary,
                                   description=summary[0].upper() + summary[1:] + ".")

    run = command("run", "run a Python program as python does, with numba_alloc as Numba's "
                         "memory manager, then print the pool's report on stderr")
    run.usage = ("numba-alloc run [-h] [--snapshot PATH] [--trace PATH] (SCRIPT | -m MODULE) "
                 "[ARGS ...]")
    run.add_argument("--snapshot", metavar="PATH",
                     help="when the program ends, write the snapshot of each pool it made "
                          "(the plugin's, or its own, such as on a SimulatedDevice) there, as "
                          "numba_alloc.dump_snapshot does (for pytorch.org/memory_viz or "
                          "numba-alloc summary); with several pools, PATH gets each GPU's "
                          "number (s.gpu1.pickle; s.gpu0-1.pickle for GPU 0's next pool "
                          "after cuda.close()), or the place of the program's own pools "
                          "(s.pool0.pickle)")
    run.add_argument("--trace", metavar="PATH",
                     help="when the program ends, write each pool's allocations as an RMM "
                          "CSV log there, as numba_alloc.dump_trace does (for numba-alloc "
                          "replay); several pools as for --snapshot")
    run.add_argument("-m", dest="module", nargs=argparse.REMAINDER,
                     help="run the library module MODULE as a script with ARGS, as python -m "
                          "does")
    run.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT ARGS",
                     help="the script and its arguments")
    demo = command("demo", "run the bundled workload (on the GPU if there is one, else on a "
                           "simulated device) and print the pool's report")
    demo.add_argument("--steps", type=positive(int, most=DEMO_MOST_STEPS),
                      help=f"steps of the smoother (default 40, at most {DEMO_MOST_STEPS})")
    demo.add_argument("--scale", type=positive(float, most=DEMO_MOST_SCALE),
                      help="MiB of each of the two long-lived arrays (default 8, at most "
                           f"{DEMO_MOST_SCALE}, 8 EiB)")
    demo.add_argument("--simulated", action="store_true",
                      help="use the simulated device even when there is a GPU")
    demo.add_argument("--capacity", default="1GiB", type=capacity,
                      help="size of the simulated device (default 1GiB)")
    demo.add_argument("--trace", action="store_true",
                      help="replay the bundled trace of a training loop instead")
    replay.add_arguments(command(
        "replay", "replay an allocation trace (RMM's CSV log) through the pool"))
    summary.add_arguments(command(
        "summary", "print the report of a snapshot file (numba_alloc.dump_snapshot's), as "
                   "torch.cuda._memory_viz stats does for PyTorch's"))
    bench.add_arguments(command(
        "bench", "run the benchmark workloads (Numba CUDA kernels) under each memory "
                 "manager, side by side (on a simulated device without a GPU)"))
    return parser


def main(argv=None):
    """Run ``numba-alloc`` with ``argv`` (default sys.argv[1:]); returns the
    exit status."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        try:
            registry.check_environment()     # (after parse_args: --help works regardless)
        except ValueError as error:
            raise UsageError(error) from None
        status = {"run": _run, "demo": _demo, "replay": replay.run, "summary": summary.run,
                  "bench": bench.main}[args.command](args)
        sys.stdout.flush()
    except UsageError as error:
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # as the Python docs advise: stdout to devnull, so that flushing it at exit cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EPIPE_STATUS
    return status

