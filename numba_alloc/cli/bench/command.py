"""``numba-alloc bench``: the kernel workloads of ``kernels/`` under each
memory manager, side by side, with results.json, results.md and (with
``--plot``) results.png written to ``--out``.

Each run is appended to ``runs.jsonl`` in ``--out`` as it finishes (the
first line is a header: mode, size, managers, workloads, machine), and the
results are built from those records, so a suite cut off keeps its
completed runs; ``--from-runs FILE...`` builds the results from such files
(one suite's, or several calls' that each ran some workloads) without
running anything. ``--heap`` runs the device heap's suite instead
(:mod:`numba_alloc.cli.bench.heap`).
"""

import json
import os
import sys
import time

from .machine import machine

RUNS_FILE = "runs.jsonl"

SIMULATION_NOTE = (
    "SIMULATION: no GPU was used. Each workload's allocation sequence was replayed on "
    "numba_alloc's pool over a simulated device (its kernels' numerics checked at tiny "
    "size in Numba's CUDA simulator). Times are host times of the pool's Python policy, "
    "not GPU figures; the other managers (Numba's default, RMM, CuPy) need a GPU, so "
    "numba_alloc with defrag on is compared with defrag off.")


def add_arguments(parser):
    from numba_alloc.workloads import SIZES, WORKLOADS, parse_scale

    from ..arguments import positive, validated
    from .managers import MANAGERS
    parser.add_argument("--heap", action="store_true",
                        help="run the device heap's kernel-level suite (DeviceHeap against "
                             "CUDA's device malloc and an atomic bump allocator) instead of "
                             "the workloads; only --simulated, --repeat and --out apply")
    parser.add_argument("--simulated", action="store_true",
                        help="use the simulated device even when there is a GPU "
                             "(the default without one)")
    parser.add_argument("--size", type=validated(parse_scale),
                        help=f"{', '.join(SIZES)} or a scale (1.0: full size for an 80 GiB GPU); "
                             "default small")
    parser.add_argument("--repeat", type=positive(int), default=3,
                        help="repetitions (default 3)")
    parser.add_argument("--managers", nargs="+", choices=list(MANAGERS), metavar="MANAGER",
                        help=f"of {', '.join(MANAGERS)} (default: every one available)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), metavar="WORKLOAD",
                        help=f"of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--out", default="bench-results", help="directory for the results "
                                                               "(default bench-results)")
    parser.add_argument("--plot", action="store_true", help="also draw results.png (matplotlib)")
    parser.add_argument("--from-runs", nargs="+", metavar="FILE",
                        help=f"run nothing: build the results from {RUNS_FILE} files that "
                             "earlier runs wrote (merged; a later record of the same run wins)")


def _gpu_available():
    from numba import cuda
    return not cuda.config.ENABLE_CUDASIM and cuda.is_available()


def _choose_managers(requested, simulated):
    """The managers to run, baseline first; raises UsageError for one that
    cannot run here."""
    from ..arguments import UsageError
    from .managers import MANAGERS, SIMULATED
    if simulated:
        names = requested or list(SIMULATED)
        wrong = [m for m in names if m not in SIMULATED]
        if wrong:
            raise UsageError(f"argument --managers: needs a GPU: {', '.join(wrong)}; "
                             f"simulated mode runs {', '.join(SIMULATED)}")
    else:
        names = requested or [m for m in MANAGERS if MANAGERS[m].available()]
        missing = [m for m in names if not MANAGERS[m].available()]
        if missing:
            raise UsageError(f"argument --managers: not installed: "
                             f"{', '.join(MANAGERS[m].requires for m in missing)}")
    baseline = "numba_alloc" if simulated else "default"
    return sorted(dict.fromkeys(names), key=lambda m: m != baseline), baseline


def _with_device(machine, runs):
    machine = dict(machine)
    machine["device"] = next((r["device"] for r in runs if "device" in r), "none")
    driver = next((r["cuda_driver"] for r in runs if "cuda_driver" in r), None)
    if driver is not None:
        machine["cuda_driver"] = driver
    return machine


def main(args):
    from numba_alloc.workloads import WORKLOADS, parse_scale

    from ..arguments import UsageError
    from . import suite
    if args.plot:
        from ...observe.plots import require_matplotlib
        try:
            require_matplotlib("--plot")
        except ImportError as error:
            raise UsageError(error) from None
    if args.heap:
        from . import heap
        heap.check_arguments(args)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        raise UsageError(f"argument --out: {error}") from None
    if args.heap:
        return heap.run(args, _gpu_available())
    if args.from_runs:
        header, runs = read_runs(args.from_runs)
        return report(header, runs, args.out, args.plot)
    size = args.size or "small"
    scale = parse_scale(size)
    simulated = args.simulated or not _gpu_available()
    managers, baseline = _choose_managers(args.managers, simulated)
    workloads = args.workloads or list(WORKLOADS)
    header = {"mode": "simulated" if simulated else "gpu", "simulated": simulated,
              "date": time.strftime("%Y-%m-%d"), "machine": machine(), "size": size,
              "scale": scale, "repeat": args.repeat, "baseline": baseline,
              "managers": managers, "workloads": workloads}
    record = os.path.join(args.out, RUNS_FILE)
    with open(record, "w") as f:
        f.write(json.dumps({"header": header}) + "\n")
    runs = suite.run_suite(header["mode"], managers, workloads, scale, args.repeat, record=record)
    return report(header, runs, args.out, args.plot)


