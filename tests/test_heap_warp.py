"""The device heap's warp-aggregated malloc, malloc_warp and free under the
CUDA simulator, property-based (tests/heap_warp_sim.py in a subprocess):
random sizes and sets of lanes, malloc and malloc_warp on one heap, good
and bad frees; every block distinct, aligned, in the heap and the heap's
own, malloc_warp's parts in lane order, the statistics exact."""

import pytest

from simulator_scripts import run_under_simulator

pytest.importorskip("hypothesis", reason="the property test needs hypothesis "
                                         "(pip install hypothesis)")


def test_random_kernels_get_distinct_blocks_and_exact_statistics():
    out = run_under_simulator("heap_warp_sim.py")
    assert out["examples"] == 20
    # the examples reached every case: a full heap, groups refused, page
    # runs for a warp, frees of what is not a live block, a block freed twice
    for case in ("failed_mallocs", "refused_groups", "page_runs", "invalid_frees",
                 "second_frees"):
        assert out[case] > 0, case
    # whole warps and smaller groups (lanes that did not call) alike
    sizes = {int(n) for n in out["group_sizes"]}
    assert 32 in sizes and len(sizes) > 4
