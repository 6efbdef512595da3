"""benchmarks/bench_launch_hooks.py's arithmetic, on made-up figures (the
measurement runs over the driver stand-in in test_standin.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_launch_hooks as bench  # noqa: E402


def rounds(off, on, standin_off=(), standin_on=()):
    return {"off": list(off), "on": list(on), "standin_off": list(standin_off),
            "standin_on": list(standin_on)}


def test_the_ratio_is_the_median_of_the_rounds_pairwise_ratios():
    summary = bench.summarize(rounds([10, 20, 10], [11, 30, 12]), standin=False)
    assert summary["ratio"]["pairwise"] == pytest.approx(1.2)        # 1.1, 1.5, 1.2
    assert summary["ratio"]["median"] == pytest.approx(12 / 10)
    assert summary["ratio"]["best"] == pytest.approx(11 / 10)
    assert summary["hook_us"] == 2 and summary["met"]
    assert "bare_ratio" not in summary
    assert "goal: at most 1.2x (the whole launch, median of pairs): met" in bench.report(
        {"wall": summary}, "on a GPU")


def test_over_the_standin_the_goal_is_judged_without_the_standins_launch():
    # 100 us launches, 60 of them inside the stand-in's: 40 against 50 without it
    summary = bench.summarize(rounds([100, 100], [110, 110], [60, 60], [60, 60]), standin=True)
    assert summary["ratio"]["pairwise"] == pytest.approx(1.1)
    assert summary["bare_ratio"]["pairwise"] == pytest.approx(50 / 40)
    assert summary["standin_launch_us"] == 60 and not summary["met"]
    text = bench.report({"cpu": summary}, "over the driver stand-in")
    assert "the launching thread's CPU time:" in text
    assert "on/off without the stand-in's launch: 1.250x (median of pairs)" in text
    assert "NOT met" in text


def test_runs_of_one_checkout_are_merged_round_by_round():
    run = {"standin": True, "wrong": False,
           "clocks": {clock: rounds([1], [2], [0.5], [0.5]) for clock in bench.CLOCKS}}
    both = bench.merged([run, {**run, "wrong": True}])
    assert both["wrong"] and both["clocks"]["wall"]["on"] == [2, 2]
    assert both["clocks"]["cpu"]["standin_off"] == [0.5, 0.5]
