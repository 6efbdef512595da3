"""notebooks/explore.ipynb: committed with the cells its build script
writes and the outputs of a run (pictures included), and it runs headless
from top to bottom, the defragmentation behaving as its text explains."""

import base64
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat "
                               "(pip install -e '.[test]')")

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import make_explore  # noqa: E402  (nbformat checked first)

# Run after the notebook's cells: what its text says of the defragmentation.
CHECK_DEFRAGMENTATION = """\
from numba_alloc.observe.summary import free_space
(free_before, largest_before, fragmentation_before) = free_space(before["segments"])
(free_after, largest_after, fragmentation_after) = free_space(after["segments"])
assert result.bytes_released == free_before - free_after > 0
assert largest_after < largest_before == free_space(returned)[1]
assert fragmentation_after > fragmentation_before
"""


def outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def stdout(nb):
    return "".join(o.get("text", "") for o in outputs(nb) if o.output_type == "stream")


def test_the_committed_notebook_has_its_scripts_cells_run_with_pictures():
    out = subprocess.run([sys.executable, str(NOTEBOOKS / "make_explore.py"), "--check"])
    assert out.returncode == 0, "run: python notebooks/make_explore.py"
    nb = nbformat.read(NOTEBOOKS / "explore.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert not [o for o in outputs(nb) if o.output_type == "error" or o.get("name") == "stderr"]
    data = [o.data for o in outputs(nb) if "data" in o]
    pngs = [base64.b64decode(d["image/png"]) for d in data if "image/png" in d]
    rich = [d["text/html"] for d in data if "data:image/png;base64," in d.get("text/html", "")]
    assert len(pngs) == 3 and all(p.startswith(b"\x89PNG") for p in pngs)
    assert len(rich) == 2                                   # the pool and its summary
    assert (NOTEBOOKS / "explore.ipynb").stat().st_size < 500_000


def test_the_notebook_runs_headless():
    pytest.importorskip("nbclient", reason="running the notebook needs nbclient")
    pytest.importorskip("ipykernel", reason="running the notebook needs ipykernel")
    pytest.importorskip("matplotlib", reason="the notebook draws with matplotlib")
    nb = make_explore.build()
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_DEFRAGMENTATION, id="check"))
    make_explore.execute(nb)              # raises CellExecutionError if a check fails
    text = stdout(nb)
    results = [o.data["text/plain"] for o in outputs(nb) if o.output_type == "execute_result"]
    html = [o.data["text/html"] for o in outputs(nb) if "text/html" in o.get("data", {})]
    assert "numba_alloc.track: pipeline" in html[0] and "numba_alloc pool on" in html[1]
    assert "numba_alloc memory summary" in html[2]
    assert any("unknown frees 0, reused addresses 0" in r for r in results)  # our trace: clean
    assert any("recorded failures 1, unknown frees 4, reused addresses 1" in r for r in results)
    assert "returned to the device:" in text and "fragmentation at the end" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) == 3
