"""One API: every per-device function takes a GPU number, a TensorFlow name
or a Pool; settings() answers for what it is given or raises; no driver is a
clear error; record_history takes PyTorch's arguments; the out-of-memory hint
suggests only settings that can help."""

import contextlib
import inspect
import re
import sys

import numpy as np
import pytest

import numba_alloc
from numba_alloc import OutOfMemoryError, Pool, Settings, SimulatedDevice
from numba_alloc.api import functions as api
from numba_alloc.api import compat
from numba_alloc.plugin import registry
from numba_alloc.observe.history import history_of
from numba_alloc.observe.summary import out_of_memory_hint

MiB = 1 << 20

PYTORCH = ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "memory_cached", "max_memory_reserved", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "empty_cache", "total_memory")
TENSORFLOW = ("get_memory_info", "reset_memory_stats")
COMPAT_FUNCTIONS = PYTORCH + TENSORFLOW + numba_alloc.LMS_GETTERS


def make_pool(capacity=64 * MiB, device_id=0, **settings):
    device = SimulatedDevice(capacity, device_id=device_id)
    return device, Pool(device, **settings)


# -- the public names ---------------------------------------------------------------
def test_every_public_name_is_exported_explicitly():
    assert set(api.__all__) <= set(numba_alloc.__all__)
    assert len(set(numba_alloc.__all__)) == len(numba_alloc.__all__)
    for name in numba_alloc.__all__:
        assert getattr(numba_alloc, name) is not None, name
    for name in api.__all__:
        value = getattr(api, name)
        assert getattr(numba_alloc, name) is value
        if callable(value):
            assert value.__doc__ and value.__module__ == "numba_alloc.api.functions", name
    assert set(numba_alloc.LMS_GETTERS) <= set(api.__all__)
    assert numba_alloc.settings is api.settings


def test_dir_lists_the_names_imported_on_first_use_and_no_typing_helper():
    names = dir(numba_alloc)
    assert {"DeviceHeap", "OutOfMemoryError"} | set(numba_alloc.__all__) <= set(names)
    assert "TYPE_CHECKING" not in names and not hasattr(numba_alloc, "TYPE_CHECKING")
    assert names == sorted(names)


def test_the_public_functions_declare_what_they_return_and_the_package_says_it_is_typed():
    """PEP 561: py.typed, shipped as package data (.ci/check_install.sh
    checks the wheel), and a return annotation on every public function
    and every public method of the public classes."""
    from pathlib import Path
    root = Path(numba_alloc.__file__).parent
    assert (root / "py.typed").is_file()
    assert '"numba_alloc" = ["py.typed"]' in (root.parent / "pyproject.toml").read_text()
    functions = {name: getattr(numba_alloc, name) for name in numba_alloc.__all__
                 if inspect.isfunction(getattr(numba_alloc, name))}
    for name in numba_alloc.__all__:
        cls = getattr(numba_alloc, name)
        if inspect.isclass(cls):
            functions.update({f"{name}.{method}": f for method, f in inspect.getmembers(cls)
                              if inspect.isfunction(f) and not method.startswith("_")
                              and f.__module__.startswith("numba_alloc")})
    assert len(functions) > 100 and "Pool.malloc" in functions
    assert [name for name, f in functions.items() if "return" not in f.__annotations__] == []


def _internal_functions():
    """Names of the package's module-level functions that are not public
    (snake_case with an underscore: words such as "free" are not names)."""
    import importlib
    import pkgutil
    names = set()
    for found in pkgutil.walk_packages(numba_alloc.__path__, "numba_alloc."):
        if found.name.endswith("__main__"):
            continue
        module = importlib.import_module(found.name)
        names |= {name for name, f in vars(module).items()
                  if inspect.isfunction(f) and f.__module__ == module.__name__
                  and not name.startswith("_") and "_" in name}
    return names - set(numba_alloc.__all__)


def test_the_public_docstrings_name_only_public_functions():
    """configure's named set_device_settings, device_pool's resolve_pool,
    DeviceHeap's check_size and check_classes, write_rmm_log's
    check_events: a user cannot call them, so each contract is written out."""
    internal = _internal_functions()
    assert {"set_device_settings", "resolve_pool", "check_events"} <= internal
    named = {name: sorted(set(re.findall(r"\w+", inspect.getdoc(getattr(numba_alloc, name))
                                         or "")) & internal)
             for name in numba_alloc.__all__}
    assert {name: words for name, words in named.items() if words} == {}


