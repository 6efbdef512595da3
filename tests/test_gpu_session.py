"""What a session lent a GPU runs (benchmarks/gpu_session.sh), tested on
the CPU: the script's arguments, its dry run and budget, one real step
with the files it leaves; the conformance parts, the JUnit comparison on
synthetic files, and the pytest plugin (the time limit and numba-cuda's
fixture)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
CONFORMANCE = ROOT / "benchmarks" / "conformance"
sys.path.insert(0, str(CONFORMANCE))

import conformance  # noqa: E402
import numba_alloc_conformance as plugin  # noqa: E402


def session(*args, env=None, **kwargs):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kwargs)


# -- the script ----------------------------------------------------------------------

def test_the_script_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", str(SCRIPT), str(SCRIPT.parent / "fetch_gpu_wheels.sh")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# The device allowance the plan is made for, in seconds: all of a session's
# device time (the machine's start, the transfers and idle waits included),
# a machine's start as planned, one call at most.
DEVICE_TIME, MACHINE_START, CALL_LIMIT = 900, 180, 600
TRANSFERS = 30      # planned: sending the tree, the files back, the wait between calls
RESERVE = 15        # the script's, for packing the results
SETUP = 30          # planned: installing the wheels and recording the machine
MERGE = 30          # the kernel records' merge after a kernels step
PACKING = 30        # the last pack past the budget, and a margin, before the timeout
PLANNED = [("tests heap defrag hooks", 450, 480), ("--budget 180 sweep bench", 180, 210)]
LATER = ["nrt", "reclaim demo", "conformance cudapy-2 cudapy-3",
         "kernels cg stencil", "kernels ragged churn",
         "LIMIT_CONFORMANCE=200 conformance cudapy-2", "LIMIT_KERNELS=350 kernels churn"]


def planned_calls(text):
    """The numbered calls of the plan: (command, the timeout_s on the next line)."""
    lines = text.splitlines()
    return [(line.strip()[3:], int(re.search(r"timeout_s (\d+)", lines[i + 1]).group(1)))
            for i, line in enumerate(lines) if re.match(r"\s*\d\. ", line)]


def test_plan_prints_a_session_of_two_device_calls_within_the_device_time():
    proc = session("plan")
    assert proc.returncode == 0
    assert planned_calls(proc.stdout) == [(f"bash benchmarks/gpu_session.sh {call}", timeout)
                                          for call, _, timeout in PLANNED]
    # the start and each call's timeout fit the session's device time
    assert MACHINE_START + sum(timeout for _, _, timeout in PLANNED) + TRANSFERS <= DEVICE_TIME
    assert all(budget + PACKING <= timeout <= CALL_LIMIT for _, budget, timeout in PLANNED)
    later = [line.strip().replace("bash benchmarks/gpu_session.sh ", "")
             for line in proc.stdout.splitlines()
             if "bash benchmarks/gpu_session.sh" in line and not re.match(r"\s*\d\. ", line)]
    assert later == LATER
    assert "15 minutes" in proc.stdout and "budget_left_s at least 240" in proc.stdout
    assert 'carry [".whl"]' in proc.stdout and "fetch_gpu_wheels.sh" in proc.stdout
    assert "first ran\non 2026-11-26" in proc.stdout


@pytest.mark.parametrize("call", [call for call, _, _ in PLANNED] + LATER)
def test_each_planned_call_ends_inside_its_budget(call):
    """A dry run counts each step as taking its whole limit: with the
    reserve, the planned setup and a kernels step's merge, the sum stays
    within the call's budget (450 s, or its own), so that no step is cut
    short by the budget or skipped."""
    words = call.split()
    env = dict(w.split("=") for w in words if "=" in w)
    args = [w for w in words if "=" not in w]
    proc = session("--dry-run", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    limits = [int(line.split("(limit ")[1].split("s)")[0])
              for line in proc.stdout.splitlines() if "(limit " in line]
    budget = int(args[1]) if args[0] == "--budget" else 450
    merge = MERGE if "kernels" in args else 0
    assert limits and sum(limits) + RESERVE + SETUP + merge <= budget
    assert "skipped" not in proc.stdout
    for name, value in env.items():             # a larger limit is the step's limit
        assert f"(limit {value}s)" in proc.stdout
    if "conformance" in args:
        parts = len(args) - 1
        assert proc.stdout.count("== conformance-") == 2 * parts
        # the managers alternate which goes first, part by part
        order = [line.split()[1] for line in proc.stdout.splitlines()
                 if line.startswith("== conformance-")]
        assert order[0].endswith("-default")
        assert parts == 1 or order[2].endswith("-numba_alloc")
        assert "--junitxml=" in proc.stdout and "--dist loadscope" in proc.stdout


def test_the_default_budget_is_the_main_calls():
    proc = session("--dry-run", "demo", env={"LIMIT_DEMO": "1000"})
    assert "== demo (limit 435s): " in proc.stdout                # 450 less the reserve


def test_a_small_budget_shortens_and_then_skips_steps():
    proc = session("--dry-run", "--budget", "120", "tests", "demo", "bench")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert lines[0].startswith("== tests-gpu (limit 105s)")       # 120 less the reserve
    assert lines[1].startswith("== tests-other: skipped")
    assert lines[2].startswith("== demo: skipped")
    assert lines[3].startswith("== bench: skipped")


def test_a_dry_run_shows_the_same_limits_however_slowly_the_shell_runs(tmp_path):
    """A dry run's clock is its steps' limits alone. It was the wall clock
    too, so on a loaded machine the limit above came out as 104 s and the
    test failed now and then; here every command after the set-up sleeps
    (BASH_ENV's DEBUG trap), which made it 102 s every time."""
    slow = tmp_path / "slow.sh"
    slow.write_text("trap '[[ -n ${SHOW+x} ]] && sleep 0.25' DEBUG\n")
    proc = session("--dry-run", "--budget", "120", "tests", "demo", "bench",
                   env={"BASH_ENV": str(slow)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert lines[0].startswith("== tests-gpu (limit 105s)")
    assert [line.split(",")[1] for line in lines[1:]] == [" 0s left in this call's budget"] * 3


def test_our_gpu_tests_run_first_each_part_under_its_own_limit():
    """pytest takes files alphabetically: test_bench.py and test_cli.py
    would spend the limit before test_gpu*.py."""
    proc = session("--dry-run", "tests")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    first, other = (line.split() for line in lines)
    assert first[:3] == ["==", "tests-gpu", "(limit"] and first[3] == "120s):"
    assert [w for w in first if w.startswith("tests/")] == [
        "tests/test_gpu.py", "tests/test_gpu_defrag.py", "tests/test_gpu_device_heap.py",
        "tests/test_gpu_marks.py", "tests/test_gpu_reclaim.py"]
    assert other[:4] == ["==", "tests-other", "(limit", "80s):"]
    assert "tests" in other and "gpu" in other and [w for w in other if "ignore" in w] == [
        "--ignore=tests/test_gpu.py", "--ignore=tests/test_gpu_defrag.py",
        "--ignore=tests/test_gpu_device_heap.py", "--ignore=tests/test_gpu_marks.py",
        "--ignore=tests/test_gpu_reclaim.py"]
    assert "--junitxml=" in lines[0] and "--junitxml=" in lines[1]


def test_all_runs_every_step_without_a_budget():
    proc = session("--dry-run", "all")
    steps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert steps[:7] == ["tests-gpu", "tests-other", "demo", "bench", "defrag", "sweep",
                         "kernels-all"]
    assert len([s for s in steps if s.startswith("conformance-")]) == 8
    assert "(limit 300s)" in proc.stdout          # kernels at its own limit: no budget
    assert "== heap (limit 100s): " in proc.stdout and "bench --heap" in proc.stdout
    assert "== reclaim (limit 100s): " in proc.stdout and "bench_reclaim_gpu.py" in proc.stdout
    assert "== hooks (limit 40s): " in proc.stdout and "bench_launch_hooks.py" in proc.stdout
    assert "== growth (limit 30s): " in proc.stdout and "bench_growth.py" in proc.stdout
    assert "== sweep (limit 30s): " in proc.stdout and "--chunks-per-block 1 2 4 8 16" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["nonsense"], "unknown step nonsense"),
    (["conformance", "cudapy-9"], "unknown part cudapy-9"),
    (["kernels", "matmul"], "unknown workload matmul"),
    (["--budget", "soon", "tests"], "--budget needs whole seconds"),
    (["--frobnicate"], "unknown option"),
])
def test_bad_arguments_are_refused(args, message):
    proc = session(*args)
    assert proc.returncode == 2 and message in proc.stderr


