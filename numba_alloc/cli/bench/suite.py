"""Running the suite: every (workload, manager) pair in its own process,
repeated, with the managers' order reversed every other repetition so that
machine drift cancels in the ratios; then the medians and ratios.
"""

import json
import os
import statistics
import subprocess
import sys

from .managers import MANAGERS

RUN_TIMEOUT_S = 1800
MEDIAN_FIGURES = ("wall_s", "alloc_host_s", "allocs", "alloc_p50_us", "alloc_p99_us",
                  "peak_reserved", "peak_live", "fragmentation")


def plan(managers, workloads, repeat):
    """(repetition, workload, manager) in run order: per repetition each
    workload runs under every manager back to back, in the given order on
    even repetitions and reversed on odd ones."""
    return [(rep, workload, manager)
            for rep in range(repeat)
            for workload in workloads
            for manager in (managers if rep % 2 == 0 else managers[::-1])]


def run_one(mode, manager, workload, scale):
    """The figures of one run, in a new process (see
    :mod:`numba_alloc.cli.bench.child`); a failed process gives
    ``outcome: 'error: ...'``."""
    spec = {"mode": mode, "manager": manager, "workload": workload, "scale": scale}
    env = os.environ if mode == "simulated" else MANAGERS[manager].environment(os.environ)
    try:
        proc = subprocess.run([sys.executable, "-m", "numba_alloc.cli.bench.child", json.dumps(spec)],
                              env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {**spec, "outcome": f"error: timed out after {RUN_TIMEOUT_S} s",
                "self_check": "not reached"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {**spec, "outcome": f"error: {reason}", "self_check": "not reached"}
    return json.loads(lines[-1])


def run_suite(mode, managers, workloads, scale, repeat, record=None):
    """Every planned run's figures, with ``repetition`` added, in run order,
    under a progress bar on stderr. With ``record`` (a path), each run is
    also appended to that file as one JSON line as soon as it finishes, so
    that a suite cut off keeps the runs it completed."""
    runs = []
    order = plan(managers, workloads, repeat)
    with _progress(len(order)) as bar:
        for rep, workload, manager in order:
            bar.set_postfix_str(f"{workload} under {manager}, repetition {rep + 1}")
            run = {"repetition": rep, **run_one(mode, manager, workload, scale)}
            runs.append(run)
            if record is not None:
                append_record(record, run)
            bar.update()
    return runs


class _Lines:
    """The progress without tqdm (the ``bench`` extra), or with stderr not
    a terminal (a log file has no use for a bar's carriage-return frames):
    a line on stderr as each run ends."""

    def __init__(self, total):
        self.total, self.done, self.postfix = total, 0, ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_postfix_str(self, text):
        self.postfix = text

    def update(self):
        self.done += 1
        print(f"numba-alloc bench: {self.done}/{self.total} runs done ({self.postfix})",
              file=sys.stderr, flush=True)


def _progress(total):
    """tqdm's progress bar on stderr when it is a terminal, else (or where
    tqdm is missing) :class:`_Lines`."""
    if not sys.stderr.isatty():
        return _Lines(total)
    try:
        from tqdm import tqdm
    except ImportError:
        return _Lines(total)
    return tqdm(total=total, desc="numba-alloc bench", unit="run", file=sys.stderr)


def append_record(path, record):
    """Append ``record`` to ``path`` as one JSON line, flushed to disk."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(path):
    """The JSON objects of a JSON-lines file and the number of lines that
    did not parse (a line cut off by a killed writer is skipped)."""
    records, bad = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    return records, bad


def summarize(runs, managers, workloads, baseline):
    """``{workload: {manager: figures}}``: the median of each figure over
    the repetitions that completed, the most out-of-memory failures of any,
    a self-check that passed only if every repetition's did ('not run', and
    outcome 'not run', when no run was recorded, as in a suite cut off), and
    ``wall_ratio``/``alloc_ratio``: the median over repetitions of the
    baseline's time divided by this manager's in the same repetition (above
    1: faster than the baseline)."""
    summary = {}
    for workload in workloads:
        by_rep = {}
        for run in runs:
            if run["workload"] == workload:
                by_rep.setdefault(run["repetition"], {})[run["manager"]] = run
        summary[workload] = {}
        for manager in managers:
            mine = [reps[manager] for reps in by_rep.values() if manager in reps]
            done = [r for r in mine if r["outcome"] == "completed"]
            figures = {key: statistics.median(r[key] for r in done)
                       if done and done[0].get(key) is not None else None
                       for key in MEDIAN_FIGURES}
            checks = [r["self_check"] for r in mine]
            figures["self_check"] = next((c for c in checks if c != "passed"),
                                         "passed" if mine else "not run")
            figures["outcome"] = next((r["outcome"] for r in mine if r["outcome"] != "completed"),
                                      "completed" if mine else "not run")
            figures["ooms"] = max((r.get("ooms", 0) for r in mine), default=0)
            figures["repetitions"] = len(done)
            for key, figure in (("wall_ratio", "wall_s"), ("alloc_ratio", "alloc_host_s")):
                ratios = [reps[baseline][figure] / reps[manager][figure]
                          for reps in by_rep.values()
                          if baseline in reps and manager in reps
                          and reps[baseline]["outcome"] == reps[manager]["outcome"] == "completed"]
                figures[key] = statistics.median(ratios) if ratios else None
            summary[workload][manager] = figures
    return summary