def test_the_compat_functions_take_a_pool_and_the_pool_has_no_such_methods():
    assert sorted(compat.__all__) == sorted(COMPAT_FUNCTIONS)
    for name in compat.__all__:
        function = getattr(compat, name)
        assert function.__doc__ and list(inspect.signature(function).parameters) == ["pool"]
    kept = {name for name in COMPAT_FUNCTIONS if hasattr(Pool, name)}
    assert kept == {"memory_stats", "empty_cache"}     # the pool's own operations


def _first_sentence(function):
    text = " ".join(function.__doc__.split())
    return re.match(r"(.+?\.)(\s|$)", text).group(1)


@pytest.mark.parametrize("name", COMPAT_FUNCTIONS)
def test_a_per_device_function_says_what_its_compat_function_does(name):
    """help() on a per-device function tells what it returns: the first
    sentence of its compat function (the TF-LMS getters once said what
    they counted before reclaim)."""
    assert _first_sentence(getattr(api, name)) == _first_sentence(getattr(compat, name))


@pytest.mark.parametrize("name", COMPAT_FUNCTIONS)
def test_device_argument_keeps_each_librarys_name_and_default(name):
    (parameter, *_) = inspect.signature(getattr(numba_alloc, name)).parameters.values()
    if name in numba_alloc.LMS_GETTERS:
        assert (parameter.name, parameter.default) == ("gpu_id", 0)
    elif name in PYTORCH:
        assert (parameter.name, parameter.default) == ("device", None)
    else:
        assert (parameter.name, parameter.default) == ("device", inspect.Parameter.empty)


# -- a Pool is a device --------------------------------------------------------------
@pytest.mark.parametrize("name", COMPAT_FUNCTIONS)
def test_every_per_device_function_takes_a_pool(name):
    device, pool = make_pool()
    block = pool.malloc(3 * MiB)
    pool.free(block)
    pool.malloc(1000)
    device.complete()
    expected = getattr(compat, name)(pool)
    assert getattr(numba_alloc, name)(pool) == expected


def test_empty_cache_and_growth_through_a_pool():
    _, pool = make_pool()
    pool.free(pool.malloc(3 * MiB))
    numba_alloc.empty_cache(pool)
    assert numba_alloc.memory_reserved(pool) == 0
    fresh = make_pool()[1]
    numba_alloc.set_memory_growth(fresh, False)
    assert fresh.settings().growth is False
    with pytest.raises(RuntimeError, match="cannot be modified after being initialized"):
        numba_alloc.set_memory_growth(pool, False)


def test_flags_take_a_numpy_bool_and_refuse_anything_else_naming_it():
    """As the growth setting and defragment's release do (set_memory_growth
    refused np.True_ with a ValueError; nrt_heap_stats took "no" as true)."""
    _, pool = make_pool()
    with pytest.raises(TypeError, match="wait must be True or False, got 'no'"):
        numba_alloc.nrt_heap_stats(pool, wait="no")
    assert numba_alloc.nrt_heap_stats(pool, wait=np.True_) is None
    with pytest.raises(TypeError, match="enable must be True or False, got 1"):
        numba_alloc.set_memory_growth(pool, 1)
    assert pool.settings().growth is True
    numba_alloc.set_memory_growth(pool, np.False_)
    assert pool.settings().growth is False
    assert numba_alloc.defragment(pool, release=np.True_).bytes_moved == 0
    assert numba_alloc.memory_summary(pool, abbreviated=np.True_)
    assert SimulatedDevice(MiB, holds_data=np.False_).holds_data is False


# -- GPUs named every way, on stand-ins for Numba's contexts -----------------------------
class _Gpus:
    """numba.cuda.gpus: gpus[i] is a context manager making GPU i current."""

    def __init__(self, select):
        self._select = select

    def __getitem__(self, i):
        return self._select(i)


@pytest.fixture
def two_gpus(monkeypatch):
    """Two stand-in GPUs: numba.cuda.gpus[i] makes GPU i current, and its
    context's memory manager is a NumbaAllocManager holding a simulated pool."""
    from numba import cuda

    from numba_alloc.plugin.emm import NumbaAllocManager

    class Manager(NumbaAllocManager):
        def __init__(self, pool):       # no Numba context behind it
            self.pool = pool

        def initialize(self):
            return self.pool

    pools = [make_pool(device_id=i)[1] for i in range(2)]
    pools[1].malloc(5000)
    current = [0]

    @contextlib.contextmanager
    def select(i):
        before, current[0] = current[0], i
        try:
            yield
        finally:
            current[0] = before

    class Context:
        @property
        def memory_manager(self):
            return Manager(pools[current[0]])

    monkeypatch.setattr(cuda, "gpus", _Gpus(select), raising=False)
    monkeypatch.setattr(cuda, "current_context", Context, raising=False)
    monkeypatch.setattr(registry, "_gpu_count", lambda: 2)
    monkeypatch.setattr(registry, "current_gpu", lambda: 0)
    return pools