def test_no_step_prints_the_usage():
    proc = session()
    assert proc.returncode == 2 and "Steps:" in proc.stdout


def test_a_real_step_leaves_its_files_under_out(tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    proc = session("--budget", "100", "demo", env={"OUT": str(out),
                                                   "GPU_SESSION_STORE": str(store),
                                                   "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    names = sorted(os.listdir(out))
    assert names == ["machine.txt", "results.tar.gz", "session.log", "summary.txt",
                     "timings.tsv"]          # at most 8 files come back from a device call
    machine = (out / "machine.txt").read_text()
    for name in ("numpy", "numba", "numba-cuda", "cuda-bindings", "cuda-core", "python",
                 "CUDA driver API", "GPU (Numba)"):
        assert name in machine
    rows = [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines()]
    assert rows[0] == ["date", "step", "limit_s", "seconds", "exit", "status"]
    assert [r[1] for r in rows[1:]] == ["machine", "demo"]
    assert rows[2][2] == "25" and rows[2][4] == "0" and float(rows[2][3]) < 25
    with tarfile.open(out / "results.tar.gz") as tar:
        members = tar.getnames()
    assert "./logs/demo.txt" in members and "./timings.tsv" in members
    assert "demo" in (out / "summary.txt").read_text()


def test_a_step_past_its_limit_is_stopped_and_recorded(tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    slow = tmp_path / "python"          # the demo hangs; everything else runs as usual
    slow.write_text(f'#!/bin/sh\n[ "$2" = numba_alloc.cli ] && exec sleep 60\n'
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    env = {"OUT": str(out), "GPU_SESSION_STORE": str(store), "PYTHON": str(slow),
           "LIMIT_DEMO": "3", "MIN_STEP": "1"}
    proc = session("--budget", "0", "demo", env=env, timeout=120)
    assert proc.returncode == 0
    demo = [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines()
            if "\tdemo\t" in line][0]
    assert demo[4] == "124" and demo[5] == "stopped at its limit"
    assert 2 < float(demo[3]) < 15     # the limit, not the demo's 60 s



def test_the_nrt_step_gives_numba_cudas_nrt_tests_their_fixture_under_each_manager(tmp_path):
    """The nrt step runs numba-cuda's NRT tests three times (the default
    manager, numba_alloc, numba_alloc with nrt_heap_size): each of them a
    CUDATestCase, which needs the fixture numba_alloc_conformance gives.
    Here a stand-in Python runs a test of that kind instead of
    numba.cuda.tests.nrt (and nothing for the GPU tests and the benchmark):
    it passes under each of the three. Without the plugin every one of
    numba-cuda's NRT tests errored at set-up ("fixture
    'initialize_from_pytest_config' not found") under all three, and the
    comparison's verdict found no difference."""
    out, store, pkgs = tmp_path / "out", tmp_path / "store", tmp_path / "pkgs"
    (pkgs / "like_nrt").mkdir(parents=True)
    (pkgs / "like_nrt" / "__init__.py").write_text("")
    (pkgs / "like_nrt" / "test_like_nrt.py").write_text(textwrap.dedent("""
        import os
        import unittest
        import pytest

        @pytest.mark.usefixtures("initialize_from_pytest_config")
        class TestLikeNrt(unittest.TestCase):      # as numba-cuda's CUDATestCase
            def test_fixture_given(self):
                assert self._dump_failed_filechecks is False
                print("manager", os.environ.get("NUMBA_CUDA_MEMORY_MANAGER"))
    """))
    python = tmp_path / "python"
    python.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        args = sys.argv[1:]
        if args[:2] == ["-c", "import filecheck"]:      # carried in .whl on a GPU
            sys.exit(0)
        if "tests/test_gpu_nrt_heap.py" in args or "benchmarks/bench_nrt_heap.py" in args:
            sys.exit(0)                                 # the GPU's own, not tested here
        args = ["like_nrt" if a == "numba.cuda.tests.nrt" else a for a in args]
        os.execv({sys.executable!r}, [{sys.executable!r}, *args])
    """))
    python.chmod(0o755)
    env = {"OUT": str(out), "GPU_SESSION_STORE": str(store), "PYTHON": str(python),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(pkgs),
                                                       os.environ.get("PYTHONPATH")]))}
    proc = session("--budget", "0", "nrt", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = {}
    for run in ("default", "numba_alloc", "nrt_heap"):
        results, problems, _ = conformance.read_junit([store / "nrt" / f"numba-{run}.xml"])
        assert not problems
        runs[run] = sorted(outcome for outcome, _ in results.values())
    assert runs == {run: ["passed"] for run in runs}, runs
    compare = (store / "nrt" / "compare.txt").read_text()
    assert compare.count("      passed            1            1") == 2


# -- the conformance parts ----------------------------------------------------------

def test_every_test_module_is_in_exactly_one_part():
    modules = conformance.test_modules()
    assert len(modules) > 100
    assert "numba.cuda.tests.cudadrv.test_emm_plugins" in modules
    parts = {part: conformance.modules_of(part, modules) for part in conformance.PARTS}
    assert sorted(m for ms in parts.values() for m in ms) == modules
    assert "numba.cuda.tests.cudadrv.test_emm_plugins" in parts["other"]
    assert "numba.cuda.tests.cudapy.test_atomics" in parts["cudapy-1"]
    assert "numba.cuda.tests.cudapy.test_libdevice" in parts["cudapy-2"]
    assert "numba.cuda.tests.cudapy.test_warp_ops" in parts["cudapy-3"]
    assert all(parts.values())


# -- the comparison of two runs' JUnit XML -----------------------------------------------

def junit(path, cases):
    """A JUnit XML file as pytest writes it; ``cases`` are (classname,
    name, outcome, message) with outcome passed/failed/error/skipped/xfailed."""
    body = []
    for classname, name, outcome, message in cases:
        inner = {"passed": "",
                 "failed": f'<failure message="{message}">trace</failure>',
                 "error": f'<error message="{message}">trace</error>',
                 "skipped": f'<skipped type="pytest.skip" message="{message}">x</skipped>',
                 "xfailed": f'<skipped type="pytest.xfail" message="{message}" />'}[outcome]
        body.append(f'<testcase classname="{classname}" name="{name}" time="0.1">'
                    f'{inner}</testcase>')
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" '
                    f'tests="{len(cases)}">' + "".join(body) + "</testsuite></testsuites>")
    return path


LIMIT = "conformance: time limit reached, not run"


@pytest.fixture
def two_runs(tmp_path):
    junit(tmp_path / "other-default.xml", [
        ("m.T", "test_same", "passed", ""),
        ("m.T", "test_broken", "passed", ""),
        ("m.T", "test_fixed", "failed", "assert 1 == 2"),
        ("m.T", "test_both", "error", "boom"),
        ("m.T", "test_skip_external", "passed", ""),
        ("m.T", "test_default_only", "passed", ""),
        ("m.T", "test_cut", "passed", ""),
        ("m.T", "test_xfail", "xfailed", "known"),
        ("m.T", "test_teardown", "passed", ""),
    ])
    junit(tmp_path / "other-numba_alloc.xml", [
        ("m.T", "test_same", "passed", ""),
        ("m.T", "test_broken", "failed", "CUDA_ERROR_INVALID_VALUE&#10;more lines"),
        ("m.T", "test_fixed", "passed", ""),
        ("m.T", "test_both", "failed", "boom"),
        ("m.T", "test_skip_external", "skipped", "Skipped when using an external memory manager"),
        ("m.T", "test_cut", "skipped", LIMIT),
        ("m.T", "test_xfail", "xfailed", "known"),
        ("m.T", "test_teardown", "passed", ""),
        ("m.T", "test_teardown", "error", "teardown failed"),   # reported twice: the worst
        ("m.U", "test_new", "passed", ""),
    ])
    return tmp_path


def test_the_comparison_sorts_every_difference(two_runs):
    base, problems, base_cut = conformance.read_junit([two_runs / "other-default.xml"])
    cand, _, cand_cut = conformance.read_junit([two_runs / "other-numba_alloc.xml"])
    assert problems == [] and (base_cut, cand_cut) == (0, 1)
    assert cand["m.T::test_teardown"] == ("error", "teardown failed")
    assert "m.T::test_cut" not in cand                       # not reached: not a skip
    result = conformance.compare(base, cand)

    def ids(group):
        return [test for test, _, _ in result[group]]
    assert ids("regressions") == ["m.T::test_broken", "m.T::test_teardown"]
    assert result["regressions"][0][2] == ("failed", "CUDA_ERROR_INVALID_VALUE")
    assert ids("fixed") == ["m.T::test_fixed"]
    assert ids("failed_both") == ["m.T::test_both"]
    assert ids("skipped_differently") == ["m.T::test_skip_external"]
    assert ids("other_changes") == []
    assert ids("baseline_only") == ["m.T::test_cut", "m.T::test_default_only"]
    assert ids("candidate_only") == ["m.U::test_new"]
    assert result["totals"]["baseline"] == {"passed": 6, "failed": 1, "error": 1, "skipped": 0,
                                            "xfailed": 1, "total": 9}
    assert result["totals"]["candidate"] == {"passed": 3, "failed": 2, "error": 1, "skipped": 1,
                                             "xfailed": 1, "total": 8}


def test_the_comparison_command_reads_a_folder_and_prints_totals(two_runs):
    proc = subprocess.run([sys.executable, str(CONFORMANCE / "conformance.py"), "compare",
                           str(two_runs)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "JUnit XML: 1 file(s) for default, 1 for numba_alloc" in out
    assert "Passed under default, failed or errored under numba_alloc: 2" in out
    assert "m.T::test_broken: passed -> failed (CUDA_ERROR_INVALID_VALUE)" in out
    assert "not reached            0            1" in out
    assert "Verdict: 2 test(s) passed under default and failed or errored under numba_alloc" in out
    strict = subprocess.run([sys.executable, str(CONFORMANCE / "conformance.py"), "compare",
                             str(two_runs), "--strict"], capture_output=True, text=True)
    assert strict.returncode == 1



def test_a_comparison_whose_baseline_passed_nothing_is_not_a_pass(tmp_path):
    """Runs that all errored at set-up compare nothing: the verdict says so
    (not 'no test that passed ... failed'), and --strict fails."""
    for name in ("default", "numba_alloc"):
        junit(tmp_path / f"nrt-{name}.xml", [("m.T", "test_a", "error", "fixture not found"),
                                             ("m.T", "test_b", "error", "fixture not found")])
    command = [sys.executable, str(CONFORMANCE / "conformance.py"), "compare", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Verdict: nothing compared: no test passed under default" in proc.stdout
    assert "no test that passed under default failed" not in proc.stdout
    assert subprocess.run(command + ["--strict"], capture_output=True).returncode == 1

def test_a_missing_or_cut_off_file_is_reported_not_fatal(tmp_path):
    junit(tmp_path / "a-default.xml", [("m.T", "test_a", "passed", "")])
    (tmp_path / "a-numba_alloc.xml").write_text("<testsuites><testsuite><testcase")
    proc = subprocess.run([sys.executable, str(CONFORMANCE / "conformance.py"), "compare",
                           "--baseline", str(tmp_path / "a-default.xml"),
                           "--candidate", str(tmp_path / "a-numba_alloc.xml"),
                           str(tmp_path / "missing.xml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "unreadable (run cut off before pytest wrote it?)" in proc.stdout
    assert "Run under default only" in proc.stdout


# -- the plugin --------------------------------------------------------------------------

def test_the_plugin_loads_the_shim_alone_or_says_there_is_none(monkeypatch, tmp_path):
    if (ROOT / "numba_alloc" / "numpy_compat.py").exists():
        assert plugin.apply_shim().startswith("applied (")
    monkeypatch.setattr(plugin, "_shim_path", lambda: None)
    assert plugin.apply_shim().startswith("none")


def test_the_plugin_gives_numba_cudas_fixture_and_skips_after_the_deadline(tmp_path):
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import unittest
        import pytest

        @pytest.mark.usefixtures("initialize_from_pytest_config")
        class TestCase(unittest.TestCase):
            def test_option(self):
                assert self._dump_failed_filechecks is False

        def test_plain():
            pass
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CONFORMANCE), str(ROOT)])}

    def run(deadline):
        env["NUMBA_ALLOC_CONFORMANCE_DEADLINE"] = deadline
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "numba_alloc_conformance",
                               "-p", "no:cacheprovider", "-rs", "-v", str(tmp_path)],
                              capture_output=True, text=True, cwd=tmp_path, env=env)
    proc = run("")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    assert "conformance: memory manager" in proc.stdout and "NumPy shim" in proc.stdout
    late = run("1")                  # a deadline long past: nothing starts
    assert late.returncode == 0 and "2 skipped" in late.stdout
    assert "time limit reached" in late.stdout


# -- the benchmark scripts save as they go ------------------------------------------------

def test_the_benchmark_scripts_write_their_json_without_a_gpu(tmp_path):
    """Each writes its JSON after every section (atomically: no .tmp left);
    without a GPU only the CPU sections are there."""
    for script, name, key in (("bench_defrag.py", "defrag.json", "planner"),
                              ("bench_malloc.py", "results.json", "simulated_us_per_pair")):
        out = tmp_path / script
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick",
                               "--repeat", "1", "--out", str(out)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert os.listdir(out) == [name]
        result = json.loads((out / name).read_text())
        assert key in result and "gpu" not in result
