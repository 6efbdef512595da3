"""``numba-alloc bench --heap``: the device heap's kernel-level suite
(``numba_alloc.workloads.heap_suite``), run in a child process, with its
side-by-side table printed and results.json and results.md written.

On a GPU the child runs the full-size cases with numba_alloc as Numba's
memory manager (the heaps come from its pool); without one, or with
``--simulated``, it runs the tiny cases in Numba's CUDA simulator
(correctness only: nothing is timed). The child appends each case's record
to ``cases.jsonl`` in ``--out`` as it finishes, so a run cut off keeps its
finished cases:

    python -m numba_alloc.cli.bench.heap '{"config": "full"|"tiny", "repeat": N,
                                       "record": PATH}'
"""

import json
import os
import subprocess
import sys
import time

from .machine import machine
from .tables import columns

CASES_FILE = "cases.jsonl"
SIMULATED_DEVICE = "256MiB"         # the simulated device of a tiny run
SIMULATED_BUDGET = 64 << 20         # the most one allocator may use there
GPU_BUDGET_FRACTION = 0.25          # of the GPU's free memory, per allocator

SIMULATION_NOTE = ("SIMULATION: no GPU, no timings claimed. Every case ran at tiny size in "
                   "Numba's CUDA simulator to check its results; CUDA's device malloc is "
                   "n/a (needs a GPU).")
NOT_WITH_HEAP = ("managers", "workloads", "from_runs", "plot", "size")

# the targets of a GPU run: (what, case, threads (None: the largest), size, figure, test)
TARGETS = (
    ("16 B per thread: at least 1000x faster than CUDA's device malloc",
     "per_thread", 16, "cuda_over_ours", lambda r: r >= 1000),
    ("16 B per thread: within 5x of the atomic bump floor (one atomic per warp)",
     "per_thread", 16, "ours_over_bump", lambda r: r <= 5),
    ("1 KiB per thread: at least 100x faster than CUDA's device malloc",
     "per_thread", 1024, "cuda_over_ours", lambda r: r >= 100),
)


def check_arguments(args):
    """Raise UsageError for an option ``--heap`` does not take."""
    from ..arguments import UsageError
    for name in NOT_WITH_HEAP:
        if getattr(args, name):
            option = "--" + name.replace("_", "-")
            raise UsageError(f"argument --heap: not allowed with {option} (the heap suite "
                             "takes only --simulated, --repeat and --out; it runs at full "
                             "size on a GPU, at tiny size in the simulator)")


def run(args, gpu):
    """``numba-alloc bench --heap``: run the suite (simulated unless
    ``gpu`` and not ``args.simulated``), report it; 1 if a check failed or
    the child failed, else 0."""
    simulated = args.simulated or not gpu
    record = os.path.join(args.out, CASES_FILE)
    open(record, "w").close()
    spec = {"config": "tiny" if simulated else "full", "repeat": args.repeat, "record": record}
    env = dict(os.environ)
    if simulated:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    else:
        from .managers import MANAGERS
        env = MANAGERS["numba_alloc"].environment(env)
    child = subprocess.Popen([sys.executable, "-m", "numba_alloc.cli.bench.heap", json.dumps(spec)],
                             env=env)
    try:
        child.wait()
        error = f"exit status {child.returncode} (its messages are above)" \
            if child.returncode else None
    except KeyboardInterrupt:           # the GPU session's time limit: report what finished
        child.kill()
        child.wait()
        error = "interrupted"
    from .suite import read_records
    records, _ = read_records(record)
    return report(records, simulated, args, error)


def failures(cases):
    """'case: allocator: check' of every failed check or case error."""
    bad = []
    for case in cases:
        if "error" in case:
            bad.append(f"{case['label']}: error: {case['error']}")
            continue
        for name, figures in case["allocators"].items():
            if figures.get("check", "passed").startswith("failed"):
                bad.append(f"{case['label']}: {name}: {figures['check']}")
    return bad


