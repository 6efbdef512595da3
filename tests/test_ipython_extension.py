"""%load_ext numba_alloc: cells driven through IPython's InteractiveShell in
this process, the printed rows checked against the pools' own counters."""

import re
import sys

import pytest

pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from numba_alloc import Pool, SimulatedDevice, record_history  # noqa: E402
from numba_alloc.observe.history import history_of  # noqa: E402
from numba_alloc.observe.ipython_extension import HEADER, CellWatch  # noqa: E402
from numba_alloc.units import format_bytes  # noqa: E402

MiB = 1 << 20

SETUP = """
import weakref
import numba_alloc
from numba_alloc import Pool, SimulatedDevice

class Array:
    '''A block freed when the object is garbage, as Numba's arrays are.'''
    def __init__(self, pool, nbytes):
        self.block = pool.malloc(nbytes)
        weakref.finalize(self, pool.free_later, self.block)
"""


@pytest.fixture
def shell(capsys):
    shell = InteractiveShell.instance()
    shell.run_cell(SETUP)
    shell.run_cell("%load_ext numba_alloc")
    capsys.readouterr()
    yield shell
    shell.run_cell("%unload_ext numba_alloc")
    InteractiveShell.clear_instance()


def run(shell, capsys, cell):
    """What ``cell`` printed, after checking it raised nothing but a MemoryError."""
    result = shell.run_cell(cell)
    assert result.error_in_exec is None or isinstance(result.error_in_exec, MemoryError), \
        result.error_in_exec
    return capsys.readouterr().out


