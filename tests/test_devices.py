"""TensorFlow device names, and the per-device functions' errors without a GPU."""

import pytest

import numba_alloc
from numba_alloc.api import functions as api
from numba_alloc.api import compat
from numba_alloc.plugin import registry
from numba_alloc.plugin.devices import check_gpu_number, match_gpu, parse_device_name


def select(name, gpu_count):
    return match_gpu(name, parse_device_name(name), gpu_count)


@pytest.mark.parametrize("name, gpu", [
    ("GPU:0", 0), ("gpu:1", 1), ("/device:GPU:1", 1), ("/physical_device:GPU:0", 0),
    ("/job:localhost/replica:0/task:0/device:GPU:1", 1), ("/GPU:0", 0),
])
def test_device_names_select_a_gpu(name, gpu):
    assert select(name, 2) == gpu


@pytest.mark.parametrize("name, message", [
    ("GPU", "Invalid device name"), ("CPU:GPU", "Invalid device name"),
    ("CPU:", "Invalid device name"), ("", "Invalid device name"), (0, "Invalid device name"),
    ("nonexistent", "No matching devices"), ("GPU:2", "No matching devices"),
    ("TPU:0", "No matching devices"), ("CPU:1", "No matching devices"),
    ("/device:GPU", "Multiple devices matched"), ("GPU:*", "Multiple devices matched"),
    ("CPU:0", "Memory statistics not tracked"), ("/device:CPU:0", "Memory statistics not tracked"),
])
def test_device_name_errors(name, message):
    with pytest.raises(ValueError, match=message):
        select(name, 2)


def test_a_wildcard_matches_the_only_gpu():
    assert select("GPU:*", 1) == 0


def _no_driver():
    raise AssertionError("the driver was asked for the GPU count")


@pytest.mark.parametrize("call, message", [
    (lambda: numba_alloc.get_memory_info("GPU"), "Invalid device name"),
    (lambda: numba_alloc.get_memory_info("CPU:0"), "not tracked"),
    (lambda: numba_alloc.reset_memory_stats("CPU:"), "Invalid device name"),
    (lambda: numba_alloc.reset_memory_stats("TPU:0"), "No matching devices"),
    (lambda: numba_alloc.set_memory_growth("GPU", True), "Invalid PhysicalDevice.*Invalid device name"),
    (lambda: numba_alloc.set_memory_growth("/device:CPU:0", True), "not tracked"),
    (lambda: numba_alloc.get_memory_info("GPU:\u00b2"),
     "Invalid device name: device='GPU:\u00b2'"),
    (lambda: numba_alloc.get_memory_info("GPU:\u0663"),
     "Invalid device name: device='GPU:\u0663'"),
    (lambda: numba_alloc.memory_allocated("/job:a/replica:\u00b9/device:GPU:0"),
     "Invalid device name: device="),
])
def test_device_names_are_checked_before_the_driver_is_asked(call, message, monkeypatch):
    monkeypatch.setattr(registry, "_gpu_count", _no_driver)
    with pytest.raises(ValueError, match=message):
        call()


def test_bad_device_names_are_value_errors_without_a_driver():
    # on this CI machine there is no CUDA driver at all; on a GPU machine the
    # same calls reach the same ValueError
    for call in (lambda: numba_alloc.get_memory_info("GPU"),
                 lambda: numba_alloc.reset_memory_stats("CPU:"),
                 lambda: numba_alloc.set_memory_growth("GPU", True)):
        with pytest.raises(ValueError, match="Invalid"):
            call()


@pytest.mark.parametrize("name, message", [
    ("GPU:5", "No matching devices"), ("/device:GPU", "Multiple devices matched"),
])
def test_a_well_formed_name_is_matched_against_the_gpu_count(name, message, monkeypatch):
    monkeypatch.setattr(registry, "_gpu_count", lambda: 2)
    with pytest.raises(ValueError, match=message):
        numba_alloc.get_memory_info(name)
    with pytest.raises(ValueError, match=message):
        numba_alloc.set_memory_growth(name, True)


@pytest.mark.parametrize("gpu_id, error", [(-1, ValueError), ("0", ValueError),
                                           (1.0, TypeError), (True, TypeError)])
def test_bad_gpu_ids_are_refused_before_any_cuda_call(gpu_id, error, monkeypatch):
    monkeypatch.setattr(registry, "_gpu_count", _no_driver)
    with pytest.raises(error, match="gpu_id"):
        numba_alloc.get_bytes_in_use(gpu_id)


@pytest.mark.parametrize("name, message", [
    ("GPU", "Invalid device name: gpu_id='GPU'"), ("TPU:0", "No matching devices found for gpu_id="),
    ("CPU:0", "not tracked for device gpu_id="),
])
def test_device_name_errors_name_the_argument(name, message, monkeypatch):
    monkeypatch.setattr(registry, "_gpu_count", _no_driver)
    with pytest.raises(ValueError, match=message):
        numba_alloc.get_bytes_in_use(name)


@pytest.mark.parametrize("number, count, message", [
    (2, 2, "gpu_id=2 names no GPU: there are 2 GPUs \\(GPU:0 to GPU:1\\)"),
    (1, 1, "gpu_id=1 names no GPU: there is 1 GPU \\(GPU:0\\)"),
])
def test_a_gpu_number_is_checked_against_the_gpu_count(number, count, message):
    with pytest.raises(ValueError, match=message):
        check_gpu_number(number, count, "gpu_id")
    assert check_gpu_number(count - 1, count) == count - 1


def test_set_memory_growth_validates_enable():
    with pytest.raises(TypeError, match="enable must be True or False, got 'yes'"):
        numba_alloc.set_memory_growth("GPU:0", "yes")


def test_every_lms_getter_is_exported_with_its_meaning():
    for name in numba_alloc.LMS_GETTERS:
        function = getattr(numba_alloc, name)
        assert function is getattr(api, name) and function.__name__ == name
        assert function.__doc__ and getattr(compat, name).__doc__
