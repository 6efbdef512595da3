"""The global atomics of the device heap's compiled malloc, malloc_warp and
free, and which lanes run each (run as a script by test_ptx.py, without
the CUDA simulator; prints one JSON object).

Each kernel is compiled for sm_90 twice: optimized (what a GPU runs: the
atomic instructions counted by kind) and with NVVM's optimizations off
(``opt=False``), where every Python function stays a PTX function, so each
atomic instruction is one site of the source. There, an atomic or a call
that the code reaches only through a branch taken when ``%laneid`` equals
something (``if lane == leader``) runs on one lane of its group: "leader";
any other, on every lane that gets there: "lanes". Walking the calls from
the kernel, each atomic is listed with the function it is in and who runs
it (a function called from two places is walked from each).
"""

import json
import re
import types as types_ns
from collections import Counter
from unittest import mock

from numba import cuda, types

CC = (9, 0)
ATOM = re.compile(r"^\s*(?:@!?%p\d+\s+)?atom\.(?:global\.)?(\w+)\.")
CALLEE = re.compile(r"^\s*(_Z\w+),?\s*$")
BRANCH = re.compile(r"^\s*(@(!?)(%p\d+)\s+)?bra(?:\.uni)?\s+(\$\w+);")
LABEL = re.compile(r"^(\$\w+):")
SETP = re.compile(r"^\s*setp\.(eq|ne)\.\w+\s+(%p\d+),\s*([^,]+),\s*([^;]+);")
PRED_OP = re.compile(r"^\s*(not|and|or)\.pred\s+(%p\d+),\s*([^;]+);")
COPY = re.compile(r"^\s*(?:mov|cvt(?:\.\w+)?)\.\w+\s+(%\w+),\s*(%\w+);")
STORE = re.compile(r"^\s*st\.\w+\s+\[%SP\+(\d+)\],\s*(%\w+);")
LOAD = re.compile(r"^\s*ld\.\w+\s+(%\w+),\s*\[%SP\+(\d+)\];")


def kernels():
    """(name, Python function, signature) of kernels calling each heap method."""
    from numba_alloc.device import heap_type

    def malloc(heap, sizes, offsets):
        i = cuda.grid(1)
        offsets[i] = heap.malloc(sizes[i])

    def malloc_warp(heap, sizes, offsets, mine):
        i = cuda.grid(1)
        offsets[i], mine[i] = heap.malloc_warp(sizes[i])

    def free(heap, offsets):
        heap.free(offsets[cuda.grid(1)])

    heap, i64 = heap_type.device_heap_type, types.int64[::1]
    return [("malloc", malloc, (heap, i64, i64)),
            ("malloc_warp", malloc_warp, (heap, i64, i64, types.boolean[::1])),
            ("free", free, (heap, i64))]


def python_name(mangled):
    """The last name of an Itanium-mangled ``_ZN<len><name>...`` (the
    Python function's), or the mangled name."""
    names, at = [], 3
    while at < len(mangled) and mangled[at].isdigit():
        digits = re.match(r"\d+", mangled[at:]).group()
        at += len(digits)
        names.append(mangled[at:at + int(digits)])
        at += int(digits)
    return names[-1] if names else mangled


def functions(ptx):
    """{name: body lines} of the PTX's functions and its kernel ("kernel")."""
    out, name, body = {}, None, None
    for line in ptx.splitlines():
        header = re.match(r"^\.(?:weak |visible )*\.(func|entry)\s+(?:\([^)]*\)\s*)?(\w+)\($",
                          line)
        if header:
            name = "kernel" if header.group(1) == "entry" else python_name(header.group(2))
            body = []
        elif name and line == "}":
            out[name], name = body, None
        elif name:
            body.append(line)
    return out


def lane_tests(body):
    """{predicate: True when the predicate being true means ``%laneid``
    equals the other operand, False when its being false does} (passes over
    the body until nothing changes: blocks are not in the order they run)."""
    lane, slots, tests, before = set(), {}, {}, None
    while before != (len(lane), len(slots), len(tests)):
        before = (len(lane), len(slots), len(tests))
        _lane_pass(body, lane, slots, tests)
    return tests


