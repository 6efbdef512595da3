"""The malloc_heap_size setting (CUDA's device malloc heap, which NRT's
np.empty inside kernels draws from) on a simulated device, which refuses it
after a kernel as CUDA does; over numba-cuda's driver layer:
test_standin.py."""

import pytest

from numba_alloc import Backend, Pool, SimulatedDevice

MiB = 1 << 20


def test_the_size_applies_when_the_pool_is_made_and_changes_before_a_kernel():
    device = SimulatedDevice(64 * MiB)
    assert device.malloc_heap_size() == 8 * MiB             # CUDA's default
    pool = Pool(device, malloc_heap_size="32MiB")
    assert device.malloc_heap_size() == 32 * MiB
    pool.configure(malloc_heap_size=48 * MiB)
    assert device.malloc_heap_size() == 48 * MiB
    assert pool.snapshot()["device"]["malloc_heap_size"] == 48 * MiB


def test_after_a_kernel_a_new_size_is_refused_and_nothing_changes():
    device = SimulatedDevice(64 * MiB)
    pool = Pool(device, malloc_heap_size="32MiB", limit="16MiB")
    device.launch()
    before = pool.settings()
    with pytest.raises(RuntimeError, match="can be sized only before the first kernel"):
        pool.configure(malloc_heap_size="64MiB", limit="24MiB")
    assert pool.settings() == before and device.malloc_heap_size() == 32 * MiB
    pool.configure(malloc_heap_size="32MiB", limit="24MiB")     # unchanged: nothing to apply
    assert pool.settings().limit == 24 * MiB


def test_bad_values_name_the_setting():
    pool = Pool(SimulatedDevice(64 * MiB), malloc_heap_size="32MiB")
    with pytest.raises(ValueError, match="malloc_heap_size"):
        pool.configure(malloc_heap_size="lots")
    with pytest.raises(ValueError, match="malloc_heap_size cannot go back to unset"):
        pool.configure(malloc_heap_size=None)


class _NoHeap(Backend):
    """A device without a malloc heap: the interface's defaults."""

    def allocate(self, nbytes):
        raise NotImplementedError

    def release(self, address):
        raise NotImplementedError

    def memory_info(self):
        return (0, 0)

    def event(self):
        raise NotImplementedError

    def synchronize(self):
        pass

    def copy(self, batches, first):
        raise NotImplementedError

    def move_counters(self):
        return (0, 0, 0)


def test_a_device_without_a_malloc_heap_refuses_the_setting():
    with pytest.raises(ValueError, match="has no device malloc heap"):
        Pool(_NoHeap(), malloc_heap_size="32MiB")
    assert Pool(_NoHeap()).snapshot()["device"]["malloc_heap_size"] is None
