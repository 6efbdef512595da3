"""The suite's figures side by side: a plain-text table for the terminal, a
Markdown table for results.md, and the issue's targets checked on a GPU run.
"""

from ...observe.text_table import columns
from ...units import format_bytes

FRAGMENTING_WORKLOAD = "churn"
TARGET_ALLOC_SPEEDUP = 5.0      # numba_alloc vs Numba's default, host time allocating


def fmt_bytes(nbytes):
    """Bytes in the unit of their magnitude (format_bytes), 'n/a' for None."""
    return "n/a" if nbytes is None else format_bytes(nbytes)


def _number(value, spec):
    return "n/a" if value is None else format(value, spec)


def _ratio(value):
    return "n/a" if value is None else f"{value:.2f}x"


# (header, figure key, formatter)
COLUMNS = (
    ("wall s", "wall_s", lambda v: _number(v, ".4f")),
    ("alloc host ms", "alloc_host_s", lambda v: _number(None if v is None else v * 1e3, ".2f")),
    ("allocs", "allocs", lambda v: _number(v, ".0f")),
    ("p50 us", "alloc_p50_us", lambda v: _number(v, ".2f")),
    ("p99 us", "alloc_p99_us", lambda v: _number(v, ".2f")),
    ("peak reserved", "peak_reserved", fmt_bytes),
    ("peak live", "peak_live", fmt_bytes),
    ("frag", "fragmentation", lambda v: _number(v, ".3f")),
    ("OOMs", "ooms", str),
    ("wall vs base", "wall_ratio", _ratio),
    ("alloc vs base", "alloc_ratio", _ratio),
    ("self-check", "self_check", str),
)


_TEXT = {"workload", "manager", "self-check"}     # left-aligned; the rest are figures


def rows(summary):
    """Header and one row of cells per (workload, manager)."""
    header = ["workload", "manager"] + [title for title, _, _ in COLUMNS]
    body = [[workload, manager] + [cell(figures[key]) for _, key, cell in COLUMNS]
            for workload, by_manager in summary.items()
            for manager, figures in by_manager.items()]
    return header, body


def text_table(summary):
    header, body = rows(summary)
    return columns(header, body, _TEXT)


def markdown_table(summary):
    header, body = rows(summary)
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if title in _TEXT else "---:" for title in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def targets(summary):
    """The issue's targets for a GPU run, each a dict with ``target``,
    ``workload``, ``value`` (a ratio) and ``met`` (None when a manager did
    not run): numba_alloc allocates in at least 5x less host time than
    Numba's default and no more than RMM's pool on every workload, and with
    defrag on reserves less at peak than RMM's pool on the fragmenting one."""
    checks = []
    for workload, by_manager in summary.items():
        ours = by_manager.get("numba_alloc", {})
        speedup = ours.get("alloc_ratio") if "default" in by_manager else None
        checks.append({"target": f"numba_alloc allocates >= {TARGET_ALLOC_SPEEDUP:g}x faster "
                                 "than Numba's default (host time)",
                       "workload": workload, "value": speedup,
                       "met": None if speedup is None else speedup >= TARGET_ALLOC_SPEEDUP})
        rmm_time, our_time = by_manager.get("rmm", {}).get("alloc_host_s"), ours.get("alloc_host_s")
        versus_rmm = rmm_time / our_time if rmm_time and our_time else None
        checks.append({"target": "numba_alloc allocates no slower than RMM's pool (host time)",
                       "workload": workload, "value": versus_rmm,
                       "met": None if versus_rmm is None else versus_rmm >= 1.0})
    fragmenting = summary.get(FRAGMENTING_WORKLOAD, {})
    rmm_peak = fragmenting.get("rmm", {}).get("peak_reserved")
    our_peak = fragmenting.get("numba_alloc-defrag", {}).get("peak_reserved")
    ratio = rmm_peak / our_peak if rmm_peak and our_peak else None
    checks.append({"target": "numba_alloc with defrag on reserves less at peak than RMM's pool",
                   "workload": FRAGMENTING_WORKLOAD, "value": ratio,
                   "met": None if ratio is None else ratio > 1.0})
    return checks


def targets_text(checks):
    verdict = {True: "met", False: "NOT met", None: "not measured"}
    return "\n".join(f"- [{verdict[c['met']]}] {c['target']} on {c['workload']}: "
                     f"{_ratio(c['value'])}" for c in checks)
