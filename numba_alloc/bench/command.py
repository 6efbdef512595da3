"""``numba-alloc bench``: the kernel workloads of ``kernels/`` under each
memory manager, side by side, with results.json, results.md and (with
``--plot``) results.png written to ``--out``.
"""

import json
import os
import platform
import sys
import time

SIMULATION_NOTE = (
    "SIMULATION: no GPU was used. Each workload's allocation sequence was replayed on "
    "numba_alloc's pool over a simulated device (its kernels' numerics checked at tiny "
    "size in Numba's CUDA simulator). Times are host times of the pool's Python policy, "
    "not GPU figures; the other managers (Numba's default, RMM, CuPy) need a GPU, so "
    "numba_alloc with defrag on is compared with defrag off.")


def add_arguments(parser):
    from kernels import SIZES, WORKLOADS

    from .managers import MANAGERS
    parser.add_argument("--simulated", action="store_true",
                        help="use the simulated device even when there is a GPU "
                             "(the default without one)")
    parser.add_argument("--size", default="small",
                        help=f"{', '.join(SIZES)} or a scale (1.0: full size for an 80 GiB GPU); "
                             "default small")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--managers", nargs="+", choices=list(MANAGERS), metavar="MANAGER",
                        help=f"of {', '.join(MANAGERS)} (default: every one available)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), metavar="WORKLOAD",
                        help=f"of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--out", default="bench-results", help="directory for the results "
                                                               "(default bench-results)")
    parser.add_argument("--plot", action="store_true", help="also draw results.png (matplotlib)")


def _gpu_available():
    from numba import cuda
    return not cuda.config.ENABLE_CUDASIM and cuda.is_available()


def _choose_managers(requested, simulated):
    """The managers to run, baseline first; raises SystemExit for one that
    cannot run here."""
    from .managers import MANAGERS, SIMULATED
    if simulated:
        names = requested or list(SIMULATED)
        wrong = [m for m in names if m not in SIMULATED]
        if wrong:
            raise SystemExit(f"numba-alloc bench: needs a GPU: {', '.join(wrong)}; "
                             f"simulated mode runs {', '.join(SIMULATED)}")
    else:
        names = requested or [m for m in MANAGERS if MANAGERS[m].available()]
        missing = [m for m in names if not MANAGERS[m].available()]
        if missing:
            raise SystemExit(f"numba-alloc bench: not installed: "
                             f"{', '.join(MANAGERS[m].requires for m in missing)}")
    baseline = "numba_alloc" if simulated else "default"
    return sorted(dict.fromkeys(names), key=lambda m: m != baseline), baseline


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _machine(runs):
    from importlib.metadata import version
    import numba
    return {"python": platform.python_version(), "numba": numba.__version__,
            "numba-cuda": version("numba-cuda"), "cpu": _cpu_name(), "cores": os.cpu_count(),
            "device": next((r["device"] for r in runs if "device" in r), "none")}


def main(args):
    from kernels import WORKLOADS, parse_scale

    from . import suite, tables
    try:
        scale = parse_scale(args.size)
    except ValueError as error:
        raise SystemExit(f"numba-alloc bench: {error}")
    if args.repeat < 1:
        raise SystemExit("numba-alloc bench: --repeat must be at least 1")
    simulated = args.simulated or not _gpu_available()
    managers, baseline = _choose_managers(args.managers, simulated)
    workloads = args.workloads or list(WORKLOADS)
    mode = "simulated" if simulated else "gpu"

    runs = suite.run_suite(mode, managers, workloads, scale, args.repeat)
    summary = suite.summarize(runs, managers, workloads, baseline)
    checks = None if simulated else tables.targets(summary)
    result = {"mode": mode, "simulated": simulated, "note": SIMULATION_NOTE if simulated else None,
              "date": time.strftime("%Y-%m-%d"), "machine": _machine(runs), "size": args.size,
              "scale": scale, "repeat": args.repeat, "baseline": baseline, "managers": managers,
              "workloads": workloads,
              "out_of_memory": {w: WORKLOADS[w].ON_OUT_OF_MEMORY for w in workloads},
              "summary": summary, "targets": checks, "runs": runs}

    heading = (f"numba-alloc bench: {mode}, size {args.size} (scale {scale:g}), "
               f"{args.repeat} repetitions, on {result['machine']['device']}")
    ratios = f"Ratios: {baseline}'s time / each manager's, paired per repetition (median)."
    print(heading)
    if simulated:
        print(SIMULATION_NOTE)
    print(tables.text_table(summary))
    print(ratios)
    if checks is not None:
        print("Targets:\n" + tables.targets_text(checks))

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(_markdown(result, heading, ratios, tables, checks))
    if args.plot:
        from .plot import plot
        plot(summary, managers, os.path.join(args.out, "results.png"),
             heading + (" (SIMULATION)" if simulated else ""))
    print(f"wrote {args.out}/results.json, results.md" + (", results.png" if args.plot else ""))
    failed = [r for r in runs
              if r["self_check"].startswith("failed") or r["outcome"].startswith("error")]
    for r in failed:
        print(f"FAILED: {r['workload']} under {r['manager']}: {r['outcome']}; "
              f"self-check {r['self_check']}", file=sys.stderr)
    return 1 if failed else 0


def _markdown(result, heading, ratios, tables, checks):
    machine = ", ".join(f"{k} {v}" for k, v in result["machine"].items())
    parts = [f"# {heading}", ""]
    if result["simulated"]:
        parts += [f"**{SIMULATION_NOTE}**", ""]
    parts += [f"{result['date']}; {machine}.", "", tables.markdown_table(result["summary"]), "",
              ratios + " Times are medians over the repetitions that completed; "
              "alloc host ms counts every allocation and free call.", ""]
    if checks is not None:
        parts += ["Targets:", "", tables.targets_text(checks), ""]
    policies = "; ".join(f"{w} {policy}" for w, policy in result["out_of_memory"].items())
    parts += [f"Out of memory: {policies}.", ""]
    return "\n".join(parts)
