#!/usr/bin/env bash
# The project as a user gets it: `python -m build` (an sdist, then the wheel
# built from that sdist), the wheel installed non-editably with only its
# required dependencies in a fresh virtual environment, run from outside the
# checkout. Checks the sdist's contents, that only numba_alloc lands at the
# top level of site-packages (with every module of numba_alloc/ and
# kernels/), the commands, and the messages of the extras that are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { echo "== check_install: $* (at ${SECONDS} s)"; }

step "python -m build: the sdist, and the wheel from it"
python -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
sdist=("$work"/dist/*.tar.gz) wheel=("$work"/dist/*.whl)

python - "$sdist" <<'PY'
import sys, tarfile
names = {n.split("/", 1)[1] for n in tarfile.open(sys.argv[1]).getnames() if "/" in n}
need = {"LICENSE", "README.md", "pyproject.toml", "setup.py", "kernels/__init__.py",
        "docs/segments.png", "docs/timeline.png", "numba_alloc/data/training_loop.csv",
        "numba_alloc/py.typed"}
assert need <= names, f"sdist lacks {sorted(need - names)}"
shipped = sorted(n for n in names if n.split("/")[0] in ("tests", "benchmarks", "notebooks"))
assert not shipped, f"sdist ships files that need the whole repository: {shipped}"
print(f"sdist: {len(names)} entries, no tests")
PY

step "the wheel in a fresh environment"
python3 -m venv "$work/env"
"$work/env/bin/pip" install --quiet "$wheel"
"$work/env/bin/pip" check
cd "$work"          # nothing of the checkout on sys.path
"$work/env/bin/python" - "$root" <<'PY'
import importlib.metadata as md, importlib.util, pathlib, re, sys
root = pathlib.Path(sys.argv[1])
dist = md.distribution("numba-alloc")
top = {f.parts[0] for f in dist.files if f.parts[0] != ".."}      # ../../bin/numba-alloc
assert top == {"numba_alloc", f"numba_alloc-{dist.version}.dist-info"}, top
assert importlib.util.find_spec("kernels") is None, "a top-level kernels is importable"
installed = {str(f) for f in dist.files}
source = {str(p.relative_to(root)) for p in (root / "numba_alloc").rglob("*.py")}
source |= {"numba_alloc/workloads/" + p.name for p in (root / "kernels").glob("*.py")}
assert source <= installed, f"not installed: {sorted(source - installed)}"
assert "numba_alloc/py.typed" in installed, "the wheel lacks py.typed (PEP 561)"
assert importlib.util.find_spec("matplotlib") is None
assert importlib.util.find_spec("tqdm") is None
assert importlib.util.find_spec("pynvml") is None
description = dist.metadata.get_payload()
assert "numba-alloc demo" in description
relative = re.findall(r"\]\((?![a-z]+:)[^)]*\)", description)
assert not relative, f"links PyPI cannot resolve in the description: {relative}"
print(f"site-packages: only numba_alloc ({len(installed)} files), no matplotlib or tqdm; "
      "the description has no relative links")
PY

step "the commands, from outside the checkout"
bin=$work/env/bin
version=$("$bin/python" -c 'import importlib.metadata as m; print(m.version("numba-alloc"))')
if "$bin/numba-alloc" --help | grep -q -- --version; then
  shown=$("$bin/numba-alloc" --version)
  echo "numba-alloc --version: $shown"
  grep -qF "$version" <<< "$shown"
else
  echo "numba-alloc --version: not offered yet, not checked"
fi
"$bin/numba-alloc" demo | tail -n 3
# without the extras: bench reports progress line by line, --plot and the
# plots name the extra to install
"$bin/numba-alloc" bench --simulated --workloads cg --repeat 1 --out bench 2> bench.err > /dev/null
grep -F "2/2 runs done" bench.err
if "$bin/numba-alloc" bench --simulated --plot --out plotted 2> plot.err; then
  echo "bench --plot ran without matplotlib"; exit 1
fi
grep -F "pip install 'numba-alloc[plot]'" plot.err
test ! -e plotted
"$bin/python" -c "
import importlib
import numba_alloc

def names_the_extra(call, error_type, extra, what):
    try:
        call()
    except error_type as error:
        assert f'numba-alloc[{extra}]' in str(error), error
        print(error)
    else:
        raise SystemExit(f'{what} ran without the {extra} extra')

names_the_extra(lambda: numba_alloc.plot_segments(snapshot={'segments': []}),
                ImportError, 'plot', 'plot_segments')
names_the_extra(lambda: numba_alloc.device_info(0), RuntimeError, 'nvml', 'device_info')
names_the_extra(lambda: importlib.import_module('numba_alloc.dask'), ImportError, 'dask',
                'import numba_alloc.dask')"
step "passed"
