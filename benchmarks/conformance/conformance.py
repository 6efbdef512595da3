"""numba-cuda's own test suite as a conformance check of numba_alloc: its
parts, and the test-by-test comparison of two runs' JUnit XML.

    python benchmarks/conformance/conformance.py parts
        each part and its number of test modules (in the installed numba-cuda)
    python benchmarks/conformance/conformance.py modules PART
        the part's test modules, space-separated, for ``pytest --pyargs``
    python benchmarks/conformance/conformance.py rootdir
        the folder to give pytest as --rootdir
    python benchmarks/conformance/conformance.py compare DIR
        compare DIR/*-default.xml with DIR/*-numba_alloc.xml
    python benchmarks/conformance/conformance.py compare --baseline A.xml ... --candidate B.xml ...

The suite (about 1,570 tests in numba-cuda 0.30) is run in parts, each
small enough for one device call: ``other`` (everything outside cudapy:
cudadrv, where the memory-management tests are, core, nrt, nocuda, cudasim,
benchmarks, doc_examples) and cudapy's modules in three parts by name.
Standard library only (the comparison runs anywhere).
"""

import argparse
import glob
import os
import sys
import xml.etree.ElementTree as ET

PARTS = ("other", "cudapy-1", "cudapy-2", "cudapy-3")
CUDAPY_SPLIT = {"cudapy-1": ("a", "c"), "cudapy-2": ("d", "l"), "cudapy-3": ("m", "z")}
TESTS_PACKAGE = "numba.cuda.tests"
BAD = ("failed", "error")
TIME_LIMIT_REASON = "conformance: time limit reached"      # see numba_alloc_conformance.py


# -- the parts -------------------------------------------------------------------

def test_modules():
    """Every test module of the installed numba-cuda, as dotted names
    (``numba.cuda.tests.cudapy.test_atomics``), sorted."""
    names = set()
    try:
        from importlib.metadata import distribution
        files = distribution("numba-cuda").files or []
    except Exception:
        files = []
    for f in files:
        parts = str(f).replace("\\", "/").split("/")
        if parts[-1].startswith("test_") and parts[-1].endswith(".py"):
            for i in range(len(parts) - 3):
                if parts[i:i + 3] == ["numba", "cuda", "tests"]:
                    names.add(".".join(parts[i:-1] + [parts[-1][:-3]]))
                    break
    if not names:      # not installed from a wheel: walk the package
        import importlib.util
        spec = importlib.util.find_spec(TESTS_PACKAGE)
        root = list(spec.submodule_search_locations)[0]
        for folder, _, filenames in os.walk(root):
            for name in filenames:
                if name.startswith("test_") and name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name[:-3]), root)
                    names.add(TESTS_PACKAGE + "." + rel.replace(os.sep, "."))
    return sorted(names)


def part_of(module):
    """The part a dotted test module name belongs to."""
    rest = module[len(TESTS_PACKAGE) + 1:].split(".")
    if len(rest) == 2 and rest[0] == "cudapy":
        first = rest[1][len("test_"):][:1].lower()
        for part, (low, high) in CUDAPY_SPLIT.items():
            if low <= first <= high:
                return part
        return "cudapy-3"
    return "other"


def modules_of(part, modules=None):
    if part not in PARTS:
        raise SystemExit(f"conformance: unknown part {part!r}; the parts: {', '.join(PARTS)}")
    return [m for m in (modules if modules is not None else test_modules()) if part_of(m) == part]


def rootdir():
    """The folder that holds the installed ``numba_cuda`` package: as
    pytest's rootdir, test ids name their module
    (``numba_cuda/numba/cuda/tests/cudapy/test_x.py::Class::test``); a
    rootdir the tests are not under gives ids without it."""
    import importlib.util
    spec = importlib.util.find_spec("numba_cuda")
    return os.path.dirname(list(spec.submodule_search_locations)[0])