def targets(cases):
    """The goals of a GPU run, each with ``met`` True, False or None (not measured)."""
    by_key = {}
    for case in cases:
        if "error" not in case:
            by_key.setdefault((case["case"], case["size"]), []).append(case)
    checks = []
    for what, name, size, figure, test in TARGETS:
        runs = by_key.get((name, size), [])
        value = max(runs, key=lambda c: c["threads"])["ratios"].get(figure) if runs else None
        checks.append({"target": what, "value": value,
                       "met": None if value is None else bool(test(value))})
    fill = next((c for c in cases if c["case"] == "mixed_fill" and "error" not in c), None)
    checks.append({"target": "mixed sizes: no failed allocation below 90% of the heap live",
                   "value": fill and fill["allocators"]["numba_alloc"]["live_fraction_before"],
                   "met": None if fill is None
                   else not fill["allocators"]["numba_alloc"]["failed_below_90"]})
    emission = next((c for c in cases if c["case"] == "emission" and "error" not in c), None)
    value = emission and emission["ratios"]["two_pass_over_warp"]
    checks.append({"target": "particle emission (malloc_warp): at least as fast as count, scan, "
                             "allocate", "value": value, "met": None if value is None
                   else value >= 1})
    return checks


def report(records, simulated, args, error):
    """Print the table and write results.json and results.md to ``args.out``."""
    setup = next((r for r in records if r.get("case") == "setup"), {})
    cases = [r for r in records if r.get("case") != "setup"]
    bad = failures(cases)
    if error:
        bad.append(f"the suite stopped: {error}")
    checks = None if simulated else targets(cases)
    device = setup.get("device", "none")
    result = {"mode": "simulated" if simulated else "gpu", "simulated": simulated,
              "note": SIMULATION_NOTE if simulated else None, "date": time.strftime("%Y-%m-%d"),
              "machine": dict(machine(), device=device), "repeat": args.repeat,
              "setup": setup, "cases": cases, "targets": checks, "failures": bad}
    runs = ("tiny cases, each run once" if simulated
            else f"{args.repeat} timed repetitions after a warm-up")
    heading = f"numba-alloc bench --heap: {result['mode']}, {runs}, on {device}"
    table = text_table(cases)
    print(heading)
    if simulated:
        print(SIMULATION_NOTE)
    print(table)
    print(LEGEND)
    if checks is not None:
        print("Targets:\n" + targets_text(checks))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join([f"# {heading}", ""] + ([f"**{SIMULATION_NOTE}**", ""] if simulated
                                                    else [])
                          + [f"{result['date']}; " + ", ".join(
                              f"{k} {v}" for k, v in result["machine"].items()) + ".", "",
                             "```", table, "```", "", LEGEND, ""]
                          + (["Targets:", "", targets_text(checks), ""] if checks else [])
                          + [f"FAILED: {line}" for line in bad]) + "\n")
    print(f"wrote {args.out}/results.json, results.md")
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if bad else 0


LEGEND = ("ms: medians of CUDA-event times of the malloc and the free kernel, queued behind a "
          "busy kernel (the host's launch overhead not timed). warp bump: one atomic.add per "
          "warp (the floor); thread bump: one per allocation. CUDA/ours: CUDA's device malloc "
          "time over ours (above 1: ours faster); ours/bump: ours over the warp bump floor (1 "
          "at best). Other cases: fragmentation = address range / live bytes; fill = live "
          "bytes when the first allocation failed / heap; oom = rounds until malloc returned "
          "-1 (expected); emission = two-pass time / ours (malloc per thread, malloc_warp).")


def _ms(figures, key):
    value = figures.get(key)
    return "-" if value is None else f"{value:.3f}"


def _x(value):
    return "-" if value is None else f"{value:.3g}x"


def _skipped(figures):
    return figures.get("skipped")


def _other(case):
    """One line of figures for the cases that are not allocate/free."""
    a = case["allocators"]
    if case["case"] == "fragmentation":
        return "fragmentation " + ", ".join(
            f"{name} {_skipped(f) or _x(f['fragmentation'])}" for name, f in a.items())
    if case["case"] == "mixed_fill":
        f = a["numba_alloc"]
        return (f"fill: first failure in round {f['rounds']} at {f['live_fraction_before']:.1%}"
                f" live (granted {f['granted_fraction']:.1%} of {f['heap_size']} B)")
    if case["case"] == "oom":
        ours, bump = a["numba_alloc"], a["bump"]
        return (f"oom: ours {ours['rounds']} rounds (expected {ours['expected_rounds']}), "
                f"{ours['fraction_reached']:.1%} of the heap; bump {bump['rounds']} rounds")
    ours, warp, flat, r = a["numba_alloc"], a["numba_alloc_warp"], a["two_pass"], case["ratios"]
    return (f"emission: ours {_ms(ours, 'malloc_ms')} ms per thread, {_ms(warp, 'malloc_ms')} ms "
            f"malloc_warp, two-pass {_ms(flat, 'malloc_ms')} ms ({_x(r['two_pass_over_ours'])}, "
            f"{_x(r['two_pass_over_warp'])}), {ours['particles']} particles")


