"""The reclaim hooks' host cost per kernel launch (numba_alloc.plugin.activity),
side by side from one run: a kernel of three pool arrays and three scalars,
launched with the hooks off (reclaim off) and on (reclaim on), in
alternating rounds in one process; the goal is at most 1.2x.

On a GPU the launch is numba-cuda's whole host path (the dispatcher, the
argument preparation, cuda-core's launch and the driver's cuLaunchKernel):
25 us on an H100 with the hooks off (benchmarks/results/2026-11-27-gpu-session).
Without one it runs over the driver stand-in (tests/standin): numba-cuda's
own Python launch path runs unchanged, but cuda-core's compiled launch and
the driver calls are the stand-in's Python, which checks every address of
the launch and queues the kernel (run when the round is synchronized,
outside the clock). That launch costs more than the rest of numba-cuda's
path (on the 2-core VM 50 to 80 us of CPU time, against a few us for a
real one), so the plain ratio over the stand-in *understates* the hooks.
The ratio beside it leaves out the time spent inside the stand-in's
launch (timed around it, in both modes): numba-cuda's Python path (with
the stand-in's few other driver calls), the hooks and any driver call they
make. It *overstates* them against a GPU, whose real launch adds a few us
to the baseline; it is the estimate the goal is judged on over the
stand-in. A driver call the hooks make (an event, say) is Python in the
stand-in and driver time on a GPU. Both figures are printed for two
clocks: wall time, and the launching thread's CPU time, which leaves out
what other processes take of a loaded machine's CPU.

    python benchmarks/bench_launch_hooks.py [--out DIR] [--rounds N] [--launches N]
        [--standin] [--against CHECKOUT [--turns N]] [--profile LAUNCHES]

Rounds alternate off and on (``--rounds`` pairs of ``--launches``
launches; the device is synchronized after each round, outside the clock);
it prints the median round and the best round of each mode, their ratios
and the median of the rounds' pairwise ratios. ``--standin`` runs over the
stand-in even where a GPU is present. ``--against``: another checkout of
numba_alloc (``git worktree add /tmp/before COMMIT``), measured by this
benchmark in processes that import its package, alternately with this
checkout's, ``--turns`` times (the order reversed every other turn): the
hooks before and after a change. ``--profile``: instead, cProfile's main
entries over that many launches with the hooks on, for each checkout.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_malloc import gpu_info, save, save_report, standin_env, versions  # noqa: E402

GOAL = 1.2
ELEMENTS = 4096
GRID, BLOCK = 128, 32


def axpbyc(a, b, c, x, y, z):
    """c = a * x + b * y + z, one element per thread."""
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] * x + b[i] * y + z


# the kernel with the signature of its launches (tests/ptx_kernels.py
# compiles it for sm_90 in CI)
PTX_KERNELS = [(axpbyc, "void(float32[::1], float32[::1], float32[::1], float64, float64, "
                        "float64)")]


# the clocks each round is timed with: wall time, and the launching thread's
# CPU time (on a loaded machine, what other processes take of the CPU is
# left out)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _standin_launch_clock():
    """Under the stand-in: wrap its launch (numba-cuda's module-level
    ``launch``, cuda-core's on a GPU) to add the seconds spent inside it to
    the returned dict (by clock). None on a GPU."""
    from numba.cuda import dispatcher
    try:
        import standin
    except ImportError:
        return None
    if standin.installed() is None:
        return None
    inside = dict.fromkeys(CLOCKS, 0.0)
    launch = dispatcher.launch
    wall, cpu = CLOCKS["wall"], CLOCKS["cpu"]

    def timed(*args):
        start_wall, start_cpu = wall(), cpu()
        # the stand-in's launch reads its caller's ``self`` (the _Kernel)
        self = sys._getframe(1).f_locals["self"]  # noqa: F841
        try:
            return launch(*args)
        finally:
            inside["cpu"] += cpu() - start_cpu
            inside["wall"] += wall() - start_wall

    dispatcher.launch = timed
    return inside


def measure(rounds, launches):
    """Per clock: the microseconds per launch of each round, off and on
    alternately, and (over the stand-in) those spent inside the stand-in's
    launch."""
    import numba_alloc
    from numba_alloc.plugin import activity
    kernel = cuda.jit(axpbyc)
    a, b, c = (cuda.to_device(np.full(ELEMENTS, i, np.float32)) for i in range(3))
    inside = _standin_launch_clock()
    with numba_alloc.device_pool() as pool:
        pass
    figures = {clock: {"off": [], "on": [], "standin_off": [], "standin_on": []}
               for clock in CLOCKS}
    for reclaim in (False, True):           # compiled, and each mode warmed up
        pool.configure(reclaim=reclaim)
        for _ in range(20):
            kernel[GRID, BLOCK](a, b, c, 1.0, 2.0, 3.0)
        cuda.synchronize()
    for _ in range(rounds):
        for mode in ("off", "on"):
            pool.configure(reclaim=mode == "on")
            if activity.installed() != (mode == "on"):
                raise RuntimeError(f"the hooks are {'' if activity.installed() else 'not '}"
                                   f"installed with reclaim {mode}")
            spent = dict(inside) if inside else None
            start = {clock: read() for clock, read in CLOCKS.items()}
            for _ in range(launches):
                kernel[GRID, BLOCK](a, b, c, 1.0, 2.0, 3.0)
            for clock, read in CLOCKS.items():
                figures[clock][mode].append(1e6 * (read() - start[clock]) / launches)
                if inside:
                    figures[clock]["standin_" + mode].append(
                        1e6 * (inside[clock] - spent[clock]) / launches)
            cuda.synchronize()
    pool.configure(reclaim=False)
    wrong = not np.allclose(c.copy_to_host(), 0 * 1.0 + 1 * 2.0 + 3.0)
    return {"clocks": figures, "standin": inside is not None, "wrong": wrong}


def profile(launches):
    """cProfile's table (the thread's CPU clock) of ``launches`` launches
    with the hooks on: the entries of numba_alloc and of numba-cuda's driver
    wrappers, by cumulative time (ratios between entries; the profiler adds
    to every call)."""
    import cProfile
    import io
    import pstats

    import numba_alloc
    kernel = cuda.jit(axpbyc)
    a, b, c = (cuda.to_device(np.full(ELEMENTS, i, np.float32)) for i in range(3))
    with numba_alloc.device_pool() as pool:
        pool.configure(reclaim=True)
    for _ in range(20):
        kernel[GRID, BLOCK](a, b, c, 1.0, 2.0, 3.0)
    cuda.synchronize()
    profiler = cProfile.Profile(time.thread_time)
    for _ in range(max(1, launches // 200)):
        profiler.enable()
        for _ in range(min(launches, 200)):
            kernel[GRID, BLOCK](a, b, c, 1.0, 2.0, 3.0)
        profiler.disable()
        cuda.synchronize()
    pool.configure(reclaim=False)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(r"numba_alloc/|cudadrv/driver.py|weakref", 24)
    return text.getvalue()


def summarize(figures, standin):
    """The side-by-side figures of one clock's rounds (from :func:`measure`):
    per mode the median and best round; the ratios of the medians, of the
    best rounds and the median of the pairwise ratios; over the stand-in
    (``standin``) the same without the time inside its launch, on which the
    goal is then judged."""
    def side(times):
        return {"median_us": statistics.median(times), "best_us": min(times)}

    def ratios(off, on):
        return {"median": statistics.median(on) / statistics.median(off),
                "best": min(on) / min(off),
                "pairwise": statistics.median(n / f for f, n in zip(off, on))}

    off, on = figures["off"], figures["on"]
    out = {"off": side(off), "on": side(on), "ratio": ratios(off, on),
           "hook_us": statistics.median(n - f for f, n in zip(off, on)), "goal": GOAL}
    if standin:
        bare_off = [t - s for t, s in zip(off, figures["standin_off"])]
        bare_on = [t - s for t, s in zip(on, figures["standin_on"])]
        out["standin_launch_us"] = statistics.median(figures["standin_off"] +
                                                     figures["standin_on"])
        out["bare_off"], out["bare_on"] = side(bare_off), side(bare_on)
        out["bare_ratio"] = ratios(bare_off, bare_on)
    judged = out["bare_ratio"] if standin else out["ratio"]
    out["met"] = judged["pairwise"] <= GOAL
    return out


def report(summaries, where):
    lines = [f"launch of a kernel of 3 pool arrays and 3 scalars, {where}; reclaim off "
             f"(no hooks) and on (hooks), alternating rounds:"]
    for clock, s in summaries.items():
        name = {"wall": "wall time", "cpu": "the launching thread's CPU time"}[clock]
        lines += [f"{name}:",
                  f"  off: {s['off']['median_us']:.2f} us median round, "
                  f"{s['off']['best_us']:.2f} best",
                  f"  on:  {s['on']['median_us']:.2f} us median round, "
                  f"{s['on']['best_us']:.2f} best  (hooks {s['hook_us']:+.2f} us, median of "
                  f"pairs)",
                  f"  on/off: {s['ratio']['pairwise']:.3f}x (median of pairs), "
                  f"{s['ratio']['median']:.3f}x medians, {s['ratio']['best']:.3f}x best rounds"]
        if "bare_ratio" in s:
            lines += [f"  inside the stand-in's launch: {s['standin_launch_us']:.2f} us per "
                      f"launch; without it off {s['bare_off']['median_us']:.2f} us, on "
                      f"{s['bare_on']['median_us']:.2f} us",
                      f"  on/off without the stand-in's launch: "
                      f"{s['bare_ratio']['pairwise']:.3f}x (median of pairs), "
                      f"{s['bare_ratio']['median']:.3f}x medians, "
                      f"{s['bare_ratio']['best']:.3f}x best rounds"]
        judged = "without the stand-in's launch" if "bare_ratio" in s else "the whole launch"
        lines.append(f"  goal: at most {s['goal']}x ({judged}, median of pairs): "
                     f"{'met' if s['met'] else 'NOT met'}")
    return "\n".join(lines)


def run_child(root, gpu, rounds, launches, profiled=0):
    """The figures of one measuring process importing the numba_alloc of
    checkout ``root`` (with ``profiled``, its profile of that many launches
    instead); RuntimeError when it fails or imports another one."""
    env = os.environ.copy() if gpu else standin_env()
    env["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_alloc"
    env["PYTHONPATH"] = os.pathsep.join([*filter(None, env.get("PYTHONPATH", "").split(
        os.pathsep)), root])
    proc = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(rounds),
                           "--launches", str(launches), "--profile", str(profiled)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    figures = json.loads(proc.stdout.splitlines()[-1])
    if profiled:
        return figures
    if not figures["package"].startswith(os.path.realpath(root) + os.sep):
        raise RuntimeError(f"{root}: the benchmark imported numba_alloc from "
                           f"{figures['package']}, not from the checkout")
    return figures


def merged(runs):
    """One set of figures from several runs of the same checkout: their
    rounds together (each round's pair stays a pair)."""
    out = {"clocks": {}, "standin": runs[0]["standin"],
           "wrong": any(run["wrong"] for run in runs)}
    for clock in CLOCKS:
        out["clocks"][clock] = {key: [t for run in runs for t in run["clocks"][clock][key]]
                                for key in runs[0]["clocks"][clock]}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--standin", action="store_true")
    parser.add_argument("--against")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child and args.profile:
        print(json.dumps({"profile": profile(args.profile)}))
        return 0
    if args.child:
        import numba_alloc
        print(json.dumps({**measure(args.rounds, args.launches),
                          "package": os.path.realpath(numba_alloc.__file__)}))
        return 0
    gpu = None if args.standin else gpu_info()
    where = f"on {gpu['gpu']}" if gpu else "over the driver stand-in"
    roots = {"this checkout": ROOT}
    if args.against:
        roots = {f"against ({args.against})": os.path.realpath(args.against), **roots}
    if args.profile:
        for name, root in roots.items():
            print(f"{name}, {where}:\n" + run_child(root, gpu, 0, 0, args.profile)["profile"])
        return 0
    runs = {name: [] for name in roots}
    try:
        for turn in range(args.turns):
            order = list(roots.items())
            for name, root in (order if turn % 2 == 0 else order[::-1]):
                runs[name].append(run_child(root, gpu, args.rounds, args.launches))
    except RuntimeError as e:
        print(e)
        return 1
    results, text = {}, []
    for name, figures in runs.items():
        figures = merged(figures)
        summary = {clock: summarize(times, figures["standin"])
                   for clock, times in figures["clocks"].items()}
        results[name] = {"figures": figures, "summary": summary}
        text.append((f"{name}:\n" if len(roots) > 1 else "") + report(summary, where)
                    + ("\nthe kernel's result was wrong" if figures["wrong"] else ""))
    print("\n\n".join(text))
    save({"versions": versions(), "gpu": gpu, "rounds": args.rounds, "launches": args.launches,
          "turns": args.turns, "results": results}, args.out)
    save_report("\n\n".join(text), args.out)
    return 1 if any(r["figures"]["wrong"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
