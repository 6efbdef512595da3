"""Every test module collects where optional packages are missing (the GPU
image has no nbclient, nbformat, ipykernel or tqdm, CI no cupy): a module
that imported one unguarded would stop ``pytest -m gpu`` at collection and
nothing would run. Their tests skip instead, naming what is missing."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

# the test and notebook tools, and what the project or its benchmarks may
# import that an image can lack
MISSING = ("nbclient", "nbformat", "ipykernel", "jupyter_client", "hypothesis", "torch",
           "cupy", "rmm", "tqdm", "matplotlib", "pynvml", "dask", "distributed", "dask_cuda",
           "pandas")

BLOCKER = textwrap.dedent("""
    import os
    import sys

    MISSING = set(os.environ["BLOCKED_MODULES"].split(","))

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in MISSING:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
""")


def test_every_module_collects_without_the_optional_packages(tmp_path):
    (tmp_path / "missing_packages.py").write_text(BLOCKER)
    env = {**os.environ, "BLOCKED_MODULES": ",".join(MISSING),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}       # hypothesis registers a plugin
    out = subprocess.run(       # without pyproject's addopts (-n: pytest-xdist's plugin)
        [sys.executable, "-m", "pytest", "-p", "missing_packages", "-p", "no:cacheprovider",
         "-o", "addopts=", "--collect-only", "-q", "-rs", str(TESTS)],
        env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr     # 2: a collection error
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    for module, package in (("test_notebook.py", "nbformat"), ("test_properties.py", "hypothesis"),
                            ("test_bench.py", "tqdm"), ("test_plots.py", "matplotlib"),
                            ("test_dask.py", "distributed")):
        assert any(module in line and package in line for line in skipped), out.stdout


# imported by every Python process the test starts (sitecustomize): no
# libNVVM found, as where neither the cu12/cu13 extra nor a CUDA toolkit is
# installed (cuda-pathfinder then raises this error)
NVVM_BLOCKER = textwrap.dedent("""
    import cuda.pathfinder as pathfinder

    _load = pathfinder.load_nvidia_dynamic_lib

    def load_nvidia_dynamic_lib(name, *args, **kwargs):
        if name == "nvvm":
            raise pathfinder.DynamicLibNotFoundError("libnvvm not found (blocked)")
        return _load(name, *args, **kwargs)

    pathfinder.load_nvidia_dynamic_lib = load_nvidia_dynamic_lib
""")


@pytest.mark.parametrize("module", ["test_ptx.py", "test_standin.py"])
def test_the_tests_that_compile_skip_naming_the_extras_where_there_is_no_nvvm(tmp_path, module):
    (tmp_path / "sitecustomize.py").write_text(NVVM_BLOCKER)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
         str(TESTS / module)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("cu12" in line and "cu13" in line for line in skipped), out.stdout
    assert " passed" not in out.stdout.splitlines()[-1], out.stdout
