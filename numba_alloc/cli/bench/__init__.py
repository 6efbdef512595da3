"""``numba-alloc bench``: real Numba workloads (:data:`workloads`, the
repository's ``kernels/`` folder, installed as ``numba_alloc.workloads``) run
side by side under Numba's default memory manager, numba_alloc (defrag off
and on), RMM's pool and CuPy's MemoryPool, each run in its own process.

Modules: :mod:`~numba_alloc.cli.bench.managers` (the managers and their probes),
:mod:`~numba_alloc.cli.bench.child` (one run in one process),
:mod:`~numba_alloc.cli.bench.suite` (the alternating plan, medians, ratios),
:mod:`~numba_alloc.cli.bench.tables` (tables and targets),
:mod:`~numba_alloc.cli.bench.plot` (the figure), :mod:`~numba_alloc.cli.bench.command`
(the command line).
"""

import importlib
import importlib.util
import sys
from pathlib import Path


def _workloads():
    """``numba_alloc.workloads``: in a checkout (``PYTHONPATH=`` the
    checkout, as the GPU session does), the ``kernels/`` next to this
    ``numba_alloc``, even where another checkout is installed in editable
    mode; else the installed one (an install maps ``kernels/`` there)."""
    name = "numba_alloc.workloads"
    folder = Path(__file__).resolve().parents[3] / "kernels"
    if name not in sys.modules and (folder / "__init__.py").is_file():
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)])
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        sys.modules["numba_alloc"].workloads = module
    return importlib.import_module(name)


workloads = _workloads()
