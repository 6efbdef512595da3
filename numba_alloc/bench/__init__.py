"""``numba-alloc bench``: real Numba workloads (:data:`workloads`, the
repository's ``kernels/`` folder, installed as ``numba_alloc.workloads``) run
side by side under Numba's default memory manager, numba_alloc (defrag off
and on), RMM's pool and CuPy's MemoryPool, each run in its own process.

Modules: :mod:`~numba_alloc.bench.managers` (the managers and their probes),
:mod:`~numba_alloc.bench.child` (one run in one process),
:mod:`~numba_alloc.bench.suite` (the alternating plan, medians, ratios),
:mod:`~numba_alloc.bench.tables` (tables and targets),
:mod:`~numba_alloc.bench.plot` (the figure), :mod:`~numba_alloc.bench.command`
(the command line).
"""

import importlib
import importlib.util
import sys
from pathlib import Path


def _workloads():
    """``numba_alloc.workloads``: installed (an install maps ``kernels/``
    there), or, in a checkout run without installing (``PYTHONPATH=`` the
    checkout, as the GPU session does), loaded from its ``kernels/``."""
    name = "numba_alloc.workloads"
    if importlib.util.find_spec(name) is None:
        folder = Path(__file__).resolve().parents[2] / "kernels"
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
