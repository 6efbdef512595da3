"""For each trace of a traces.json where numba_alloc reserves more than PyTorch's policy with ample memory, diagnose_trace.py --ample for both. Run from the checkout's root."""
import json
import os
import sys

sys.path.insert(0, 'benchmarks')
from bench_traces import load, GROUPS, AMPLE
from diagnose_trace import describe_ample
res = json.load(open(sys.argv[1]))
paths = {os.path.basename(p): p for g in GROUPS.values() for p in g()}
for group, traces in res["groups"].items():
    for name, t in traces.items():
        r = t["reserved_ample"]
        if max(r["defrag"], r["no defrag"]) > r["PyTorch's"]:
            events = load(paths[name])
            print(f"[{group}] {name}")
            for policy in ("no defrag", "PyTorch's"):
                print("\n".join(describe_ample(events, policy, AMPLE * t["peak_live"])), flush=True)