def text_table(cases):
    """The side-by-side table, one row per allocate/free case (the shared
    table layout: figures right-aligned), then one line per other case."""
    header = ("case", "threads", "size", "ours malloc", "ours free", "warp bump", "thread bump",
              "CUDA malloc", "CUDA free", "CUDA/ours", "ours/bump", "check")
    rows, others = [], []
    for case in cases:
        label = case.get("label", case.get("case"))
        if "error" in case:
            others.append(f"{label}: error: {case['error']}")
            continue
        a = case["allocators"]
        check = "passed" if not any(f.get("check", "").startswith("failed")
                                    for f in a.values()) else "FAILED"
        if case["case"] in ("fragmentation", "mixed_fill", "oom", "emission"):
            others.append(f"{_other(case)}; {case['threads']} threads; {check}")
            continue
        ours, bump, floor, cm = a["numba_alloc"], a["bump"], a["warp_bump"], a["cuda_malloc"]
        size = "mixed" if case["size"] is None else f"{case['size']} B"
        r = case["ratios"]
        rows.append((case["case"], str(case["threads"]), size,
                     _skipped(ours) or _ms(ours, "malloc_ms"), "" if _skipped(ours)
                     else _ms(ours, "free_ms"), _ms(floor, "malloc_ms"), _ms(bump, "malloc_ms"),
                     _skipped(cm) or _ms(cm, "malloc_ms"), "" if _skipped(cm)
                     else _ms(cm, "free_ms"), _x(r["cuda_over_ours"]), _x(r["ours_over_bump"]),
                     check))
    table = columns(header, rows, {"case", "check"})
    return "\n".join([table, ""] + others) if others else table


def targets_text(checks):
    marks = {True: "met", False: "NOT met", None: "not measured"}
    return "\n".join(f"  {marks[c['met']]}: {c['target']}"
                     + ("" if c["value"] is None else f" ({c['value']:.3g})") for c in checks)


# -- the child process ------------------------------------------------------------------

def _setup():
    """(pool, budget, device name) for this process: a simulated device
    under the CUDA simulator, else the current GPU's pool."""
    from numba import cuda
    if cuda.config.ENABLE_CUDASIM:
        from ...policy.pool import Pool
        from ...backends.simulated import SimulatedDevice
        return (Pool(SimulatedDevice(SIMULATED_DEVICE)), SIMULATED_BUDGET,
                f"CUDA simulator (simulated {SIMULATED_DEVICE})")
    free, _ = cuda.current_context().get_memory_info()
    name = cuda.get_current_device().name
    return None, int(free * GPU_BUDGET_FRACTION), name.decode() if isinstance(name, bytes) \
        else name


def main(argv=None):
    spec = json.loads((argv or sys.argv[1:])[0])
    from numba_alloc.workloads import heap_suite

    from .suite import append_record
    pool, budget, device = _setup()
    suite = heap_suite.Suite(heap_suite.CONFIGS[spec["config"]], spec["repeat"], pool, budget)
    append_record(spec["record"], {"case": "setup", "device": device, "budget": budget,
                                   "config": spec["config"],
                                   "cuda_malloc": suite.cuda_malloc.skipped
                                   or f"heap {suite.cuda_malloc.limit} bytes"})
    for label, case in heap_suite.plan(suite):
        try:
            record = {"label": label, **case()}
        except Exception as error:      # recorded; the next cases still run
            record = {"label": label, "case": label.split()[0],
                      "error": f"{type(error).__name__}: {error}"}
        append_record(spec["record"], record)
        print(f"numba-alloc bench --heap: {label} done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