def rows(out):
    """{pool name: {column: cell}} of the extension's table in ``out``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("pool ") and line.split()[1:3] == HEADER[1:3])
    found = {}
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("numba_alloc:"):
            break
        cells = re.split(r"\s{2,}", line.strip())   # "0 B -> 1.00 MiB" keeps its spaces
        found[cells[0]] = dict(zip(HEADER, cells))
    return found


def counters(pool):
    s = pool.memory_stats()
    return {"allocated": s["allocated_bytes.all.current"],
            "reserved": s["reserved_bytes.all.current"],
            "allocs": s["allocation.all.allocated"], "frees": s["allocation.all.freed"],
            "ooms": s["num_ooms"], "defrags": s["num_defragmentations"],
            "reclaimed": s["reclaimed_bytes.allocated"]}


def expected_row(before, after, peak):
    return {"allocated": f"{format_bytes(before['allocated'])} -> "
                         f"{format_bytes(after['allocated'])}",
            "reserved": f"{format_bytes(before['reserved'])} -> {format_bytes(after['reserved'])}",
            "peak": format_bytes(peak),
            **{key: str(after[key] - before[key]) for key in ("allocs", "frees")},
            "OOMs": str(after["ooms"] - before["ooms"]),
            "defrags": str(after["defrags"] - before["defrags"]),
            "reclaimed": format_bytes(after["reclaimed"] - before["reclaimed"])}


def check_row(row, before, after, peak):
    assert {k: v for k, v in row.items() if k != "pool"} == expected_row(before, after, peak)


def test_a_pool_made_in_a_cell_gets_a_row_from_zero(shell, capsys):
    out = run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))\n"
                             "a = pool.malloc(3 << 20)\nb = pool.malloc(5 << 20)\npool.free(b)")
    pool = shell.user_ns["pool"]
    zero = dict.fromkeys(counters(pool), 0)
    check_row(rows(out)["pool"], zero, counters(pool), 8 * MiB)
    assert rows(out)["pool"]["allocated"] == "0 B -> 3.00 MiB"


def test_a_cell_on_an_existing_pool_shows_before_after_and_its_own_peak(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))\nkeep = pool.malloc(1 << 20)")
    pool = shell.user_ns["pool"]
    before = counters(pool)
    out = run(shell, capsys, "tmp = [pool.malloc(2 << 20) for _ in range(3)]\n"
                             "for t in tmp: pool.free(t)\nsecond = pool.malloc(512)")
    check_row(rows(out)["pool"], before, counters(pool), 7 * MiB)
    assert rows(out)["pool"]["allocs"] == "4" and rows(out)["pool"]["frees"] == "3"


def test_a_cell_that_resets_the_counters_shows_their_change_since_the_reset(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))\n"
                       "keep = [pool.malloc(1 << 20) for _ in range(10)]\n"
                       "for k in keep[:4]: pool.free(k)")
    out = run(shell, capsys, "pool.reset_accumulated()\n"
                             "more = [pool.malloc(1 << 20) for _ in range(2)]\npool.free(more[0])")
    row = rows(out)["pool"]
    assert (row["allocs"], row["frees"], row["OOMs"], row["defrags"]) == ("2", "1", "0", "0")


def test_a_cell_that_changes_no_pool_prints_nothing(shell, capsys):
    assert run(shell, capsys, "empty = Pool(SimulatedDevice(256 << 20))") == ""   # made, untouched
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))\nkeep = pool.malloc(1 << 20)")
    assert run(shell, capsys, "x = 1 + 1") == ""


def test_off_stops_the_rows_and_on_brings_them_back(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))")
    assert run(shell, capsys, "%numba_alloc off") == ""
    assert run(shell, capsys, "a = pool.malloc(1 << 20)") == ""
    run(shell, capsys, "%numba_alloc on")
    out = run(shell, capsys, "b = pool.malloc(1 << 20)")
    assert rows(out)["pool"]["allocated"] == "1.00 MiB -> 2.00 MiB"


@pytest.mark.parametrize("cell, message", [
    ("%numba_alloc bogus", "%numba_alloc takes 'on' or 'off', got 'bogus'"),
    ("%%numba_alloc now\nx = 1", "%%numba_alloc takes no arguments, got 'now'")])
def test_the_magics_refuse_a_bad_argument_in_one_usage_line(shell, capsys, cell, message):
    shell.run_cell(cell)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"UsageError: {message}"


def test_an_out_of_memory_cell_has_its_traceback_dropped_and_says_what_that_freed(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(64 << 20))")
    pool = shell.user_ns["pool"]
    before = counters(pool)
    out = run(shell, capsys, "def step():\n"
                             "    a = Array(pool, 8 << 20)\n"
                             "    b = Array(pool, 1 << 30)\n"
                             "step()")
    assert "OutOfMemoryError" in out
    row = rows(out)["pool"]
    # the row is the cell's: the 8 MiB were still held by the traceback's frame
    assert row["allocated"] == "0 B -> 8.00 MiB" and row["OOMs"] == "1"
    assert "numba_alloc: dropped the failed cell's traceback" in out
    assert out.rstrip().endswith("freed 8.00 MiB")
    assert counters(pool)["allocated"] == before["allocated"] == 0
    assert not hasattr(sys, "last_traceback") and not hasattr(sys, "last_value")


def test_a_cell_that_defragments_counts_it(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))\n"
                       "blocks = [pool.malloc(1 << 20) for _ in range(8)]\n"
                       "for b in blocks[::2]: pool.free(b)")
    pool = shell.user_ns["pool"]
    before = counters(pool)
    out = run(shell, capsys, "moved = pool.defragment()")
    after = counters(pool)
    assert after["defrags"] == before["defrags"] + 1
    check_row(rows(out)["pool"], before, after, before["allocated"])


def test_the_cell_magic_shows_the_timeline_and_stops_the_recording_it_started(shell, capsys):
    pytest.importorskip("matplotlib")
    bystander = Pool(SimulatedDevice(64 << 20))     # recording, with events, untouched by the cell
    record_history(device=bystander)
    bystander.malloc(1 << 20)
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))")
    out = run(shell, capsys, "%%numba_alloc\na = pool.malloc(1 << 20)\nother = Pool(SimulatedDevice(1 << 30))\n"
                             "b = other.malloc(2 << 20)")
    assert out.count("<Figure size") == 2       # the timeline of each pool the cell used
    assert rows(out)["pool"]["allocated"] == "0 B -> 1.00 MiB"
    assert rows(out)["other"]["allocated"] == "0 B -> 2.00 MiB"
    assert history_of(shell.user_ns["pool"]) is None
    assert history_of(shell.user_ns["other"]) is None


def test_unloading_stops_the_rows_and_removes_the_magics(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))")
    run(shell, capsys, "%unload_ext numba_alloc")
    assert run(shell, capsys, "a = pool.malloc(1 << 20)") == ""
    assert isinstance(shell.run_cell("%numba_alloc on").error_in_exec, Exception)
    pool = shell.user_ns["pool"]
    assert not any(isinstance(o, CellWatch) for o in pool._observers)


def test_a_cell_running_another_reports_once_for_both(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(256 << 20))")
    pool = shell.user_ns["pool"]
    out = run(shell, capsys, "a = pool.malloc(1 << 20)\n"
                             "get_ipython().run_cell('b = pool.malloc(2 << 20)')\n"
                             "c = pool.malloc(3 << 20)")
    assert out.count("\npool  ") == 1 and rows(out)["pool"]["allocs"] == "3"
    assert not any(isinstance(o, CellWatch) for o in pool._observers)


def test_an_out_of_memory_nested_cell_has_its_traceback_dropped(shell, capsys):
    run(shell, capsys, "pool = Pool(SimulatedDevice(64 << 20))")
    pool = shell.user_ns["pool"]
    inner = "def step():\n    a = Array(pool, 8 << 20)\n    b = Array(pool, 1 << 30)\nstep()"
    out = run(shell, capsys, f"get_ipython().run_cell({inner!r})\nafter = pool.malloc(1 << 20)")
    assert "OutOfMemoryError" in out
    # the nested cell's 8 MiB, held by its traceback's frame, were freed when
    # it ended, before the outer cell went on
    assert "numba_alloc: dropped the failed cell's traceback (sys.last_traceback and " \
           "its frames' locals): freed 8.00 MiB" in out
    row = rows(out)["pool"]
    assert row["allocated"] == "0 B -> 1.00 MiB" and row["peak"] == "8.00 MiB"
    assert counters(pool)["allocated"] == 1 * MiB
    assert not hasattr(sys, "last_traceback") and not hasattr(sys, "last_value")


def test_an_out_of_memory_cell_frees_the_owned_blocks_its_frames_held(shell, capsys):
    """On a simulated device without Numba's arrays: pool.malloc_owned's
    blocks free themselves when the dropped frames let go of them (a raw
    pool.malloc handle is the pool's to keep until pool.free)."""
    run(shell, capsys, "pool = Pool(SimulatedDevice(64 << 20))\nkept = pool.malloc(1 << 20)")
    pool = shell.user_ns["pool"]
    out = run(shell, capsys, "def step():\n"
                             "    a = pool.malloc_owned(8 << 20)\n"
                             "    b = pool.malloc_owned(1 << 30)\n"
                             "step()")
    assert "OutOfMemoryError" in out and out.rstrip().endswith("freed 8.00 MiB")
    assert counters(pool)["allocated"] == 1 * MiB      # the raw handle's block stays
