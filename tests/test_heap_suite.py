"""``numba-alloc bench --heap``: the device heap's kernel-level suite
(kernels/heap_suite.py), run without a GPU in Numba's CUDA simulator at
tiny size (a subprocess), its checks, results and report; the timed run in
the GPU test."""

import importlib
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpu_marks import HAVE_GPU, STANDIN, needs_gpu
from numba_alloc.cli.bench import heap as heap_command
from numba_alloc.cli.bench.managers import MANAGERS

heap_suite = importlib.import_module("numba_alloc.workloads.heap_suite")
TINY = heap_suite.CONFIGS["tiny"]


def run_bench(out, *args, env=None):
    return subprocess.run([sys.executable, "-m", "numba_alloc.cli", "bench", "--heap",
                           "--out", str(out), *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory, once):
    """(the process, results.json, its folder) of the simulated suite:
    without a GPU, what the command runs by default."""
    def run():
        out = tmp_path_factory.mktemp("heap")
        proc = run_bench(out, *(["--simulated"] if HAVE_GPU else []))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with open(out / "results.json") as f:
            return proc, json.load(f), out
    return once("heap_suite", run)


def cases_of(result, name):
    return [c for c in result["cases"] if c["case"] == name]


def test_every_case_ran_and_passed_its_checks(simulated):
    _, result, _ = simulated
    assert result["mode"] == "simulated" and result["simulated"] is True
    assert result["failures"] == []
    assert result["targets"] is None                 # no targets without timings
    counts = {name: len(cases_of(result, name)) for name in
              ("per_thread", "per_warp", "mixed", "scaling", "fragmentation", "mixed_fill",
               "oom", "emission")}
    per_size = len(TINY["threads"]) * len(TINY["sizes"])
    assert counts == {"per_thread": per_size, "per_warp": per_size,
                      "mixed": len(TINY["threads"]), "scaling": len(TINY["scaling"]),
                      "fragmentation": 1, "mixed_fill": 1, "oom": 1, "emission": 1}
    for case in result["cases"]:
        assert "error" not in case, case
        for name, figures in case["allocators"].items():
            assert figures.get("check", "passed") == "passed", (case["label"], name, figures)


def test_allocate_free_cases_record_the_heaps_counters_and_no_timings(simulated):
    _, result, _ = simulated
    for case in cases_of(result, "per_thread") + cases_of(result, "per_warp"):
        ours = case["allocators"]["numba_alloc"]
        group = 1 if case["case"] == "per_thread" else 32
        assert case["allocations"] == -(-case["threads"] // group)
        assert case["bytes"] == case["allocations"] * case["size"] * group
        assert ours["failed"] == 0 and ours["stats"]["num_allocs"] == case["allocations"]
        assert ours["stats"]["bytes_in_use"] >= case["bytes"]     # blocks hand out at least that
        assert ours["malloc_ms"] is None and ours["free_ms"] is None
        assert case["allocators"]["bump"]["failed"] == case["allocators"]["warp_bump"]["failed"] == 0
        assert case["allocators"]["cuda_malloc"] == {"skipped": "n/a (needs a GPU)"}
        assert set(case["ratios"].values()) == {None}
    for c in cases_of(result, "per_thread"):           # each in the class that holds it
        block = heap_suite.heap_block(c["size"])
        name = str(block) if block in heap_suite.DeviceHeap.default_classes else "large"
        assert c["allocators"]["numba_alloc"]["stats"]["classes"][name]["num_allocs"] == \
            c["allocations"]


def test_fragmentation_is_the_address_range_over_live_bytes(simulated):
    _, result, _ = simulated
    (case,) = cases_of(result, "fragmentation")
    assert case["allocations"] == TINY["mixed_threads"] * 3 // 2
    for name in ("numba_alloc", "bump"):
        f = case["allocators"][name]
        assert f["fragmentation"] == pytest.approx(f["range_bytes"] / f["live_bytes"])
        assert f["fragmentation"] >= 1 and f["failed"] == 0
    # the bump allocator cannot reuse what was freed: its range covers both phases
    bump = case["allocators"]["bump"]
    assert bump["range_bytes"] > bump["live_bytes"]


def test_out_of_memory_is_reached_in_the_expected_round(simulated):
    _, result, _ = simulated
    (case,) = cases_of(result, "oom")
    ours, bump = case["allocators"]["numba_alloc"], case["allocators"]["bump"]
    per_round = TINY["oom_threads"] * TINY["oom_size"]
    expected = TINY["oom_heap"] // per_round + 1
    assert ours["heap_size"] == TINY["oom_heap"]           # whole pages already
    assert ours["expected_rounds"] == expected and ours["rounds"] == expected
    assert 0 < ours["failed"] <= TINY["oom_threads"]
    assert ours["bytes_reached"] == ours["stats"]["bytes_in_use"] <= ours["heap_size"]
    assert ours["bytes_reached"] > ours["heap_size"] - per_round
    assert bump["rounds"] == expected and bump["failed"] > 0


def test_mixed_fill_reports_the_live_fraction_at_the_first_failure(simulated):
    _, result, _ = simulated
    (case,) = cases_of(result, "mixed_fill")
    f = case["allocators"]["numba_alloc"]
    assert f["stats"]["num_failed"] > 0
    assert case["allocations"] == f["rounds"] * TINY["fill_round"]
    assert 0 <= f["live_fraction_before"] <= f["live_fraction"] <= f["granted_fraction"] <= 1
    assert f["live_bytes"] == pytest.approx(f["live_fraction"] * f["heap_size"])
    first = f["first_failure"]
    assert first["round"] == f["rounds"]
    assert first["live_before"] == pytest.approx(f["live_fraction_before"] * f["heap_size"])
    # a failure counts against the goal when the round would have left under 90% live
    assert f["failed_below_90"] == (first["live_before"] + first["requested"]
                                    <= 0.9 * f["heap_size"])


def test_the_emission_workload_agrees_with_its_two_pass_version(simulated):
    _, result, _ = simulated
    (case,) = cases_of(result, "emission")
    flat = case["allocators"]["two_pass"]
    n, most = TINY["emit_threads"], TINY["emit_most"]
    expected = sum(((i * 2654435761) % 2**32 >> 13) % (most + 1) for i in range(n))
    emitting = sum(((i * 2654435761) % 2**32 >> 13) % (most + 1) > 0 for i in range(n))
    for name in ("numba_alloc", "numba_alloc_warp"):
        ours = case["allocators"][name]
        assert ours["particles"] == flat["particles"] == expected > 0
        assert ours["checksum"] == flat["checksum"] > 0
        assert ours["failed"] == 0
        assert ours["stats"]["num_frees"] == ours["stats"]["num_allocs"] == ours["allocations"]
    # a block per thread that emits; per warp, one per group of lanes that
    # gathered (a whole warp unless the simulator's window split it)
    assert case["allocators"]["numba_alloc"]["allocations"] == emitting
    assert n // 32 <= case["allocators"]["numba_alloc_warp"]["allocations"] < emitting


def test_the_report_says_simulation_and_writes_both_files(simulated):
    proc, result, out = simulated
    assert "SIMULATION: no GPU, no timings claimed" in proc.stdout
    assert "n/a (needs a GPU)" in proc.stdout
    assert result["note"] == heap_command.SIMULATION_NOTE
    assert {"date", "machine", "setup", "cases", "repeat"} <= set(result)
    assert result["setup"]["cuda_malloc"] == "n/a (needs a GPU)"
    md = (out / "results.md").read_text()
    assert heap_command.SIMULATION_NOTE in md and "per_warp" in md
    records = (out / heap_command.CASES_FILE).read_text().splitlines()
    assert len(records) == len(result["cases"]) + 1          # the setup line first


def test_the_table_keeps_its_columns_and_lists_the_other_cases_below(simulated):
    """Every cell stays in its column (the free-text figures of the other
    cases ran across them), as in the other commands' tables."""
    proc, result, _ = simulated
    text = heap_command.text_table(result["cases"])
    assert text in proc.stdout
    table, _, others = text.partition("\n\n")
    header, rule, *rows = table.splitlines()
    assert set(rule) == {"-", " "} and header.split()[0] == "case"
    gaps = [i for i, c in enumerate(rule) if c == " "]
    for line in [header] + rows:
        assert len(line) <= len(rule) and all(i >= len(line) or line[i] == " " for i in gaps)
    assert len(rows) == sum(c["case"] not in ("fragmentation", "mixed_fill", "oom", "emission")
                            for c in result["cases"])
    assert sorted(line.split(":")[0].split()[0] for line in others.splitlines()) == [
        "emission", "fill", "fragmentation", "oom"]


# -- the checks and the report, without running kernels ---------------------------------

def test_the_offset_checks_find_what_is_wrong():
    sizes = np.array([16, 32, 16, 64], np.int64)
    assert heap_suite.offset_problems(np.array([0, 16, 48, 64]), sizes, 128, room=True) == []
    problems = heap_suite.offset_problems(np.array([0, 8, -1, 112]), sizes, 128, room=True)
    assert problems == ["1 failed although there was room", "1 not 16-byte aligned",
                        "1 past the end", "1 overlapping"]
    assert heap_suite.offset_problems(np.array([0, -1, 32, 64]), sizes, None, room=False) == []


def test_heap_blocks_round_to_size_classes_then_pages():
    page = heap_suite.DeviceHeap.page_size
    assert [heap_suite.heap_block(n) for n in (1, 16, 17, 2048, 2049, 4673, 8192, 8193,
                                               page + 1)] \
        == [16, 16, 32, 2048, 2336, 5456, 8192, page, 2 * page]
    sizes = np.array([16] * 10 + [3000], np.int64)
    assert heap_suite.heap_size_for(sizes) >= 160 + page


def test_ours_over_bump_is_against_the_warp_aggregated_floor():
    allocators = {"numba_alloc": {"malloc_ms": 0.3, "free_ms": 0.2},
                  "bump": {"malloc_ms": 0.8}, "warp_bump": {"malloc_ms": 0.05},
                  "cuda_malloc": {"malloc_ms": 300.0, "free_ms": 100.0}}
    assert heap_suite.ratios(allocators) == pytest.approx(
        {"cuda_over_ours": 1000, "cuda_free_over_ours": 500, "ours_over_bump": 6,
         "ours_over_thread_bump": 0.375})
    allocators["cuda_malloc"] = {"skipped": "n/a (needs a GPU)"}
    assert heap_suite.ratios(allocators)["cuda_over_ours"] is None


def fake_case(case, size, threads, ratios, check="passed"):
    return {"label": f"{case} {threads}", "case": case, "threads": threads, "size": size,
            "allocators": {"numba_alloc": {"check": check}}, "ratios": ratios}


def test_targets_are_met_not_met_or_not_measured():
    cases = [fake_case("per_thread", 16, 10**6, {"cuda_over_ours": 2000, "ours_over_bump": 7}),
             fake_case("per_thread", 16, 10**4, {"cuda_over_ours": 1, "ours_over_bump": 1}),
             fake_case("emission", 16, 10**6, {"two_pass_over_ours": 0.5,
                                               "two_pass_over_warp": 1.5})]
    met = {c["target"].split(":")[0] + c["target"][-8:]: c["met"]
           for c in heap_command.targets(cases)}
    assert list(met.values()) == [True, False, None, None, True]


def test_a_failed_check_fails_the_command(tmp_path, capsys):
    cases = [fake_case("oom", 1024, 64, {}, check="failed: 3 rounds")]
    cases[0]["allocators"]["numba_alloc"].update(rounds=3, expected_rounds=5,
                                                 fraction_reached=0.5)
    cases[0]["allocators"]["bump"] = {"rounds": 5, "check": "passed"}
    args = SimpleNamespace(out=str(tmp_path), repeat=1)
    assert heap_command.report([{"case": "setup", "device": "none"}] + cases, True, args,
                               None) == 1
    assert "FAILED: oom 64: numba_alloc: failed: 3 rounds" in capsys.readouterr().err
    assert json.loads((tmp_path / "results.json").read_text())["failures"]


# -- a GPU ---------------------------------------------------------------------------------

@needs_gpu
def test_the_tiny_cases_on_a_gpu_pass_and_are_timed(tmp_path):
    """The suite's kernels on a real GPU (tiny sizes): every check passes
    and every case of ours is timed; CUDA's malloc is timed or skipped."""
    record = tmp_path / "cases.jsonl"
    # over the driver stand-in, which checks the paths and not the times: one repetition
    spec = {"config": "tiny", "repeat": 1 if STANDIN else 2, "record": str(record)}
    env = MANAGERS["numba_alloc"].environment(os.environ)
    proc = subprocess.run([sys.executable, "-m", "numba_alloc.cli.bench.heap", json.dumps(spec)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in record.read_text().splitlines()]
    cases = records[1:]
    assert heap_command.failures(cases) == []
    for case in cases:
        if case["case"] in ("per_thread", "per_warp", "mixed", "scaling", "emission"):
            assert case["allocators"]["numba_alloc"]["malloc_ms"] > 0
        if case["case"] in ("per_thread", "per_warp", "mixed", "scaling"):
            cuda_malloc = case["allocators"]["cuda_malloc"]
            assert cuda_malloc.get("malloc_ms", 0) > 0 or "CuPy" in cuda_malloc["skipped"]
