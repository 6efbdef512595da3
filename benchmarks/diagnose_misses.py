"""For each trace and policy of a traces.json that misses its goal, diagnose_trace.py on the smallest device less 1 MiB. Run from the checkout's root: python benchmarks/diagnose_misses.py RESULTS/traces.json"""
import json
import os
import sys

sys.path.insert(0, 'benchmarks')
from bench_traces import load, peak_live, GROUPS, MiB
from diagnose_trace import describe
res = json.load(open(sys.argv[1]))
paths = {os.path.basename(p): p for g in GROUPS.values() for p in g()}
for group, traces in res["groups"].items():
    for name, t in traces.items():
        for policy, goal in (("defrag", 1.03), ("no defrag", 1.15)):
            r = t["ratios"][policy]
            if r is None or r > goal:
                events = load(paths[name])
                capacity = round(r * t["peak_live"]) - MiB
                print(f"[{group}] {name}")
                print("\n".join(describe(events, policy, capacity)), flush=True)