@pytest.mark.parametrize("name", COMPAT_FUNCTIONS)
@pytest.mark.parametrize("gpu", ["GPU:1", "/device:GPU:1", 1, np.int64(1)])
def test_every_per_device_function_takes_a_gpu_number_or_a_tensorflow_name(name, gpu, two_gpus):
    assert getattr(numba_alloc, name)(gpu) == getattr(compat, name)(two_gpus[1])


def test_none_is_the_current_gpu(two_gpus):
    assert numba_alloc.memory_allocated() == compat.memory_allocated(two_gpus[0]) == 0
    assert numba_alloc.memory_summary().count("device 0") == 1


def test_the_reports_and_recorders_take_every_kind_of_device(two_gpus):
    pool = two_gpus[1]
    for device in ("GPU:1", 1, pool):
        segments = numba_alloc.snapshot(device)["segments"]
        assert [s["address"] for s in segments] == [s["address"] for s in pool.snapshot()["segments"]]
        assert "simulated device 1" in numba_alloc.memory_summary(device)
        with numba_alloc.track("region", device) as region:
            pool.malloc(100)
        assert region.allocations.total == 1
        numba_alloc.record_history(device=device)
        assert history_of(pool) is not None
        assert numba_alloc.recorded_events(device) == []
        numba_alloc.record_history(None, device=device)
        assert numba_alloc.defragment(device, 100).hole


def test_a_region_tracking_another_gpu_runs_on_the_current_one(two_gpus):
    from numba import cuda
    with numba_alloc.track("region", "GPU:1") as region:
        assert cuda.current_context().memory_manager.pool is two_gpus[0]
        two_gpus[1].malloc(100)
    assert region.allocations.total == 1


@pytest.mark.parametrize("gpu, message", [
    ("GPU:2", "No matching devices found for device='GPU:2': there are 2 GPUs"),
    (2, "device=2 names no GPU: there are 2 GPUs"),
    ("GPU:*", "Multiple devices matched"),
])
def test_a_gpu_that_does_not_exist_is_refused(gpu, message, two_gpus):
    with pytest.raises(ValueError, match=message):
        numba_alloc.memory_stats(gpu)


@pytest.mark.parametrize("name", COMPAT_FUNCTIONS)
@pytest.mark.parametrize("bad, error, message", [
    (1.5, TypeError, "must be a GPU number .*, a TensorFlow device name .*, a numba_alloc.Pool"),
    (True, TypeError, "must be a GPU number"), (-1, ValueError, "must be a GPU number >= 0"),
    ("nonsense", ValueError, "No matching devices"), ("CPU:0", ValueError, "not tracked"),
])
def test_a_bad_device_is_refused_naming_the_argument(name, bad, error, message):
    function = getattr(numba_alloc, name)
    argument = next(iter(inspect.signature(function).parameters))
    with pytest.raises(error, match=message) as info:
        function(bad)
    assert argument in str(info.value)


