"""What the packaging promises beside the install itself (which
``.ci/check_install.sh`` checks in a fresh environment): the workloads are
``numba_alloc.workloads`` installed or not, never a top-level ``kernels``,
and the optional parts name their extra or degrade when it is missing."""

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import numba_alloc
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.cli.bench import suite

ROOT = Path(__file__).resolve().parents[1]


def python(code, cwd, **env):
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()


def test_the_install_maps_kernels_to_numba_alloc_workloads_only(tmp_path):
    try:
        metadata.distribution("numba-alloc")
    except metadata.PackageNotFoundError:
        pytest.skip("numba-alloc is not installed (a checkout on PYTHONPATH)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    name, origin, no_kernels = python(
        "import importlib.util as u; import numba_alloc.workloads.cg as cg; "
        "print(cg.__name__, cg.__file__, u.find_spec('kernels') is None)", cwd=tmp_path, **env)
    assert name == "numba_alloc.workloads.cg"
    assert Path(origin).read_bytes() == (ROOT / "kernels" / "cg.py").read_bytes()
    assert no_kernels == "True"       # outside the checkout, no top-level kernels


def test_a_checkout_that_is_not_installed_loads_its_kernels_folder(tmp_path):
    """As the GPU session runs the checkout: PYTHONPATH, no install."""
    name, origin, cupy_manager = python(
        "import sys, importlib.util as u; "
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
        "from numba_alloc.cli.bench import workloads; "
        "from numba_alloc.workloads.simulated import SimulatedArrays; "
        "print(SimulatedArrays.__module__, workloads.__file__, "
        "u.find_spec('numba_alloc.workloads.cupy_manager').origin)",
        cwd=tmp_path, **{**os.environ, "PYTHONPATH": str(ROOT)})
    assert name == "numba_alloc.workloads.simulated"
    assert Path(origin) == ROOT / "kernels" / "__init__.py"
    assert Path(cupy_manager) == ROOT / "kernels" / "cupy_manager.py"


def test_the_plots_name_the_extra_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"plot_segments needs matplotlib: "
                                          r"pip install 'numba-alloc\[plot\]'"):
        numba_alloc.plot_segments(snapshot={"segments": []})
    # before anything else: this pool records no history
    with pytest.raises(ImportError, match=r"numba-alloc\[plot\]"):
        numba_alloc.plot_timeline(Pool(SimulatedDevice("1GiB")))


def test_numba_alloc_dask_names_the_extra_without_distributed(monkeypatch):
    for name in [m for m in sys.modules if m.split(".")[:2] == ["numba_alloc", "dask"]]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ImportError, match=r"numba_alloc.dask needs distributed: "
                                          r"pip install 'numba-alloc\[dask\]'"):
        import numba_alloc.dask  # noqa: F401


def test_bench_plot_without_matplotlib_stops_before_running(monkeypatch, tmp_path, capsys):
    from numba_alloc.cli import main as cli
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "results"
    assert cli.main(["bench", "--simulated", "--plot", "--out", str(out)]) == 2
    assert "--plot needs matplotlib: pip install 'numba-alloc[plot]'" in capsys.readouterr().err
    assert not out.exists()


def test_bench_without_tqdm_reports_each_run_on_a_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(suite, "run_one", lambda mode, manager, workload, scale:
                        {"manager": manager, "workload": workload})
    runs = suite.run_suite("simulated", ["numba_alloc", "numba_alloc-defrag"], ["cg"], 0.5, 1)
    assert [r["manager"] for r in runs] == ["numba_alloc", "numba_alloc-defrag"]
    assert capsys.readouterr().err.splitlines() == [
        "numba-alloc bench: 1/2 runs done (cg under numba_alloc, repetition 1)",
        "numba-alloc bench: 2/2 runs done (cg under numba_alloc-defrag, repetition 1)"]


IMPORT_ONLY = """
import sys
import numpy as np
if sys.argv[1] == "numpy-2.5" and hasattr(np, "row_stack"):   # as NumPy 2.5 and later
    del np.row_stack
import numba_alloc
from numba.core.dispatcher import Dispatcher

def report(when):
    compiled = sorted(f"{module.__name__}.{name}" for module in list(sys.modules.values())
                      if module.__name__.startswith("numba_alloc")
                      for name, value in vars(module).items()
                      if isinstance(value, Dispatcher) and value.overloads)
    loaded = sorted(m for m in sys.modules if m == "numba.cuda" or m.startswith("numba.cuda.")
                    or m in ("numba_alloc.plugin.emm", "numba_alloc.plugin.relocation", "numba_alloc.device.kernels",
                             "numba_alloc.backends.cuda_device", "numba_alloc.plugin.device_heap",
                             "numba_alloc.observe.out_of_memory"))
    print(when, "compiled:", compiled, "cuda:", loaded)

report("import")
pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(64 << 20))
pool.free(pool.malloc(1000))
report("pool")
"""


@pytest.mark.parametrize("numpy", ["installed", "numpy-2.5"])
def test_importing_numba_alloc_imports_no_numba_cuda_and_compiles_nothing(numpy):
    """Neither the import nor a pool on a simulated device imports numba.cuda
    or the Numba glue, and neither compiles anything (the core is built
    ahead of time)."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_ONLY, numpy], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    imported, used = proc.stdout.splitlines()
    assert imported == "import compiled: [] cuda: []"
    # under NumPy 2.5 too: numpy_compat loads Numba's own array overloads
    assert used == "pool compiled: [] cuda: []"


def test_the_names_imported_on_first_use_are_numbas_and_the_same_everywhere():
    from numba.cuda.cudadrv.driver import CudaAPIError

    from numba_alloc.plugin import device_heap
    from numba_alloc.policy import errors
    from numba_alloc.observe import out_of_memory
    assert numba_alloc.OutOfMemoryError is out_of_memory.OutOfMemoryError
    assert issubclass(numba_alloc.OutOfMemoryError, CudaAPIError)
    assert issubclass(numba_alloc.OutOfMemoryError, MemoryError)
    assert numba_alloc.DeviceHeap is device_heap.DeviceHeap
    from numba_alloc.plugin import emm           # what NUMBA_CUDA_MEMORY_MANAGER=numba_alloc reads
    assert numba_alloc._numba_memory_manager is emm.NumbaAllocManager
    with pytest.raises(AttributeError, match="no attribute 'OutOfMemory'"):
        numba_alloc.OutOfMemory
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        errors.nothing


def test_the_metadata_names_the_authors_and_no_url_it_cannot_back(tmp_path):
    """pip show: Author is the numba_alloc developers; no Home-page or
    Project-URL, as the project has no public repository or site yet
    (docs/development.md)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, setuptools.build_meta as b; "
                               "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))",
         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = proc.stdout.split()[-1]
    fields = metadata.PathDistribution(tmp_path / info).metadata
    assert fields["Author"] == "the numba_alloc developers"
    assert fields["Name"] == "numba-alloc" and fields["License-Expression"] == "BSD-3-Clause"
    assert fields.get_all("Project-URL") is None and fields["Home-page"] is None
