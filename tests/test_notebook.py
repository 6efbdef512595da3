"""notebooks/explore.ipynb: committed with the cells its build script
writes and the outputs of a run (pictures included), and it runs headless
from top to bottom, the defragmentation behaving as its text explains."""

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat "
                               "(pip install -e '.[test]')")

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import make_explore  # noqa: E402  (nbformat checked first)

# Run after the notebook's cells: what its text says of the defragmentation
# (it once showed the largest free block falling from 12.3 to 3.5 MiB; with
# fitted segments it asked for a hole an empty cached segment already was).
CHECK_DEFRAGMENTATION = """\
(free_before, largest_before) = free_space(before)
(free_after, largest_after) = free_space(after)
assert largest_before < wanted <= largest_after
assert result.hole and result.bytes_moved > 0 and free_after == free_before
"""


def public_names_used(source):
    """The names of numba_alloc that ``source`` reaches: numba_alloc.X and
    "from numba_alloc import X" give X; any import of a submodule gives its
    dotted name."""
    names = set(re.findall(r"\bnumba_alloc\.(\w+)", source))
    for module, imported in re.findall(r"from numba_alloc(\S*) import ([\w, ]+)", source):
        names |= {module.lstrip(".")} if module else {n.strip() for n in imported.split(",")}
    return names


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


def test_the_notebook_uses_only_public_names():
    """It imported numba_alloc.observe.summary.free_space and numba_alloc.units.format_bytes."""
    import numba_alloc
    used = set().union(*(public_names_used(source) for kind, source in make_explore.CELLS
                         if kind == "code"))
    assert used and used <= set(numba_alloc.__all__), used - set(numba_alloc.__all__)


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
    assert "fits without reserving memory: True" in text and "fragmentation at the end" in text
    row = next(line for line in text.splitlines() if line.startswith("device "))  # %load_ext
    _, allocated, _, _, allocs, frees, ooms, _, _ = re.split(r"\s{2,}", row)
    before, after = allocated.split(" -> ")
    assert before == after and (allocs, frees, ooms) == ("4", "4", "0")
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) == 3


@pytest.mark.parametrize("template", ["lab", "classic"])
def test_the_notebook_renders_its_summary_monospaced_and_unwrapped(template):
    """The committed notebook rendered to HTML with JupyterLab's template and
    the classic one (nbconvert): each summary block keeps an inline
    monospace, unwrapped style (JupyterLab's stylesheet gives `pre` in
    outputs the page's font), and every table cell of ours stays on one line."""
    exporters = pytest.importorskip("nbconvert.exporters",
                                    reason="rendering the notebook needs nbconvert")
    nb = nbformat.read(NOTEBOOKS / "explore.ipynb", as_version=4)
    html, _ = exporters.HTMLExporter(template_name=template).from_notebook_node(nb)
    summaries = re.findall(r"<pre style=\"([^\"]*)\">[^<]*numba_alloc memory summary", html)
    assert summaries, "no summary block in the rendered notebook"
    assert all("font-family:monospace" in s and "white-space:pre" in s for s in summaries)
    cells = re.findall(r"<t[dh] style=\"(padding:1px 8px;[^\"]*)\"", html)
    assert cells and all("white-space:nowrap" in s for s in cells)
    assert ("jp-OutputArea" in html) == (template == "lab")


def test_a_plot_shows_as_a_picture_in_a_fresh_kernel_without_the_magic():
    """No %matplotlib inline and no pyplot: the Figure a plot function
    returns is a cell's value shown as a PNG (it showed as its text,
    "<Figure size 1000x400 with 1 Axes>"), each once."""
    pytest.importorskip("nbclient", reason="running the notebook needs nbclient")
    pytest.importorskip("ipykernel", reason="running the notebook needs ipykernel")
    pytest.importorskip("matplotlib", reason="the plots need matplotlib")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        "import numba_alloc\n"
        "pool = numba_alloc.Pool(numba_alloc.SimulatedDevice('64MiB'))\n"
        "numba_alloc.record_history(device=pool)\n"
        "block = pool.malloc(1 << 20)",
        "numba_alloc.plot_segments(pool)",
        "numba_alloc.plot_timeline(pool)",
        "import sys\nprint('matplotlib.pyplot' in sys.modules)")]
    make_explore.execute(nb)
    for cell in nb.cells[1:3]:
        [shown] = cell.outputs
        assert shown.output_type == "execute_result"
        assert base64.b64decode(shown.data["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")
        assert shown.data["text/plain"].startswith("<Figure size")
    assert nb.cells[3].outputs[0].text == "False\n"     # made without pyplot