# -- reading JUnit XML -----------------------------------------------------------

def outcome_of(testcase):
    """passed, failed, error, skipped or xfailed, and the first line of its message."""
    tags = {child.tag: child for child in testcase}
    for tag, outcome in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
        if tag in tags:
            element = tags[tag]
            if outcome == "skipped" and element.get("type") == "pytest.xfail":
                outcome = "xfailed"
            message = (element.get("message") or element.text or "").strip()
            return outcome, message.splitlines()[0][:160] if message else ""
    return "passed", ""


def read_junit(paths):
    """``{test id: (outcome, message)}`` over the files: the id is
    ``classname::name``; a test reported twice (a teardown error after a
    pass) keeps its worst outcome; a test skipped because the part's time
    limit was reached is left out (not run). A file that is missing or does not parse
    (a run killed before pytest wrote it) is reported in the second value;
    the third is the number of tests left out for the time limit."""
    rank = {"error": 4, "failed": 3, "passed": 2, "xfailed": 1, "skipped": 0}
    results, problems, cut = {}, [], set()
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as error:
            problems.append(f"{path}: {error}")
            continue
        for case in root.iter("testcase"):
            key = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome = outcome_of(case)
            if outcome[0] == "skipped" and TIME_LIMIT_REASON in outcome[1]:
                cut.add(key)        # not reached before the part's time limit
                continue
            if key not in results or rank[outcome[0]] > rank[results[key][0]]:
                results[key] = outcome
    return results, problems, len(cut - set(results))


# -- the comparison --------------------------------------------------------------

def compare(baseline, candidate):
    """The two runs side by side: ``totals`` per run, and the lists of test
    ids that differ (each with both outcomes)."""
    def group(name, keep):
        return name, sorted((k, baseline.get(k), candidate.get(k))
                            for k in set(baseline) | set(candidate)
                            if keep(baseline.get(k), candidate.get(k)))

    def out(result):
        return result[0] if result else None
    groups = dict((
        group("regressions", lambda b, c: out(b) == "passed" and out(c) in BAD),
        group("fixed", lambda b, c: out(b) in BAD and out(c) == "passed"),
        group("failed_both", lambda b, c: out(b) in BAD and out(c) in BAD),
        group("skipped_differently", lambda b, c: b and c and out(b) != out(c)
              and "skipped" in (out(b), out(c))),
        group("other_changes", lambda b, c: b and c and out(b) != out(c)
              and "skipped" not in (out(b), out(c))
              and not (out(b) == "passed" and out(c) in BAD)
              and not (out(b) in BAD and out(c) == "passed")
              and not (out(b) in BAD and out(c) in BAD)),
        group("baseline_only", lambda b, c: b and not c),
        group("candidate_only", lambda b, c: c and not b),
    ))
    totals = {}
    for name, results in (("baseline", baseline), ("candidate", candidate)):
        counts = {o: 0 for o in ("passed", "failed", "error", "skipped", "xfailed")}
        for outcome, _ in results.values():
            counts[outcome] += 1
        counts["total"] = len(results)
        totals[name] = counts
    return {"totals": totals, **groups}


