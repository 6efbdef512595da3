"""The numba-alloc command, run as a separate process as users run it."""

import argparse
import os
import re
import subprocess
import sys
import textwrap

import pytest
from gpu_marks import HAVE_GPU, needs_gpu

import numba_alloc
from numba_alloc.cli import main as cli
from numba_alloc.cli import demo


def run_cli(*args, cwd=None, module="numba_alloc.cli", env=None):
    return subprocess.run([sys.executable, "-m", module, *args],
                          capture_output=True, text=True, cwd=cwd, env=env)


def summary_row(text, label):
    """The four cells of a summary row: current, peak, total allocated, total freed."""
    line = next(line for line in text.splitlines() if line.startswith(label))
    return re.split(r"\s{2,}", line[len(label):].strip())


# -- the demo -------------------------------------------------------------------

def test_demo_on_the_simulated_device_reports_the_pool_at_its_peak_and_after_the_run():
    out = run_cli("demo", "--simulated", "--steps", "5", "--scale", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("demo: 5 steps of a Numba smoother on a simulated device")
    at_peak, _, after = out.stdout.partition("The pool after the run")
    assert "The pool at its peak (step 2," in at_peak
    allocated = summary_row(at_peak, "Allocated memory")
    assert allocated[0] == allocated[1] != "0 B"       # taken when current was the peak
    assert "Segments (" in at_peak and "fragmentation" in at_peak
    assert summary_row(after, "Allocated memory")[0] == "0 B"
    assert summary_row(after, "Allocated memory")[1] == allocated[1]


def test_a_one_step_demo_says_one_step(capsys):
    assert cli.main(["demo", "--simulated", "--steps", "1", "--scale", "1"]) == 0
    assert capsys.readouterr().out.startswith("demo: 1 step of a Numba smoother on")


def test_the_simulated_demo_makes_the_planned_requests_and_takes_the_summary_at_the_peak():
    steps, scale = 7, 1.0
    pool, peak = demo.run_simulated(steps=steps, scale=scale)
    plan = [sizes for _, sizes in demo.allocation_plan(steps, scale)]
    field = 4 * demo.field_elements(scale)
    stats = pool.memory_stats()
    # the two long-lived arrays, then each step's temporaries: nothing else
    assert stats["allocation.all.allocated"] == 2 + sum(len(sizes) for sizes in plan)
    assert stats["requested_bytes.all.allocated"] == 2 * field + 4 * sum(map(sum, plan))
    assert stats["allocation.all.current"] == 0
    assert peak.allocated == stats["allocated_bytes.all.peak"]
    assert peak.step % 3 == 2                           # a step with five levels
    assert "numba_alloc memory summary" in peak.summary


@needs_gpu
def test_the_demo_makes_the_same_requests_on_the_gpu_as_on_the_simulated_device():
    runs = [run_cli("demo", "--steps", "6", "--scale", "2", *extra)
            for extra in ([], ["--simulated"])]
    for out in runs:
        assert out.returncode == 0, out.stderr
    gpu, simulated = (out.stdout.partition("The pool after the run")[2] for out in runs)
    for label in ("Allocated memory", "Allocations"):
        assert summary_row(gpu, label) == summary_row(simulated, label)


# -- run: as python runs a program -------------------------------------------------

@pytest.fixture
def program(tmp_path):
    """A script in a subfolder that imports a module beside it."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "helper.py").write_text("WORD = 'sibling'\n")
    (tmp_path / "sub" / "main.py").write_text(textwrap.dedent("""\
        import os, sys
        import helper
        print(helper.WORD, __name__, sys.argv, __file__, sys.path[0])
        print(os.environ.get("NUMBA_CUDA_MEMORY_MANAGER"))
    """))
    return tmp_path


def test_run_executes_a_script_as_python_does(program):
    out = run_cli("run", "sub/main.py", "--flag", "-m", "x", cwd=program)
    assert out.returncode == 0, out.stderr
    python = subprocess.run([sys.executable, "sub/main.py", "--flag", "-m", "x"], cwd=program,
                            capture_output=True, text=True)
    first = python.stdout.splitlines()[0]
    assert first.startswith("sibling __main__ ['sub/main.py', '--flag', '-m', 'x'] ")
    assert first.endswith(os.sep + "sub")               # sys.path[0]: the script's folder
    # stdout is the program's alone (the report goes to stderr); sys.argv[0] is
    # the script's absolute path, as runpy sets it, and __file__ as python sets it
    script = first.split()[-2]
    assert out.stdout.splitlines()[0] == first.replace("'sub/main.py'", repr(script))
    assert len(out.stdout.splitlines()) == 2
    assert "numba_alloc" in out.stderr


def test_run_executes_a_module_with_dash_m_from_the_current_folder(program):
    (program / "tool.py").write_text("import sys\nprint(__name__, sys.argv, sys.path[0])\n")
    out = run_cli("run", "-m", "tool", "a", "--b", cwd=program)
    assert out.returncode == 0, out.stderr
    python = subprocess.run([sys.executable, "-m", "tool", "a", "--b"], cwd=program,
                            capture_output=True, text=True)
    tool = os.path.join(os.path.realpath(program), "tool.py")
    assert python.stdout == f"__main__ [{tool!r}, 'a', '--b'] {os.path.realpath(program)}\n"
    assert out.stdout == python.stdout


def test_where_the_plugin_cannot_be_installed_the_program_runs_without_it(program):
    simulator = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    simulator.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    out = run_cli("run", "sub/main.py", cwd=program, env=simulator)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "None"         # not set for its children either
    assert out.stderr.startswith("numba-alloc run: the program runs without numba_alloc: "
                                 "the CUDA simulator has no memory manager plugins")
    assert "no device memory was allocated" in out.stderr


@needs_gpu
def test_run_installs_the_plugin_for_the_program_and_its_children(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import os\n"
                      "print(os.environ['NUMBA_CUDA_MEMORY_MANAGER'])\n"
                      "from numba import cuda\n"
                      "from numba.cuda.cudadrv import driver\n"
                      "import numba_alloc\n"
                      "assert driver._memory_manager is numba_alloc._numba_memory_manager\n"
                      "x = cuda.device_array(1000)\n")
    out = run_cli("run", str(script))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "numba_alloc\n"
    assert "numba_alloc memory summary" in out.stderr


def standin_env():
    """The environment of a process whose CUDA driver is the checking
    stand-in (tests/standin): the plugin installs without a GPU."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER", "NUMBA_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(tests, "standin", "startup"), tests,
                                         env.get("PYTHONPATH", "")])
    return dict(env, NUMBA_ALLOC_STANDIN="1")