def _lane_pass(body, lane, slots, tests):
    for line in body:
        if "%laneid" in line:
            lane.add(line.split()[1].rstrip(","))
        elif m := COPY.match(line):
            if m.group(2) in lane:
                lane.add(m.group(1))
        elif (m := STORE.match(line)) and m.group(2) in lane:
            slots[m.group(1)] = True
        elif (m := LOAD.match(line)) and slots.get(m.group(2)):
            lane.add(m.group(1))
        elif m := SETP.match(line):
            if {m.group(3).strip(), m.group(4).strip()} & lane:
                tests[m.group(2)] = m.group(1) == "eq"
        elif m := PRED_OP.match(line):
            op, out, args = m.group(1), m.group(2), [a.strip() for a in m.group(3).split(",")]
            known = [tests[a] for a in args if a in tests]
            if op == "not" and known:
                tests[out] = not known[0]
            elif op == "and" and True in known:
                tests[out] = True
            elif op == "or" and False in known:
                tests[out] = False


def blocks_of(body):
    """[(label, lines)] in order; the first is the function's entry."""
    blocks = [(None, [])]
    for line in body:
        if m := LABEL.match(line):
            blocks.append((m.group(1), []))
        else:
            blocks[-1][1].append(line)
    return blocks


def leader_only(body):
    """The indices of the blocks reached only through a branch taken when
    ``%laneid`` equals something."""
    tests, blocks = lane_tests(body), blocks_of(body)
    index = {label: i for i, (label, _) in enumerate(blocks)}
    edges = {i: [] for i in range(len(blocks))}     # (target, the lane test holds on it)
    for i, (_, lines) in enumerate(blocks):
        otherwise = False           # the lane test holds when the last branch is not taken
        for line in lines:
            if m := BRANCH.match(line):
                negated, pred, target = m.group(2) == "!", m.group(3), m.group(4)
                if pred is None:    # unconditional: the block ends here
                    edges[i].append((index[target], otherwise))
                    break
                edges[i].append((index[target], pred in tests and tests[pred] != negated))
                otherwise = pred in tests and tests[pred] == negated
            elif line.strip().startswith("ret"):
                break
        else:
            if i + 1 < len(blocks):     # falls through
                edges[i].append((i + 1, otherwise))
    seen, todo = {0}, [0]
    while todo:
        for target, holds in edges[todo.pop()]:
            if not holds and target not in seen:
                seen.add(target)
                todo.append(target)
    return set(range(len(blocks))) - seen, blocks


def sites(body):
    """[("atom", kind, leader) or ("call", callee, leader)] of a function."""
    only, blocks = leader_only(body)
    out, pending = [], None
    for i, (_, lines) in enumerate(blocks):
        for line in lines:
            if m := ATOM.match(line):
                out.append(("atom", m.group(1), i in only))
            elif "call" in line and "callseq" not in line:
                pending = i
            elif pending is not None and (m := CALLEE.match(line)):
                out.append(("call", python_name(m.group(1)), pending in only))
                pending = None
    return out


def atomics(ptx):
    """[[function, kind, "leader" or "lanes"]] of every atomic reached from
    the kernel, walking each call (unoptimized PTX)."""
    table = {name: sites(body) for name, body in functions(ptx).items()}
    out = []

    def walk(name, leader, depth):
        assert depth < 20, "a call cycle"
        for what, item, site_leader in table[name]:
            if what == "atom":
                out.append([name, item, "leader" if leader or site_leader else "lanes"])
            elif item in table:
                walk(item, leader or site_leader, depth + 1)
    walk("kernel", False, 0)
    return sorted(out)


def main():
    # device functions compile for the current device's compute capability
    # (needs a GPU): answer with the one compiled for
    mock.patch("numba.cuda.dispatcher.get_current_device",
               lambda: types_ns.SimpleNamespace(compute_capability=CC)).start()
    out = {}
    for name, function, signature in kernels():
        optimized, _ = cuda.compile_ptx(function, signature, cc=CC)
        plain, _ = cuda.compile_ptx(function, signature, cc=CC, opt=False)
        out[name] = {"sm_90": ".target sm_90" in optimized,
                     "optimized": dict(Counter(m.group(1) for line in optimized.splitlines()
                                               if (m := ATOM.match(line)))),
                     "sites": atomics(plain)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
