"""``numba-alloc bench``: real Numba workloads (the ``kernels`` package) run
side by side under Numba's default memory manager, numba_alloc (defrag off
and on), RMM's pool and CuPy's MemoryPool, each run in its own process.

Modules: :mod:`~numba_alloc.bench.managers` (the managers and their probes),
:mod:`~numba_alloc.bench.child` (one run in one process),
:mod:`~numba_alloc.bench.suite` (the alternating plan, medians, ratios),
:mod:`~numba_alloc.bench.tables` (tables and targets),
:mod:`~numba_alloc.bench.plot` (the figure), :mod:`~numba_alloc.bench.command`
(the command line).
"""