def test_run_writes_the_snapshot_and_the_trace_of_the_programs_allocations(tmp_path):
    from numba_alloc.observe.memory_viz import load_snapshot
    from numba_alloc.observe.trace import read_rmm_log
    (tmp_path / "prog.py").write_text("from numba import cuda\n"
                                      "import numpy as np\n"
                                      "a = cuda.device_array(1000)\n"
                                      "b = cuda.to_device(np.arange(5000.0))\n"
                                      "del a\n")
    out = run_cli("run", "--snapshot", "s.pickle", "--trace", "t.csv", "prog.py",
                  cwd=tmp_path, env=standin_env())
    assert out.returncode == 0, out.stderr
    assert out.stderr.endswith("numba-alloc run: wrote s.pickle\nnumba-alloc run: wrote t.csv\n")
    events = read_rmm_log(str(tmp_path / "t.csv"))
    assert [(e.action, e.size) for e in events] == [
        ("allocate", 8000), ("allocate", 40000), ("deallocate", 8000), ("deallocate", 40000)]
    snapshot = load_snapshot(tmp_path / "s.pickle")
    assert snapshot["stats"]["allocation.all.allocated"] == 2
    assert [(e["action"], e["size"]) for e in snapshot["device_traces"][0]
            if e["action"] == "alloc"] == [("alloc", 8000), ("alloc", 40000)]
    summary = run_cli("summary", str(tmp_path / "s.pickle"))
    assert summary.returncode == 0 and "numba_alloc memory summary: s.pickle" in summary.stdout


