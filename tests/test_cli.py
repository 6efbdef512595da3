"""The numba-alloc command."""

import subprocess
import sys


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "numba_alloc.cli", *args],
                          capture_output=True, text=True, env=env)


def test_demo_runs_on_the_simulated_device_and_prints_the_report():
    out = run_cli("demo", "--simulated", "--steps", "5", "--scale", "2")
    assert out.returncode == 0, out.stderr
    assert "simulated device" in out.stdout
    assert "Reserved memory" in out.stdout and "fragmentation" in out.stdout
    # the demo frees everything it allocated
    allocated = next(line for line in out.stdout.splitlines() if line.startswith("Allocated memory"))
    assert allocated.split()[2:4] == ["0", "B"]


def test_run_executes_the_script_with_its_arguments(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import os, sys\n"
                      "print('args', sys.argv[1:], os.environ['NUMBA_CUDA_MEMORY_MANAGER'])\n"
                      "from numba.cuda.cudadrv import driver\n"
                      "import numba_alloc\n"
                      "assert driver._memory_manager is numba_alloc._numba_memory_manager\n")
    out = run_cli("run", str(script), "--flag", "x")
    assert out.returncode == 0, out.stderr
    assert "args ['--flag', 'x'] numba_alloc" in out.stdout
    assert "no device memory was allocated" in out.stderr


def test_run_reports_and_fails_when_the_script_fails(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("raise SystemExit(3)\n")
    out = run_cli("run", str(script))
    assert out.returncode == 3
    assert "numba_alloc" in out.stderr