_HEADER_KEYS = ("mode", "simulated", "date", "machine", "size", "scale", "repeat",
                "baseline", "managers", "workloads")
_RUN_KEYS = ("workload", "manager", "repetition", "outcome", "self_check")
_COMPLETED_KEYS = ("wall_s", "alloc_host_s")


def _check_record(record, path):
    """UsageError naming ``path`` when ``record`` is not a header or a run
    as numba-alloc bench writes them."""
    from ..arguments import UsageError
    fields = record.get("header") if isinstance(record, dict) else None
    if isinstance(fields, dict):
        need, what = _HEADER_KEYS, "header"
    elif isinstance(record, dict) and "header" not in record:
        need, what = _RUN_KEYS, "run"
        if record.get("outcome") == "completed":
            need += _COMPLETED_KEYS
        fields = record
    else:
        raise UsageError(f"argument --from-runs: {path}: a line is not a header or a run "
                         f"record of numba-alloc bench, got {str(record)[:60]!r}")
    missing = [key for key in need if key not in fields]
    if missing:
        raise UsageError(f"argument --from-runs: {path}: a {what} record lacks "
                         f"{', '.join(missing)}")


def read_runs(paths):
    """The merged header and the runs of ``runs.jsonl`` files: managers and
    workloads in first-seen order (the baseline first), the most
    repetitions; the files must agree on mode, scale and baseline. Raises
    UsageError for a file that cannot be read, or whose records are not
    those numba-alloc bench writes, or that disagree."""
    from ..arguments import UsageError
    from . import suite
    header, runs = None, []
    for path in paths:
        try:
            records, bad = suite.read_records(path)
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"argument --from-runs: {error}") from None
        if bad:
            print(f"numba-alloc bench: {path}: skipped {bad} line(s) that did not parse "
                  "(cut off?)", file=sys.stderr)
        for record in records:
            _check_record(record, path)
        heads = [r["header"] for r in records if "header" in r]
        if not heads:
            raise UsageError(f"argument --from-runs: {path} has no header line")
        for head in heads:
            if header is None:
                header = dict(head, managers=list(head["managers"]),
                              workloads=list(head["workloads"]))
                continue
            for key in ("mode", "scale", "baseline"):
                if head[key] != header[key]:
                    raise UsageError(f"argument --from-runs: {path}: {key} {head[key]!r} "
                                     f"differs from {header[key]!r}")
            header["repeat"] = max(header["repeat"], head["repeat"])
            for key in ("managers", "workloads"):
                header[key] += [x for x in head[key] if x not in header[key]]
        runs += [r for r in records if "header" not in r]
    baseline = header["baseline"]
    header["managers"].sort(key=lambda m: m != baseline)
    return header, runs


def report(header, runs, out, plot):
    """Print the tables of ``runs`` and write results.json, results.md and
    (with ``plot``) results.png to ``out``; 1 if a run failed."""
    from numba_alloc.workloads import WORKLOADS

    from . import suite, tables
    simulated, baseline = header["simulated"], header["baseline"]
    managers, workloads = header["managers"], header["workloads"]
    mode = header["mode"]
    summary = suite.summarize(runs, managers, workloads, baseline)
    checks = None if simulated else tables.targets(summary)
    result = {"mode": mode, "simulated": simulated, "note": SIMULATION_NOTE if simulated else None,
              "date": header["date"], "machine": _with_device(header["machine"], runs),
              "size": header["size"], "scale": header["scale"], "repeat": header["repeat"],
              "baseline": baseline, "managers": managers, "workloads": workloads,
              "out_of_memory": {w: WORKLOADS[w].ON_OUT_OF_MEMORY for w in workloads},
              "summary": summary, "targets": checks, "runs": runs}

    heading = (f"numba-alloc bench: {mode}, size {header['size']} (scale {header['scale']:g}), "
               f"{header['repeat']} repetitions, on {result['machine']['device']}")
    ratios = f"Ratios: {baseline}'s time / each manager's, paired per repetition (median)."
    print(heading)
    if simulated:
        print(SIMULATION_NOTE)
    print(tables.text_table(summary))
    print(ratios)
    if checks is not None:
        print("Targets:\n" + tables.targets_text(checks))

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(_markdown(result, heading, ratios, tables, checks))
    if plot:
        from .plot import plot as draw
        draw(summary, managers, os.path.join(out, "results.png"),
             heading + (" (SIMULATION)" if simulated else ""))
    print(f"wrote {out}/results.json, results.md" + (", results.png" if plot else ""))
    expected = len(suite.plan(managers, workloads, header["repeat"]))
    if len(runs) < expected:
        print(f"numba-alloc bench: {len(runs)} of {expected} planned runs recorded",
              file=sys.stderr)
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