def test_run_reports_and_writes_every_pool_also_after_the_program_closes_cuda(tmp_path):
    """A program that uses GPUs 0 and 1, calls cuda.close(), uses GPU 0
    again and closes again: the report and the files cover its three
    pools, named by their GPU (the report denied any allocation, the files
    were named s.pool<k>, and --snapshot ended in the driver's
    CUDA_ERROR_INVALID_CONTEXT, writing nothing)."""
    from numba_alloc.observe.memory_viz import load_snapshot
    from numba_alloc.observe.trace import read_rmm_log
    (tmp_path / "prog.py").write_text("from numba import cuda\n"
                                      "a = cuda.device_array(1 << 20)\n"
                                      "with cuda.gpus[1]:\n"
                                      "    b = cuda.device_array(1 << 18)\n"
                                      "del a, b\n"
                                      "cuda.close()\n"
                                      "c = cuda.device_array(1 << 16)\n"
                                      "del c\n"
                                      "cuda.close()\n")
    out = run_cli("run", "--snapshot", "s.pickle", "--trace", "t.csv", "prog.py",
                  cwd=tmp_path, env=dict(standin_env(), NUMBA_ALLOC_STANDIN_DEVICES="2"))
    assert out.returncode == 0, out.stderr
    names = ("gpu0", "gpu0-1", "gpu1")
    assert out.stderr.endswith("".join(f"numba-alloc run: wrote {kind}.{name}.{ext}\n"
                                       for kind, ext in (("s", "pickle"), ("t", "csv"))
                                       for name in names))
    assert re.findall(r"memory summary: (cuda device \d)", out.stderr) == [
        "cuda device 0", "cuda device 0", "cuda device 1"]
    assert out.stderr.count("Device memory: unavailable: its CUDA context was closed") == 3
    assert "no device memory was allocated" not in out.stderr
    for name, nbytes in zip(names, (8 << 20, 8 << 16, 8 << 18)):
        assert [(e.action, e.size) for e in read_rmm_log(str(tmp_path / f"t.{name}.csv"))] == [
            ("allocate", nbytes), ("deallocate", nbytes)]
        stats = load_snapshot(tmp_path / f"s.{name}.pickle")["stats"]
        assert stats["requested_bytes.all.peak"] == nbytes