def test_device_info_takes_a_tensorflow_name_without_a_cuda_context(monkeypatch):
    from test_nvml import FakeNVML
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(registry, "_gpu_count", None)      # the driver is not asked
    assert numba_alloc.device_info("GPU:1")["name"].endswith("#1")
    with pytest.raises(ValueError, match="Multiple devices matched .*gpu_id='GPU:\\*'"):
        numba_alloc.device_info("GPU:*")
    with pytest.raises(ValueError, match="No matching devices found for gpu_id='GPU:2'"):
        numba_alloc.device_info("GPU:2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert numba_alloc.device_info("GPU:*")["name"].endswith("#1")


# -- settings() answers for what it is given ---------------------------------------
@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_defaults", Settings())
    monkeypatch.setattr(registry, "_device_settings", {})
    monkeypatch.setattr(registry, "_pools", {})


def test_settings_answers_for_a_pool_and_for_each_gpu(clean_registry, two_gpus):
    _, pool = make_pool(limit=0.5)
    assert numba_alloc.settings(pool) == Settings(limit=0.5)
    registry.set_device_settings(1, growth=False)
    assert numba_alloc.settings() == Settings()
    assert numba_alloc.settings(1) == numba_alloc.settings("GPU:1") == Settings(growth=False)
    assert numba_alloc.settings(0) == Settings()


@pytest.mark.parametrize("bad, error", [(2, ValueError), ("GPU:2", ValueError),
                                        ("nonsense", ValueError), (1.5, TypeError)])
def test_settings_raises_for_what_it_does_not_know(bad, error, two_gpus):
    with pytest.raises(error, match="device"):
        numba_alloc.settings(bad)


# -- without a CUDA driver -------------------------------------------------------------
def _driver_usable():
    from numba import cuda
    return cuda.is_available()


no_driver = pytest.mark.skipif(_driver_usable(), reason="this machine has a CUDA driver")


@no_driver
@pytest.mark.parametrize("call", [
    numba_alloc.install, numba_alloc.memory_stats, lambda: numba_alloc.get_bytes_in_use(0),
    lambda: numba_alloc.memory_summary("GPU:0"), lambda: numba_alloc.settings(0),
])
def test_without_a_driver_every_gpu_call_points_to_the_simulated_device(call):
    with pytest.raises(RuntimeError, match=r"Pool\(numba_alloc.SimulatedDevice\(capacity\)\)"):
        call()


# -- record_history takes PyTorch's arguments -------------------------------------------
def test_record_history_takes_pytorchs_enabled_and_stacks():
    _, pool = make_pool()
    numba_alloc.record_history("all", stacks="python", max_entries=100, device=pool)
    block = pool.malloc(1000)
    history = history_of(pool)
    assert history.stacks and len(history.entries) == 2      # segment_alloc, alloc
    assert history.block_frames[block.address][0][2] == (
        "test_record_history_takes_pytorchs_enabled_and_stacks")
    numba_alloc.record_history(None, device=pool)
    assert history_of(pool) is None
    numba_alloc.record_history(enabled="all", context=None, stacks="all", device=pool)
    assert history_of(pool).stacks is False


def test_record_history_state_keeps_where_live_blocks_came_from_but_no_events():
    _, pool = make_pool()
    numba_alloc.record_history("state", stacks="python", device=pool)
    block = pool.malloc(1000)
    assert numba_alloc.recorded_events(pool) == []
    (segment,) = numba_alloc.snapshot(pool)["segments"]
    (live,) = [b for b in segment["blocks"] if b["address"] == block.address]
    assert live["frames"][0]["name"] == (
        "test_record_history_state_keeps_where_live_blocks_came_from_but_no_events")
    numba_alloc.record_history("all", device=pool)           # from now on, events too
    pool.free(block)
    assert [e.action for e in numba_alloc.recorded_events(pool)] == ["free"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"enabled": "yes"}, ValueError, 'enabled must be "all", "state", None, True or False'),
    ({"enabled": 1}, TypeError, "enabled"),
    ({"stacks": "cpp"}, ValueError, 'stacks must be "python", "all", True or False'),
    ({"context": "free"}, ValueError, "context must be None"),
    ({"device": 1.5}, TypeError, "device must be"),
])
def test_record_history_names_a_bad_argument(kwargs, error, match):
    _, pool = make_pool()
    kwargs.setdefault("device", pool)
    with pytest.raises(error, match=match):
        numba_alloc.record_history(**kwargs)
    assert history_of(pool) is None


def test_record_history_takes_a_tensorflow_name(two_gpus):
    numba_alloc.record_history(device="GPU:1")
    assert history_of(two_gpus[1]) is not None and history_of(two_gpus[0]) is None


# -- memory_stats has PyTorch's num_oom_rejections ----------------------------------------
def test_num_oom_rejections_is_a_key_and_stays_zero():
    _, pool = make_pool()
    assert pool.memory_stats()["num_oom_rejections"] == 0
    with pytest.raises(OutOfMemoryError):
        pool.malloc(1 << 40)
    stats = numba_alloc.memory_stats(pool)
    assert stats["num_ooms"] == 1 and stats["num_oom_rejections"] == 0


# -- the out-of-memory hint suggests only what can help ---------------------------------
def oom_message(pool, nbytes):
    with pytest.raises(OutOfMemoryError) as info:
        pool.malloc(nbytes)
    return str(info.value).split("Hint: ")[1].split("\n")[0]


def scatter(device, pool, size, count):
    """``count`` blocks of ``size`` with every other one freed."""
    blocks = [pool.malloc(size) for _ in range(count)]
    for block in blocks[::2]:
        pool.free(block)
    device.complete()
    return blocks