def format_comparison(result, baseline_name="default", candidate_name="numba_alloc",
                      limit=60, not_reached=(0, 0)):
    lines = [f"numba-cuda's tests: {baseline_name} vs {candidate_name}", "",
             f"{'':>12} {baseline_name:>12} {candidate_name:>12}"]
    for key in ("passed", "failed", "error", "skipped", "xfailed", "total"):
        lines.append(f"{key:>12} {result['totals']['baseline'][key]:>12} "
                     f"{result['totals']['candidate'][key]:>12}")
    lines.append(f"{'not reached':>12} {not_reached[0]:>12} {not_reached[1]:>12}"
                 "   (skipped at the part's time limit; not counted above)")
    titles = {
        "regressions": f"Passed under {baseline_name}, failed or errored under {candidate_name}",
        "fixed": f"Failed or errored under {baseline_name}, passed under {candidate_name}",
        "failed_both": "Failed or errored under both",
        "skipped_differently": "Skipped under one only",
        "other_changes": "Other differences",
        "baseline_only": f"Run under {baseline_name} only (not reached or not collected "
                         f"under {candidate_name})",
        "candidate_only": f"Run under {candidate_name} only (not reached or not collected "
                          f"under {baseline_name})",
    }
    for key, title in titles.items():
        entries = result[key]
        lines += ["", f"{title}: {len(entries)}"]
        for test, b, c in entries[:limit]:
            def show(r):
                return "not run" if r is None else r[0] + (f" ({r[1]})" if r[1] else "")
            lines.append(f"  {test}: {show(b)} -> {show(c)}")
        if len(entries) > limit:
            lines.append(f"  ... and {len(entries) - limit} more")
    if result["regressions"]:
        verdict = "{n} test(s) passed under {b} and failed or errored under {c}"
    elif not result["totals"]["baseline"]["passed"]:
        verdict = "nothing compared: no test passed under {b} (did the runs set up?)"
    else:
        verdict = "no test that passed under {b} failed or errored under {c}"
    lines += ["", "Verdict: " + verdict.format(b=baseline_name, c=candidate_name,
                                               n=len(result["regressions"]))]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("parts", help="each part and its number of test modules")
    commands.add_parser("rootdir", help="the folder that holds the installed numba_cuda "
                                        "(pytest's --rootdir, for test ids with module names)")
    modules = commands.add_parser("modules", help="a part's test modules, space-separated")
    modules.add_argument("part", choices=PARTS)
    comp = commands.add_parser("compare", help="compare two runs' JUnit XML, test by test")
    comp.add_argument("dir", nargs="?", help="a folder of PART-default.xml and "
                                             "PART-numba_alloc.xml files")
    comp.add_argument("--baseline", nargs="+", default=[], metavar="XML")
    comp.add_argument("--candidate", nargs="+", default=[], metavar="XML")
    comp.add_argument("--names", nargs=2, default=("default", "numba_alloc"),
                      metavar=("BASELINE", "CANDIDATE"))
    comp.add_argument("--limit", type=int, default=60, help="tests listed per group")
    comp.add_argument("--strict", action="store_true",
                      help="exit 1 if a test passed under the baseline only, or "
                           "none passed under it (nothing was compared)")
    args = parser.parse_args(argv)

    if args.command == "parts":
        every = test_modules()
        for part in PARTS:
            print(f"{part}: {len(modules_of(part, every))} modules")
        return 0
    if args.command == "rootdir":
        print(rootdir())
        return 0
    if args.command == "modules":
        print(" ".join(modules_of(args.part)))
        return 0
    baseline, candidate = list(args.baseline), list(args.candidate)
    if args.dir:
        baseline += sorted(glob.glob(os.path.join(args.dir, f"*-{args.names[0]}.xml")))
        candidate += sorted(glob.glob(os.path.join(args.dir, f"*-{args.names[1]}.xml")))
    if not baseline and not candidate:
        parser.error("compare: give a folder, or --baseline and --candidate files")
    base, problems, base_cut = read_junit(baseline)
    cand, more, cand_cut = read_junit(candidate)
    result = compare(base, cand)
    print(f"JUnit XML: {len(baseline)} file(s) for {args.names[0]}, "
          f"{len(candidate)} for {args.names[1]}")
    for problem in problems + more:
        print(f"unreadable (run cut off before pytest wrote it?): {problem}")
    print(format_comparison(result, *args.names, limit=args.limit,
                            not_reached=(base_cut, cand_cut)))
    vacuous = not result["totals"]["baseline"]["passed"]
    return 1 if args.strict and (result["regressions"] or vacuous) else 0


if __name__ == "__main__":
    sys.exit(main())
