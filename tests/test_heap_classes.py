"""The device heap's class lookup against any valid classes (property-based)."""

import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import given
from hypothesis import strategies as st

from numba_alloc.device import heap_kernels as hk
from numba_alloc.device import heap_search
from numba_alloc.device import heap_layout as layout
from numba_alloc.plugin.device_heap import check_classes
from test_device_heap import header, smallest_fitting


@given(st.lists(st.integers(1, hk.PAGE // 2 // hk.MIN_BLOCK), min_size=1,
                max_size=layout.MAX_CLASSES, unique=True),
       st.integers(0, hk.PAGE))
def test_class_lookup_maps_a_size_to_the_smallest_class_that_fits(units, n):
    classes = check_classes(sorted(u * hk.MIN_BLOCK for u in units))
    assert heap_search.class_of(header(classes), n) == smallest_fitting(classes, n)