def test_a_request_larger_than_the_device_suggests_no_setting():
    for settings in ({"growth": False}, {}, {"limit": 32 * MiB}):
        _, pool = make_pool(**settings)
        hint = oom_message(pool, 100 * MiB)
        assert "larger than the device" in hint and "no setting can make room" in hint
        assert "growth" not in hint and "limit" not in hint


def test_growth_off_suggests_a_larger_limit_only_when_there_is_one():
    _, pool = make_pool(growth=False, limit=16 * MiB)
    assert "a larger limit or growth on could help" in oom_message(pool, 20 * MiB)
    _, pool = make_pool(growth=False)
    pool.malloc(40 * MiB)
    hint = oom_message(pool, 30 * MiB)
    assert "growth on could help" in hint and "limit" not in hint


def test_scattered_small_pool_memory_does_not_suggest_max_split_size():
    device, pool = make_pool(capacity=4 * MiB)
    scatter(device, pool, 256 * 1024, 16)            # two small segments, half free
    hint = oom_message(pool, 512 * 1024)
    assert "scattered" in hint and "defrag:on could help" in hint
    assert "max_split_size" not in hint


def test_scattered_large_pool_memory_suggests_max_split_size_and_defrag_when_off():
    device, pool = make_pool(capacity=40 * MiB, separate_big_segments=False)
    scatter(device, pool, 4 * MiB, 10)                # two 20 MiB segments, half free
    hint = oom_message(pool, 6 * MiB)
    assert ("defrag:on or expandable_segments:true or a smaller max_split_size_mb could help"
            in hint)
    device, pool = make_pool(capacity=40 * MiB, defrag=True)
    blocks = scatter(device, pool, 4 * MiB, 10)
    for block in blocks[1::2]:
        numba_alloc.pin(block)                        # nothing can move
    hint = oom_message(pool, 6 * MiB)
    assert "defrag:on" not in hint and "max_split_size_mb could help" in hint


def test_expandable_segments_is_suggested_only_where_it_can_be_turned_on():
    """Scattered large-pool memory: not with max_split_size_mb (the two
    exclude each other), nor once on (then neither it nor max_split_size_mb
    could help), nor on a device that maps no pages."""
    device, pool = make_pool(capacity=40 * MiB, separate_big_segments=False,
                             max_split_size_mb=24)
    scatter(device, pool, 4 * MiB, 10)
    hint = oom_message(pool, 6 * MiB)
    assert "expandable_segments" not in hint and "a smaller max_split_size_mb" in hint
    device, pool = make_pool(capacity=40 * MiB, separate_big_segments=False)
    scatter(device, pool, 4 * MiB, 10)
    with pytest.raises(OutOfMemoryError) as info:
        pool.malloc(6 * MiB)
    # as the report reads with the setting on (whose pages a free block
    # gives up serve this request: it would not fail)
    hint = out_of_memory_hint(info.value.report._replace(expandable=True))
    assert "scattered" in hint and "defrag:on could help" in hint
    assert "expandable_segments" not in hint and "max_split_size" not in hint
    device, pool = make_pool(capacity=40 * MiB, separate_big_segments=False)
    device.page_size = 0                              # a backend that maps no pages
    scatter(device, pool, 4 * MiB, 10)
    hint = oom_message(pool, 6 * MiB)
    assert "expandable_segments" not in hint and "a smaller max_split_size_mb" in hint


def test_reclaim_is_suggested_only_for_blocks_it_could_take():
    """Pinned blocks (a DeviceHeap's, an exported array's) never go to host
    memory: live blocks that are all pinned suggest no reclaim, nor, with it
    on, a larger host_limit."""
    _, pool = make_pool()
    heap = numba_alloc.DeviceHeap("60MiB", pool=pool)
    assert compat.get_bytes_inactive(pool) == heap.reserved_bytes  # not in use, yet pinned
    hint = oom_message(pool, 10 * MiB)
    assert "reclaim" not in hint and "no setting can make room" in hint
    _, pool = make_pool(reclaim=True, host_limit=MiB)
    heap = numba_alloc.DeviceHeap("60MiB", pool=pool)
    hint = oom_message(pool, 10 * MiB)
    assert "a larger host_limit" not in hint and "no setting can make room" in hint


def test_registering_an_error_maker_that_cannot_be_called_is_refused_and_changes_nothing():
    from numba_alloc.policy.errors import register_out_of_memory_error
    with pytest.raises(TypeError, match="make must be a callable taking an OutOfMemoryReport"):
        register_out_of_memory_error(5)
    pool = numba_alloc.Pool(numba_alloc.SimulatedDevice(16 << 20))
    with pytest.raises(numba_alloc.OutOfMemoryError):
        pool.malloc(1 << 30)