def test_run_refuses_a_snapshot_path_in_no_folder_before_running_the_program(tmp_path):
    (tmp_path / "prog.py").write_text("print('ran')\n")
    out = run_cli("run", "--snapshot", "nowhere/s.pickle", "prog.py", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("numba-alloc run: error: argument --snapshot: no folder ")


def test_an_exception_in_the_program_shows_as_python_shows_it(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("def f():\n    1 / 0\n\nf()\n")
    out = run_cli("run", str(script))
    python = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert out.returncode == python.returncode == 1
    assert python.stderr.startswith("Traceback") and python.stderr in out.stderr
    assert out.stderr.endswith("no device memory was allocated through the pool\n")
    assert "numba-alloc run: error" not in out.stderr


@pytest.mark.parametrize("code, status, stderr", [
    ("3", 3, ""), ("None", 0, ""), ("'bye'", 1, "bye\n")])
def test_the_programs_exit_status_is_passed_on(tmp_path, code, status, stderr):
    script = tmp_path / "leave.py"
    script.write_text(f"raise SystemExit({code})\n")
    out = run_cli("run", str(script))
    assert out.returncode == status
    assert out.stderr.endswith("no device memory was allocated through the pool\n" + stderr)


def test_an_interrupted_program_ends_with_status_130(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text("raise KeyboardInterrupt\n")
    out = run_cli("run", str(script))
    assert out.returncode == 130
    assert "KeyboardInterrupt" in out.stderr and "runpy" not in out.stderr


# -- summary of a snapshot file --------------------------------------------------------

def test_summary_reports_a_snapshot_file_as_memory_summary_reports_its_pool(tmp_path):
    from numba_alloc.observe.summary import format_summary
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB"))
    blocks = [pool.malloc(n) for n in (100, 5 << 20, 30 << 20)]
    pool.free(blocks[1])
    numba_alloc.dump_snapshot(tmp_path / "run.pickle", pool)
    out = run_cli("summary", str(tmp_path / "run.pickle"))
    assert out.returncode == 0 and out.stderr == ""
    title, *rest = out.stdout.splitlines()[1:]
    assert title.strip() == "numba_alloc memory summary: run.pickle"
    live = format_summary(pool).splitlines()[2:]
    ledger = live.index(next(line for line in live if line.startswith("Device memory")))
    end = live.index("-" * 84, ledger)
    assert rest == live[:ledger - 1] + live[end:]       # all but the device's ledger
    short = run_cli("summary", "--abbreviated", str(tmp_path / "run.pickle")).stdout
    assert "from large pool" not in short and "Segments" not in short and "Allocated" in short


def test_summary_refuses_a_pickle_that_would_run_code(tmp_path):
    import pickle
    (tmp_path / "evil.pickle").write_bytes(pickle.dumps({"segments": [], "stats": print}))
    out = run_cli("summary", str(tmp_path / "evil.pickle"))
    assert out.returncode == 2
    assert out.stderr == (f"numba-alloc summary: error: {tmp_path / 'evil.pickle'}: not a "
                          "snapshot pickle (it names builtins.print: a snapshot is plain "
                          "data)\n")


# -- errors: one line, status 2 -------------------------------------------------------

def forged_snapshots():
    """{file name: plain data no pool writes}: ``shared.pickle``, 9 KiB that
    read as 1,000 segments sharing one list of 1,000 blocks sharing one
    dict (a million blocks: a file of the kind 20 times larger, 4*10**8),
    a negative block size, a NaN counter."""
    stats = numba_alloc.Pool(numba_alloc.SimulatedDevice("1GiB")).memory_stats()

    def segment(*sizes):
        return {"address": 0, "total_size": sum(sizes), "segment_type": "large",
                "blocks": [{"address": 0, "size": size, "state": "inactive"} for size in sizes]}
    shared = segment(512)
    shared["blocks"] *= 1000
    shared["total_size"] *= 1000
    return {"shared.pickle": {"segments": [shared] * 1000, "stats": stats},
            "negative.pickle": {"segments": [segment(1024, -512, 512)], "stats": stats},
            "nan.pickle": {"segments": [], "stats": dict(stats, num_ooms=float("nan"))}}


ERRORS = [      # run in a folder holding the files that error_folder writes
    (["replay", "nofile.csv"], "replay",
     "can't read the trace 'nofile.csv': No such file or directory"),
    (["replay", "bad.csv"], "replay", "bad.csv, line 2"),
    (["replay", "--capacity", "12XB"], "replay", "argument --capacity: capacity must be"),
    (["replay", "--device", "--capacity", "1GiB"], "replay",
     "argument --device: not allowed with --capacity"),
    (["replay", "--capacity", "1GiB", "--device", "0"], "replay",
     "argument --device: not allowed with --capacity"),
    (["replay", "--conf", "growth:false,limit:1MiB"], "replay", "argument --conf: limit must"),
    (["demo", "--scale", "-1"], "demo", "argument --scale: must be a positive float"),
    (["demo", "--steps", "0"], "demo", "argument --steps: must be a positive int"),
    (["demo", "--scale", "1e308", "--steps", "1"], "demo",     # scale * MiB overflowed
     "argument --scale: must be a positive float of at most 8796093022208, got '1e308'"),
    (["demo", "--steps", str(10 ** 21)], "demo",
     f"argument --steps: must be a positive int of at most 100000, got '{10 ** 21}'"),
    (["demo", "--capacity", "1QB"], "demo", "argument --capacity"),
    (["replay", "--capacity", "-1GiB"], "replay",
     "argument --capacity: capacity must be a number of bytes"),
    (["demo", "--capacity", "0"], "demo",
     "argument --capacity: capacity must be a positive number of bytes"),
    (["demo", "--trace", "--steps", "5"], "demo", "argument --trace: not allowed with --steps"),
    (["demo", "--trace", "--scale", "2"], "demo", "argument --trace: not allowed with --scale"),
    (["replay", "--capacity", "0"], "replay",
     "argument --capacity: capacity must be a positive number of bytes"),
    (["demo", "--simulated", "--capacity", "64MiB", "--scale", "100"], "demo",
     "--scale 100 does not fit: out of memory: tried to allocate"),
    # the pool's hint would name a setting (reclaim:on) the demo cannot take
    (["demo", "--simulated", "--capacity", "10MiB"], "demo",
     "--scale 8 does not fit: out of memory: tried to allocate 8.00 MiB (8388608 bytes after "
     "rounding) on simulated device 0. Device: 10.00 MiB total, 2.00 MiB free. Pool: 8.00 MiB "
     "allocated, 0 B reserved but unallocated, largest free block 0 B, limit 10.00 MiB. "
     "Hint: a smaller --scale or a larger --capacity."),
    (["summary", "nofile.pickle"], "summary",
     "can't read the snapshot 'nofile.pickle': No such file or directory"),
    (["summary", "bad.csv"], "summary", "bad.csv: not a snapshot pickle"),
    (["summary", "shapeless.pickle"], "summary",
     "shapeless.pickle: not a numba_alloc snapshot: segments[0] has no 'address'"),
    (["summary", "no_stats.pickle"], "summary",
     "no_stats.pickle: not a numba_alloc snapshot: stats is a NoneType, not a dict"),
    (["summary", "shared.pickle"], "summary",
     "shared.pickle: not a numba_alloc snapshot: segments[0]['blocks'][1] is the same dict as "
     "another part"),
    (["summary", "negative.pickle"], "summary",
     "negative.pickle: not a numba_alloc snapshot: segments[0]['blocks'][1]['size'] is -512, "
     "not an int >= 0"),
    (["summary", "nan.pickle"], "summary",
     "nan.pickle: not a numba_alloc snapshot: stats['num_ooms'] is nan, not an int >= 0"),
    (["replay", "long.csv"], "replay", "long.csv, line 2: over 1048576 bytes"),
    (["run", "--snapshot", ".", "prog.py"], "run",
     "argument --snapshot: '.' is a folder: give a file's path"),
    (["run", "--trace", "", "prog.py"], "run", "argument --trace: the path is empty"),
    (["run"], "run", "expected a script, or -m and a module"),
    (["run", "-m"], "run", "argument -m: expected a module name"),
    (["run", "nofile.py"], "run", "can't open file"),
    (["run", "-m", "no_such_module_here"], "run", "no module named 'no_such_module_here'"),
    (["bench", "--size", "huge"], "bench", "argument --size: size must be one of"),
    (["bench", "--repeat", "0"], "bench", "argument --repeat: must be a positive int"),
    (["bench", "--simulated", "--managers", "default"], "bench",
     "argument --managers: needs a GPU: default"),
    (["bench", "--out", os.devnull], "bench", "argument --out:"),
    (["bench", "--heap", "--managers", "default"], "bench",
     "argument --heap: not allowed with --managers"),
    (["bench", "--heap", "--size", "large"], "bench", "argument --heap: not allowed with --size"),
    (["bench", "--heap", "--from-runs", "runs.jsonl"], "bench",
     "argument --heap: not allowed with --from-runs"),
    (["bench", "--heap", "--plot"], "bench",
     "argument --heap: not allowed with --plot (the heap suite takes only --simulated, "
     "--repeat and --out"),
]


@pytest.mark.parametrize("args, command, message", ERRORS,
                         ids=[" ".join(args) for args, _, _ in ERRORS])
def test_bad_input_is_one_error_line_with_status_2(tmp_path, args, command, message):
    import pickle
    header = "Thread,Time,Action,Pointer,Size,Stream\n"
    (tmp_path / "bad.csv").write_text(header + "1,0.1,allocate,0x10,-5,0\n")
    (tmp_path / "long.csv").write_text(header + "1" * (2 << 20))     # read a line at a time
    (tmp_path / "shapeless.pickle").write_bytes(pickle.dumps({"segments": [{}], "stats": {}}))
    (tmp_path / "no_stats.pickle").write_bytes(pickle.dumps({"segments": [], "stats": None}))
    for name, snapshot in forged_snapshots().items():
        (tmp_path / name).write_bytes(pickle.dumps(snapshot))
    (tmp_path / "prog.py").write_text("print('ran')\n")
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith(f"numba-alloc {command}: error: ") and message in last
    if not out.stderr.startswith("usage: "):     # (argparse's own errors: usage, then the line)
        assert out.stderr == last + "\n"


@pytest.mark.parametrize("command", ["demo", "replay", "run", "bench"])
def test_a_bad_numba_alloc_conf_is_one_error_line_and_help_still_works(command):
    env = dict(os.environ, NUMBA_ALLOC_CONF="limit:-1")
    out = run_cli(command, "--help", env=env)
    assert out.returncode == 0 and out.stdout.startswith("usage: numba-alloc "), out.stderr
    out = run_cli(command, *(["-m", "this"] if command == "run" else []), env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (f"numba-alloc {command}: error: NUMBA_ALLOC_CONF='limit:-1' is "
                          "invalid: limit must be a number of bytes (an int or a string such "
                          "as '4096MiB' or '8GiB'), a fraction of device memory in (0, 1] "
                          "such as 0.8, or none, got '-1'\n")


def test_bench_plot_without_matplotlib_is_an_error_line(tmp_path):
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('not here')\n")
    shadowed = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=shadowed)
    out = run_cli("bench", "--plot", "--out", str(tmp_path / "out"), env=env)
    assert out.returncode == 2
    assert out.stderr == ("numba-alloc bench: error: --plot needs matplotlib: "
                          "pip install 'numba-alloc[plot]'\n")


@pytest.mark.skipif(HAVE_GPU, reason="the replay without a GPU")
def test_replay_on_a_gpu_without_one_is_an_error_line():
    out = run_cli("replay", "--device")
    assert out.returncode == 2
    assert out.stderr == ("numba-alloc replay: error: argument --device: Numba finds no "
                          "usable CUDA GPU here\n")


def test_replay_on_a_missing_gpu_changes_no_setting(monkeypatch, capsys):
    """The device is checked before --conf is applied to every device (the
    settings were changed, then the command refused the device)."""
    from numba_alloc.plugin import registry
    monkeypatch.setattr(registry, "_defaults", registry._defaults)
    before = registry.settings()
    assert cli.main(["replay", "--device", "99", "--conf", "defrag:true,limit:0.5"]) == 2
    assert "argument --device" in capsys.readouterr().err
    assert registry.settings() == before


# -- version, help, pipes ---------------------------------------------------------------

@pytest.mark.parametrize("module", ["numba_alloc.cli", "numba_alloc"])
def test_version(module):
    out = run_cli("--version", module=module)
    assert out.returncode == 0
    assert out.stdout == f"numba-alloc {numba_alloc.__version__}\n"


def _parsers():
    parser = cli.make_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **commands.choices}


@pytest.mark.parametrize("command", list(_parsers()))
def test_help_is_plain_text_and_every_argument_has_some(command):
    out = run_cli(*([command] if command else []), "--help")
    assert out.returncode == 0, out.stderr
    assert not re.search(r"`|::|\*\*|:(func|class|mod):", out.stdout), out.stdout
    assert all(action.help for action in _parsers()[command]._actions)


@pytest.mark.parametrize("args", [["demo", "--steps", "2", "--scale", "1"], ["replay"],
                                  ["demo", "--trace"]])
def test_a_closed_stdout_ends_the_command_quietly(args):
    proc = subprocess.Popen([sys.executable, "-m", "numba_alloc.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()               # before the demo writes anything
    stderr = proc.stderr.read().decode()
    assert proc.wait() == cli.EPIPE_STATUS
    assert stderr == ""


@pytest.mark.parametrize("command, first", [("demo --simulated", "demo: 40 steps"),
                                            ("replay", "replay of ")])
def test_a_command_piped_to_head(command, first):
    out = subprocess.run(f"{sys.executable} -m numba_alloc.cli {command} | head -1",
                         shell=True, capture_output=True, text=True)
    assert out.stdout.startswith(first) and out.stdout.count("\n") == 1
    assert out.stderr == ""


def test_run_writes_the_snapshot_and_trace_of_each_pool_the_program_makes(tmp_path):
    """Without a GPU, the program's own pools (on simulated devices) are
    recorded from their start and written, one file each."""
    from numba_alloc.observe.memory_viz import load_snapshot
    from numba_alloc.observe.trace import read_rmm_log
    (tmp_path / "prog.py").write_text(
        "from numba_alloc import Pool, SimulatedDevice\n"
        "first = Pool(SimulatedDevice('64MiB'))\n"
        "kept = [first.malloc(1 << 20), first.malloc(3 << 20)]\n"
        "first.free(kept.pop())\n"
        "second = Pool(SimulatedDevice('64MiB'))\n"
        "other = second.malloc(5 << 20)\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CUDA_MEMORY_MANAGER"}
    out = run_cli("run", "--snapshot", "s.pickle", "--trace", "t.csv", "prog.py",
                  cwd=tmp_path, env=dict(env, NUMBA_ENABLE_CUDASIM="1"))     # no GPU either way
    assert out.returncode == 0, out.stderr
    assert out.stderr.endswith("numba-alloc run: wrote s.pool0.pickle\n"
                               "numba-alloc run: wrote s.pool1.pickle\n"
                               "numba-alloc run: wrote t.pool0.csv\n"
                               "numba-alloc run: wrote t.pool1.csv\n")
    first, second = (load_snapshot(tmp_path / f"s.pool{k}.pickle") for k in (0, 1))
    assert first["stats"]["allocated_bytes.all.current"] == 1 << 20
    assert first["stats"]["allocation.all.allocated"] == 2
    assert second["stats"]["allocated_bytes.all.current"] == 5 << 20
    assert [e["action"] for e in first["device_traces"][0]] == [
        "segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed"]
    events = read_rmm_log(str(tmp_path / "t.pool1.csv"))
    assert [(e.action, e.size) for e in events] == [("allocate", 5 << 20)]
