"""The package's layers: no import circle (imports inside functions
counted), each layer imports only the layers below it, and the policy
imports no CUDA and no presentation."""

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "numba_alloc"

# the layers, lowest first: a module imports only its own layer and lower ones
# (api and observe are side by side, and so are cli and dask: neither imports the other)
RANKS = {"units": 0, "validate": 0, "numpy_compat": 0, "version": 0, "data": 0,
         "policy": 1, "device": 2, "backends": 3, "plugin": 4, "api": 5, "observe": 5,
         "cli": 6, "dask": 6}
TOP = 7                 # the package's __init__ and __main__
POLICY_REFUSES = ("numba.cuda", "cuda", "matplotlib", "IPython", "pynvml")


def modules():
    """{dotted name: path} of every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name, path, known):
    """(the package modules ``name`` imports, the outside modules it
    imports), with every import anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (inside if alias.name in known else outside).add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            if target.split(".")[0] != "numba_alloc" or target.startswith("numba_alloc.workloads"):
                outside.add(target)         # (the benchmark's workloads: kernels/, installed)
                continue
            for alias in node.names:
                child = f"{target}.{alias.name}"
                inside.add(child if child in known else target)
    return inside, outside


def graph():
    known = modules()
    edges, external = {}, {}
    for name, path in known.items():
        edges[name], external[name] = imports(name, path, known)
    return edges, external


def rank(name):
    parts = name.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return TOP
    return RANKS[parts[1]]


def circles(edges):
    """The strongly connected components of more than one module (and
    modules that import themselves)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_layer_is_a_subpackage_with_its_rule():
    for layer in ("policy", "device", "backends", "plugin", "api", "observe", "cli", "dask"):
        init = PACKAGE / layer / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "Imports" in doc, layer
    assert {name.split(".")[1] for name in modules() if name.count(".")} <= set(RANKS) | {
        "__main__"}


def test_no_import_circle_even_inside_functions():
    edges, _ = graph()
    assert circles(edges) == []


def test_each_layer_imports_only_the_layers_below_it():
    edges, _ = graph()
    upward = [(a, b) for a, targets in edges.items() for b in targets
              if rank(b) > rank(a) or (rank(b) == rank(a) and a.split(".")[1:2] != b.split(".")[1:2]
                                       and rank(a) > 0)]
    assert upward == []


def test_the_policy_imports_no_cuda_and_no_presentation():
    edges, external = graph()
    policy = [name for name in edges if name.startswith("numba_alloc.policy")]
    assert len(policy) >= 10
    refused = [(name, module) for name in policy for module in external[name]
               if module.split(".")[0] in POLICY_REFUSES or module.startswith("numba.cuda")]
    assert refused == []
    assert all(rank(target) <= 1 for name in policy for target in edges[name])


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"a"}}) == [["a"]] and circles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}


def test_import_edges_are_read_from_inside_functions_too():
    edges, _ = graph()
    # numba_alloc's __init__ imports the OutOfMemoryError module only inside __getattr__
    assert "numba_alloc.observe.out_of_memory" in edges["numba_alloc"]
    counts = collections.Counter(rank(name) for name in edges)
    assert counts[1] >= 10 and counts[TOP] == 2
