"""The on-disk cache of the driver stand-in's CPU kernels
(tests/standin/cpu_cache.py): a kernel compiled in one process is loaded,
not compiled, in the next, and runs right there; a kernel defined outside
the repository is never cached; an edit anywhere names a new directory."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standin import cpu_cache

TESTS = Path(__file__).parent

# compiles gpu_kernels.add_one (a repository file) and a kernel of its own
# for the stand-in's CPU target, runs both over a grid and prints what the
# dispatchers say of the cache
PROGRAM = """
import json, numba, numpy as np
from standin import cpu
from standin.kernels import Rebuilder
from gpu_kernels import add_one
from numba import cuda

def grid_index(x):
    x[cuda.grid(1)] = cuda.grid(1) * 10 + cuda.blockIdx.x

out = {}
for name, kernel in (("repository", add_one), ("outside", grid_index)):
    x = np.arange(96, dtype=np.int64)
    compiled = cpu.compile_kernel(kernel, Rebuilder(cpu.CUDA, wrap=numba.njit(boundscheck=True)),
                                  [x])
    compiled.run((3, 1, 1), (32, 1, 1), [x])
    stats = compiled._loop.stats
    out[name] = {"hits": sum(stats.cache_hits.values()),
                 "misses": sum(stats.cache_misses.values()), "x": x.tolist()}
print(json.dumps(out))
"""


def _run(cache):
    env = {**os.environ, "NUMBA_ALLOC_STANDIN_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=TESTS,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_kernel_compiled_in_one_process_is_loaded_in_the_next_and_runs_right(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    plus_one = list(range(1, 97))
    by_thread = [i * 10 + i // 32 for i in range(96)]
    assert first["repository"] == {"hits": 0, "misses": 1, "x": plus_one}
    # loaded: the thread state's address is resolved in the new process
    assert second["repository"] == {"hits": 1, "misses": 0, "x": plus_one}
    for run in (first, second):
        assert run["outside"] == {"hits": 0, "misses": 1, "x": by_thread}
    (directory,) = tmp_path.iterdir()
    assert directory.name == cpu_cache.tree_digest()
    assert len(list(directory.glob("*.nbi"))) == 1          # only the repository's kernel


def test_an_edit_to_any_source_file_names_a_new_directory(tmp_path):
    kernel = tmp_path / "kernels" / "k.py"
    helper = tmp_path / "tests" / "standin" / "helper.py"
    for path in (kernel, helper):
        path.parent.mkdir(parents=True)
        path.write_text("x = 1\n")
    before = cpu_cache.tree_digest(tmp_path)
    assert cpu_cache.tree_digest(tmp_path) == before
    helper.write_text("x = 2\n")
    edited = cpu_cache.tree_digest(tmp_path)
    assert edited != before
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "new.py").write_text("")
    assert cpu_cache.tree_digest(tmp_path) not in (before, edited)
    (tmp_path / "notes.txt").write_text("not a source file")
    (tmp_path / "benchmarks" / "new.py").unlink()
    assert cpu_cache.tree_digest(tmp_path) == edited


def test_only_directories_unused_for_a_day_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_ALLOC_STANDIN_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_cache, "_directory", None)
    old, recent = tmp_path / "old", tmp_path / "recent"
    for path in (old, recent):
        path.mkdir()
        (path / "kernel.nbi").write_bytes(b"")
    day_ago = time.time() - cpu_cache.STALE_SECONDS - 60
    os.utime(old, (day_ago, day_ago))
    here = cpu_cache.directory()
    assert here == tmp_path / cpu_cache.tree_digest()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([here.name, "recent"])


@pytest.mark.parametrize("closure, cached", [(3, True), ("text", True), (object(), False)])
def test_a_kernel_closing_over_anything_but_plain_values_is_not_cached(closure, cached):
    def kernel(x):
        x[0] = closure
    assert (cpu_cache.kernel_key(kernel) is not None) == cached
