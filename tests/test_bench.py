"""``numba-alloc bench`` and the workloads of ``kernels/``.

On the CPU: the whole suite through the command line in simulated mode at
its smallest size (its output files), each workload's numerics in Numba's
CUDA simulator at tiny size (and that its check catches a kernel that did
not run), each workload's allocation sequence, and the harness's plan,
medians, ratios and targets. On a GPU (marked ``gpu``): the workloads under
real managers, each in its own process.
"""

import json
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("tqdm",
                    reason="numba-alloc bench needs tqdm (pip install 'numba-alloc[bench]')")

from numba_alloc.cli.bench import workloads as kernels
from numba_alloc.workloads import cg, churn, ragged, stencil
from numba_alloc.workloads.simulated import SimulatedArrays
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.cli.bench import command, suite, tables
from numba_alloc.cli.bench.managers import MANAGERS, PoolProbe
from numba_alloc.cli.arguments import UsageError

from gpu_marks import STANDIN, needs_gpu

WORKLOADS = list(kernels.WORKLOADS.values())


def simulated_arrays(compute, capacity="80GiB", **kwargs):
    pool = Pool(SimulatedDevice(capacity))
    return SimulatedArrays(pool, compute=compute, probe=PoolProbe(pool), **kwargs)


def replay(module, scale, steps=None):
    """The workload's allocations on a fresh pool, without data."""
    arrays = simulated_arrays(compute=False)
    module.run(arrays, scale, *([steps] if steps is not None else []))
    return arrays


# -- the command, end to end ---------------------------------------------------

