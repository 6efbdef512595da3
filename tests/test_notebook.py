"""notebooks/explore.ipynb: committed as its build script writes it (no
outputs), and it runs headless from top to bottom."""

import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat "
                               "(pip install -e '.[test]')")

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"


def test_the_committed_notebook_is_what_its_script_writes_without_outputs():
    out = subprocess.run([sys.executable, str(NOTEBOOKS / "make_explore.py"), "--check"])
    assert out.returncode == 0, "run: python notebooks/make_explore.py"
    nb = nbformat.read(NOTEBOOKS / "explore.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_the_notebook_runs_headless(tmp_path):
    nbclient = pytest.importorskip("nbclient", reason="running the notebook needs nbclient")
    pytest.importorskip("ipykernel", reason="running the notebook needs ipykernel")
    pytest.importorskip("matplotlib", reason="the notebook draws with matplotlib")
    nb = nbformat.read(NOTEBOOKS / "explore.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream")
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    assert "pipeline:" in text and "numba_alloc memory summary" in text
    assert "recorded failures 1, unknown frees 4, reused addresses 1" in text
    assert "unknown frees 0, reused addresses 0" in text      # our own trace replays cleanly
    assert images == 3                                         # segments, two timelines