@pytest.fixture(scope="module")
def simulated_suite(tmp_path_factory, once):
    pytest.importorskip("matplotlib", reason="bench --plot needs matplotlib")

    def run():
        out = tmp_path_factory.mktemp("bench")
        proc = subprocess.run([sys.executable, "-m", "numba_alloc.cli", "bench", "--simulated",
                               "--size", "small", "--repeat", "2", "--out", str(out), "--plot"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        with open(out / "results.json") as f:
            return proc, out, json.load(f)
    return once("bench_suite", run)


def test_the_simulated_suite_says_so_and_writes_its_files(simulated_suite):
    proc, out, result = simulated_suite
    assert "SIMULATION: no GPU was used" in proc.stdout
    # the progress: stderr is a pipe, so a line per run, no bar's carriage-return frames
    assert "\r" not in proc.stderr
    done = [line for line in proc.stderr.splitlines() if line.startswith("numba-alloc bench: ")]
    assert [line.split()[2] for line in done] == [f"{n}/16" for n in range(1, 17)]
    assert result["mode"] == "simulated" and result["simulated"] is True
    assert result["managers"] == ["numba_alloc", "numba_alloc-defrag"]
    assert result["workloads"] == ["cg", "stencil", "ragged", "churn"]
    assert result["targets"] is None
    markdown = (out / "results.md").read_text()
    assert "SIMULATION" in markdown
    for workload in result["workloads"]:
        for manager in result["managers"]:
            assert f"| {workload} | {manager} |" in markdown
            assert f"{workload:<8}  {manager}" in proc.stdout
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_run_completed_checked_and_consistent(simulated_suite):
    _, _, result = simulated_suite
    runs = result["runs"]
    assert len(runs) == 2 * 4 * 2
    for run in runs:
        assert run["outcome"] == "completed" and run["self_check"] == "passed", run
        assert run["allocs"] == run["frees"] > 0 and run["live_at_end"] == 0
        assert 0 < run["alloc_host_s"] <= run["wall_s"]
        assert 0 < run["alloc_p50_us"] <= run["alloc_p99_us"]
        assert run["peak_reserved"] >= run["peak_live"] > 0
        assert 0 <= run["fragmentation"] < 1
        assert run["ooms"] == 0
    # the allocation sequence is the same in every run of a workload
    for workload in result["workloads"]:
        figures = {(r["allocs"], r["peak_live"]) for r in runs if r["workload"] == workload}
        assert len(figures) == 1


def test_managers_alternate_and_the_summary_is_their_median(simulated_suite):
    _, _, result = simulated_suite
    runs = result["runs"]
    assert [r["manager"] for r in runs[:2]] == ["numba_alloc", "numba_alloc-defrag"]
    assert [r["manager"] for r in runs[8:10]] == ["numba_alloc-defrag", "numba_alloc"]
    for workload, by_manager in result["summary"].items():
        assert by_manager["numba_alloc"]["wall_ratio"] == 1.0
        for manager, figures in by_manager.items():
            mine = [r for r in runs if r["workload"] == workload and r["manager"] == manager]
            assert figures["alloc_host_s"] == statistics.median(r["alloc_host_s"] for r in mine)
            assert figures["repetitions"] == 2 and figures["self_check"] == "passed"


def test_each_run_is_recorded_and_the_results_rebuild_from_the_records(simulated_suite, tmp_path):
    proc, out, result = simulated_suite
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert records[0]["header"]["managers"] == result["managers"]
    assert records[0]["header"]["machine"]["numpy"] == np.__version__
    assert records[1:] == result["runs"]
    rebuilt = subprocess.run([sys.executable, "-m", "numba_alloc.cli", "bench", "--from-runs",
                              str(out / "runs.jsonl"), "--out", str(tmp_path)],
                             capture_output=True, text=True)
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["summary"] == result["summary"] and again["machine"] == result["machine"]
    assert "SIMULATION" in (tmp_path / "results.md").read_text()


def test_a_suite_cut_off_keeps_the_runs_it_finished(tmp_path):
    """SIGINT (as `timeout -s INT` sends it) after the first run: the
    record holds that run, and --from-runs reports the rest as not run."""
    out = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "numba_alloc.cli", "bench", "--simulated",
                             "--size", "small", "--repeat", "1", "--workloads", "cg", "churn",
                             "--managers", "numba_alloc", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    record = out / "runs.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if record.exists() and len(record.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert not (out / "results.json").exists() or proc.returncode == 0
    lines = record.read_text().splitlines()
    assert 2 <= len(lines) <= 3
    with open(record, "a") as f:
        f.write('{"repetition": 0, "manager": "numba_al')       # a line cut off mid-write
    rebuilt = subprocess.run([sys.executable, "-m", "numba_alloc.cli", "bench", "--from-runs",
                              str(record), "--out", str(out)], capture_output=True, text=True)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "skipped 1 line(s)" in rebuilt.stderr
    result = json.loads((out / "results.json").read_text())
    assert result["runs"][0]["workload"] == "cg"
    assert result["summary"]["cg"]["numba_alloc"]["self_check"] == "passed"
    if len(lines) == 2:
        assert "1 of 2 planned runs recorded" in rebuilt.stderr
        assert result["summary"]["churn"]["numba_alloc"]["outcome"] == "not run"
        assert result["summary"]["churn"]["numba_alloc"]["wall_s"] is None


def test_records_written_by_several_calls_merge(tmp_path):
    def call(name, managers, workloads, repeat, runs):
        header = {"mode": "gpu", "simulated": False, "date": "2026-11-22",
                  "machine": {"python": "3.12.3"}, "size": "large", "scale": 1.0,
                  "repeat": repeat, "baseline": "default", "managers": managers,
                  "workloads": workloads}
        path = tmp_path / name
        path.write_text("\n".join(json.dumps(r) for r in [{"header": header}] + runs) + "\n")
        return str(path)

    def run(rep, manager, workload, alloc):
        return {**_run(rep, manager, 1.0, alloc), "workload": workload, "device": "H100",
                "cuda_driver": "13.0"}
    first = call("a.jsonl", ["numba_alloc", "default"], ["cg"], 1,
                 [run(0, "numba_alloc", "cg", 0.1), run(0, "default", "cg", 1.0)])
    second = call("b.jsonl", ["default", "numba_alloc"], ["churn"], 2,
                  [run(r, m, "churn", 0.2 if m == "numba_alloc" else 1.0)
                   for r in range(2) for m in ("default", "numba_alloc")])
    header, runs = command.read_runs([first, second])
    assert header["managers"] == ["default", "numba_alloc"]
    assert header["workloads"] == ["cg", "churn"] and header["repeat"] == 2
    assert len(runs) == 6
    assert command.report(header, runs, str(tmp_path / "out"), plot=False) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["summary"]["cg"]["numba_alloc"]["alloc_ratio"] == pytest.approx(10.0)
    assert result["summary"]["churn"]["numba_alloc"]["alloc_ratio"] == pytest.approx(5.0)
    assert result["machine"] == {"python": "3.12.3", "device": "H100", "cuda_driver": "13.0"}
    other = call("c.jsonl", ["default"], ["cg"], 1, [])
    header = json.loads(open(other).readline())["header"]
    header["scale"] = 0.5
    (tmp_path / "c.jsonl").write_text(json.dumps({"header": header}) + "\n")
    with pytest.raises(UsageError, match="argument --from-runs: .*scale"):
        command.read_runs([first, other])


@pytest.mark.parametrize("lines, message", [
    (['{"header": {}}'], "a header record lacks mode, simulated"),
    (["[1, 2]"], "a line is not a header or a run record"),
    (['{"header": "x"}'], "a line is not a header or a run record"),
    (["not json"], "has no header line"),
])
def test_from_runs_of_a_file_bench_did_not_write_is_a_usage_error(tmp_path, lines, message):
    """It ended in a KeyError traceback (or SystemExit with status 1)."""
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=message):
        command.read_runs([str(path)])
    with pytest.raises(UsageError, match="argument --from-runs: .*No such file"):
        command.read_runs([str(tmp_path / "missing.jsonl")])


def test_simulated_mode_refuses_managers_that_need_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "numba_alloc.cli", "bench", "--simulated",
                           "--managers", "default", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "needs a GPU: default" in proc.stderr
    assert not (tmp_path / "results.json").exists()


# -- the workloads in Numba's CUDA simulator --------------------------------------

@pytest.mark.parametrize("module", WORKLOADS, ids=lambda m: m.NAME)
def test_workload_passes_its_check_in_the_cuda_simulator(module):
    arrays = simulated_arrays(compute=True, capacity="1GiB")
    module.run(arrays, kernels.SIMULATOR_SCALE, module.SIMULATOR_STEPS)
    assert arrays.log.sizes and arrays.log.live == 0
    assert len(arrays.log.free_ns) == len(arrays.log.sizes)
    assert compat.memory_allocated(arrays.pool) == 0


class DroppingArrays(SimulatedArrays):
    """Simulated arrays whose device loses one kernel launch."""

    def __init__(self, pool, dropped):
        super().__init__(pool, compute=True)
        self.dropped, self.launches = dropped, 0

    def launch(self, kernel, shape, *args):
        self.launches += 1
        if self.launches != self.dropped:
            super().launch(kernel, shape, *args)


@pytest.mark.parametrize("module", WORKLOADS, ids=lambda m: m.NAME)
def test_workload_check_catches_a_kernel_that_did_not_run(module):
    arrays = DroppingArrays(Pool(SimulatedDevice("1GiB")), dropped=5)
    with pytest.raises(AssertionError, match=module.NAME):
        module.run(arrays, kernels.SIMULATOR_SCALE, module.SIMULATOR_STEPS)


def test_the_log_counts_bytes_lifetimes_and_refuses_a_double_free():
    arrays = simulated_arrays(compute=False)
    a = arrays.empty(100)                       # float32: 400 B
    b = arrays.empty((2, 3), np.float64)        # 48 B
    arrays.free(a)
    c = arrays.empty(10)
    arrays.free(b)
    arrays.free(c)
    assert arrays.log.sizes == [400, 48, 40]
    assert arrays.log.peak_live == 448 and arrays.log.live == 0
    assert arrays.log.lifetimes == [1, 1, 0]     # allocations made while each lived
    with pytest.raises(ValueError, match="freed twice"):
        arrays.free(a)
    with arrays.untimed(), arrays.untimed():
        pass
    assert 0 < arrays.untimed_ns < 10**9


def test_uploads_and_kernels_run_in_order_behind_the_host():
    arrays = simulated_arrays(compute=True, lag=2)
    x = arrays.to_device(np.arange(8, dtype=np.float32))
    arrays.launch(ragged.affine, 8, x, x, 2.0, 1.0)
    assert arrays.device.pending_work == 2              # neither has run yet
    np.testing.assert_array_equal(arrays.to_host(x), 2 * np.arange(8) + 1)
    assert arrays.device.pending_work == 0
    arrays.free(x)


# -- the workloads' allocation sequences ---------------------------------------

def test_cg_allocates_four_vectors_and_two_accumulators_every_iteration():
    n = cg.grid_side(1 / 256) ** 2
    three, four = replay(cg, 1 / 256, steps=3), replay(cg, 1 / 256, steps=4)
    assert len(four.log.sizes) - len(three.log.sizes) == 6
    assert sorted(four.log.sizes[-6:]) == [8, 8] + [8 * n] * 4     # the last iteration
    assert np.median(four.log.lifetimes) <= 6                      # temporaries, freed at once


def test_stencil_frames_and_levels_change_sizes():
    arrays = replay(stencil, 1 / 256)
    sizes = stencil.frame_sizes(1 / 256, stencil.FRAMES)
    assert len(set(sizes)) > stencil.FRAMES // 2
    assert len(set(arrays.log.sizes)) >= stencil.FRAMES * stencil.LEVELS
    assert max(arrays.log.sizes) == max(4 * h * w for h, w in sizes)


def test_ragged_sizes_span_256_bytes_to_hundreds_of_mib_with_random_lifetimes():
    sizes, lifetimes = ragged.item_sizes(1.0, ragged.STEPS)
    flat = [s for batch in sizes for s in batch]
    assert min(flat) >= 256 and max(flat) > 100 << 20
    assert len({l for batch in lifetimes for l in batch}) == ragged.MAX_LIFETIME
    arrays = replay(ragged, 1.0)
    assert replay(ragged, 1.0).log.sizes == arrays.log.sizes        # seeded
    assert arrays.log.peak_live > 1 << 30
    assert len(set(arrays.log.lifetimes)) > 20


def test_churn_state_outlives_the_scratch_and_fragments_the_pool():
    arrays = replay(churn, 1.0)
    lifetimes = np.array(arrays.log.lifetimes)       # in allocations made meanwhile
    assert np.median(lifetimes) < 2 * churn.SCRATCH                 # scratch: one step
    long_lived = lifetimes > churn.STATE_LIFETIME[0] * churn.SCRATCH
    assert long_lived.sum() >= 0.7 * churn.STEPS / churn.STATE_EVERY      # the state blocks
    figures = arrays.probe.figures()
    assert figures["peak_reserved"] > 1.5 * arrays.log.peak_live
    assert figures["fragmentation"] > 0.2


def test_out_of_memory_skips_ragged_items_and_stops_cg():
    arrays = simulated_arrays(compute=False, capacity="256MiB")
    ragged.run(arrays, 1.0, steps=4)
    assert arrays.log.ooms > 0 and arrays.log.live == 0
    small = simulated_arrays(compute=False, capacity="64MiB")
    with pytest.raises(kernels.arrays.OutOfMemory):
        cg.run(small, 1.0)
    assert small.log.ooms == 1


# -- the harness -----------------------------------------------------------------

def test_plan_reverses_the_managers_every_other_repetition():
    assert suite.plan(["a", "b"], ["w", "v"], 2) == [
        (0, "w", "a"), (0, "w", "b"), (0, "v", "a"), (0, "v", "b"),
        (1, "w", "b"), (1, "w", "a"), (1, "v", "b"), (1, "v", "a")]


def _run(rep, manager, wall, alloc, outcome="completed", check="passed", ooms=0):
    return {"repetition": rep, "workload": "w", "manager": manager, "wall_s": wall,
            "alloc_host_s": alloc, "allocs": 10, "alloc_p50_us": 1.0, "alloc_p99_us": 2.0,
            "peak_reserved": 100, "peak_live": 50, "fragmentation": None,
            "outcome": outcome, "self_check": check, "ooms": ooms}


def test_ratios_are_paired_per_repetition_so_drift_cancels():
    # the machine slows down 10x in repetition 1; b is always twice as fast
    runs = [_run(0, "a", 2.0, 1.0), _run(0, "b", 1.0, 0.1),
            _run(1, "a", 20.0, 10.0), _run(1, "b", 10.0, 1.0),
            _run(2, "a", 4.0, 2.0), _run(2, "b", 2.0, 0.2, ooms=3)]
    summary = suite.summarize(runs, ["a", "b"], ["w"], baseline="a")["w"]
    assert summary["b"]["wall_ratio"] == pytest.approx(2.0)
    assert summary["b"]["alloc_ratio"] == pytest.approx(10.0)
    assert summary["b"]["wall_s"] == 2.0 and summary["b"]["ooms"] == 3
    assert summary["a"]["fragmentation"] is None


def test_a_failed_or_stopped_repetition_is_reported_not_averaged():
    runs = [_run(0, "a", 1.0, 0.5), _run(0, "b", 1.0, 0.5),
            _run(1, "a", 1.0, 0.5), _run(1, "b", 9.0, 9.0, outcome="stopped: wrong result",
                                         check="failed: cg: relative error 1")]
    summary = suite.summarize(runs, ["a", "b"], ["w"], baseline="a")["w"]["b"]
    assert summary["repetitions"] == 1 and summary["wall_s"] == 1.0
    assert summary["self_check"].startswith("failed") and summary["outcome"].startswith("stopped")


def test_targets_compare_with_default_and_rmm():
    def figures(alloc, ratio, peak):
        return {"alloc_host_s": alloc, "alloc_ratio": ratio, "peak_reserved": peak}
    summary = {"churn": {"default": figures(10.0, 1.0, 100),
                         "numba_alloc": figures(1.0, 10.0, 90),
                         "numba_alloc-defrag": figures(1.0, 10.0, 80),
                         "rmm": figures(2.0, 5.0, 120)},
               "cg": {"default": figures(3.0, 1.0, 100), "numba_alloc": figures(1.0, 3.0, 100),
                      "rmm": figures(0.5, 6.0, 100)}}
    checks = tables.targets(summary)
    assert [(c["workload"], c["met"]) for c in checks] == [
        ("churn", True), ("churn", True),        # 10x default; 2x RMM
        ("cg", False), ("cg", False),            # 3x default; half RMM's speed
        ("churn", True)]                         # defrag reserves 80 against RMM's 120
    assert "NOT met" in tables.targets_text(tables.targets(summary))


def test_parse_scale_takes_names_and_positive_numbers():
    assert kernels.parse_scale("large") == 1.0 and kernels.parse_scale("0.5") == 0.5
    for bad in ("huge", "0", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match="size must be"):
            kernels.parse_scale(bad)


def test_each_manager_is_chosen_by_its_environment():
    base = {"NUMBA_CUDA_MEMORY_MANAGER": "x", "NUMBA_ALLOC_CONF": "limit:0.5", "PATH": "/bin"}
    assert "NUMBA_CUDA_MEMORY_MANAGER" not in MANAGERS["default"].environment(base)
    env = MANAGERS["numba_alloc-defrag"].environment(base)
    assert env["NUMBA_CUDA_MEMORY_MANAGER"] == "numba_alloc" and env["PATH"] == "/bin"
    assert env["NUMBA_ALLOC_CONF"] == "limit:0.5,defrag:true"
    assert MANAGERS["rmm"].environment({})["NUMBA_CUDA_MEMORY_MANAGER"] == "rmm.allocators.numba"
    assert (MANAGERS["cupy"].environment({})["NUMBA_CUDA_MEMORY_MANAGER"]
            == "numba_alloc.workloads.cupy_manager")


def test_the_default_managers_probe_counts_its_device_allocations_live_and_deferred(monkeypatch):
    """Numba's own manager and pointer objects (no driver call is made):
    on a GPU the driver's free memory did not move for the churn workload
    (peak_reserved 0), so the probe counts what Numba holds."""
    import logging

    from numba.cuda.cudadrv import driver
    from numba_alloc.cli.bench.managers import default_manager_holds
    monkeypatch.setattr(driver, "_logger", logging.getLogger("numba.cuda.cudadrv.driver"),
                        raising=False)             # set when a driver initializes
    manager = driver.NumbaCUDAMemoryManager(context=None)
    manager.deallocations.memory_capacity = 1 << 30
    manager.allocations[0x1000] = driver.AutoFreePointer(None, 0x1000, 100)
    manager.allocations[0x2000] = driver.AutoFreePointer(None, 0x2000, 300)
    manager.allocations[0x3000] = driver.ManagedMemory(None, 0x3000, 4096)   # not cuMemAlloc's
    assert default_manager_holds(manager) == 400
    del manager.allocations[0x1000]                # as its finalizer does, then defers the free
    manager.deallocations.add_item(lambda pointer: None, 0x1000, 100)
    assert default_manager_holds(manager) == 400
    manager.deallocations.clear()
    assert default_manager_holds(manager) == 300


# -- on a GPU ------------------------------------------------------------------------

def gpu_runs():
    """The (workload, manager) pairs run on a GPU: all of them. Over the
    driver stand-in, which checks the paths and not the figures, each
    workload runs under one manager, the managers in turn, so that every
    workload and every manager still runs."""
    managers = [m for m in MANAGERS if MANAGERS[m].available()]
    if STANDIN:
        return [(w, managers[i % len(managers)]) for i, w in enumerate(kernels.WORKLOADS)]
    return [(w, m) for w in kernels.WORKLOADS for m in managers]


@pytest.mark.parametrize("workload, manager", gpu_runs())
@needs_gpu
def test_workload_on_the_gpu_under_each_manager(workload, manager):
    run = suite.run_one("gpu", manager, workload, kernels.SIZES["small"])
    assert run["outcome"] == "completed" and run["self_check"] == "passed", run
    assert run["allocs"] == run["frees"] > 0 and run["live_at_end"] == 0
    assert 0 < run["alloc_host_s"] <= run["wall_s"]
    assert run["peak_reserved"] >= run["peak_live"] > 0
    assert (run["fragmentation"] is not None) == manager.startswith("numba_alloc")


@needs_gpu
def test_bench_on_the_gpu_compares_with_numbas_default(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "numba_alloc.cli", "bench", "--size", "small",
                           "--repeat", "1", "--workloads", "churn",
                           "--managers", "numba_alloc", "default", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["mode"] == "gpu" and result["managers"] == ["default", "numba_alloc"]
    assert result["summary"]["churn"]["default"]["alloc_ratio"] == 1.0
    assert result["summary"]["churn"]["numba_alloc"]["alloc_ratio"] > 0
    assert any(t["met"] is not None for t in result["targets"])
    assert "SIMULATION" not in proc.stdout
