"""Settings: parsing, validation, all-or-nothing application, and the
per-device registry."""

import os
import subprocess
import sys

import numpy as np
import pytest

from numba_alloc import Pool, Settings, SimulatedDevice
from numba_alloc.api import compat
from numba_alloc.plugin import registry
from numba_alloc.policy.config import parse_conf, parse_settings, parse_size

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize("text, expected", [
    (1024, 1024), ("1024", 1024), ("512MiB", 512 * MiB), ("16GiB", 16 * GiB),
    ("1GB", 10**9), ("1.5GiB", 3 * GiB // 2), ("4 KiB", 4096),
])
def test_parse_size(text, expected):
    assert parse_size(text, "capacity") == expected


@pytest.mark.parametrize("bad", ["-1", -1, "12 apples", "1.0000001B", True, None, "MiB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="capacity"):
        parse_size(bad, "capacity")


def test_parse_size_is_exact_for_any_integer():
    assert parse_size("9007199254740993", "limit") == 9007199254740993      # 2**53 + 1
    assert parse_size("0.000000001GB", "limit") == 1
    huge = "9" * 400
    assert parse_size(huge + "KiB", "limit") == int(huge) * 1024


@pytest.mark.parametrize("bad", ["1" + "0" * 400 + ".5B", "\u0663MiB", "1e400"])
def test_parse_size_refuses_with_a_value_error_never_an_overflow(bad):
    with pytest.raises(ValueError, match="limit"):
        parse_size(bad, "limit")


def test_a_huge_size_in_numba_alloc_conf_is_read_exactly_at_import():
    env = {**os.environ, "NUMBA_ALLOC_CONF": "limit:" + "9" * 400}
    out = subprocess.run([sys.executable, "-c", "import numba_alloc; print(numba_alloc.settings().limit)"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "9" * 400


def test_numba_alloc_conf_format():
    parsed = parse_conf("max_split_size_mb:128, growth:false,limit:0.8,"
                        "garbage_collection_threshold:0.6,defrag:on")
    assert parsed == {"max_split_size_mb": 128, "growth": False, "limit": 0.8,
                      "garbage_collection_threshold": 0.6, "defrag": True}
    assert parse_conf("limit:4096MiB")["limit"] == 4096 * MiB
    assert parse_conf("limit:1073741824")["limit"] == GiB
    assert parse_conf("max_split_size_mb:inf")["max_split_size_mb"] is None
    assert parse_conf("") == {}


@pytest.mark.parametrize("text, key", [
    ("growth", "growth"), ("colour:blue", "colour"), ("growth:maybe", "growth"),
    ("max_split_size_mb:20", "max_split_size_mb"), ("max_split_size_mb:1.5", "max_split_size_mb"),
    ("limit:1.5", "limit"), ("limit:0", "limit"), ("limit:lots", "limit"),
    ("garbage_collection_threshold:1", "garbage_collection_threshold"),
    ("garbage_collection_threshold:0", "garbage_collection_threshold"),
    ("defrag:2", "defrag"),
    ("malloc_heap_size:0", "malloc_heap_size"), ("malloc_heap_size:16EiB", "malloc_heap_size"),
    ("limit:1GiB,limit:2GiB", "limit is given twice"), ("growth:off, growth:on", "growth"),
    ("limit:", "'limit:' is not of the form key:value"),
    ("malloc_heap_size: ", "malloc_heap_size"),
])
def test_bad_conf_names_the_key(text, key):
    with pytest.raises(ValueError, match=key):
        parse_conf(text)


def test_growth_off_with_max_split_size_is_refused():
    with pytest.raises(ValueError, match="max_split_size_mb"):
        Settings(growth=False, max_split_size_mb=64)


def test_limit_resolution():
    assert Settings(limit=0.5).resolve_limit(8 * GiB) == 4 * GiB
    assert Settings(limit=GiB).resolve_limit(8 * GiB) == GiB
    assert Settings().resolve_limit(8 * GiB) == 8 * GiB


def test_pool_configure_is_all_or_nothing():
    pool = Pool(SimulatedDevice(GiB), limit=GiB // 2)
    before = pool.settings()
    with pytest.raises(ValueError, match="colour"):
        pool.configure(defrag=True, colour="blue")
    with pytest.raises(ValueError, match="limit"):
        pool.configure(defrag=True, limit=-3)
    assert pool.settings() == before
    pool.configure(defrag=True, limit="256MiB")
    assert pool.settings().defrag and compat.get_bytes_limit(pool) == 256 * MiB


def test_pool_rejects_bad_settings_at_construction():
    with pytest.raises(ValueError, match="unknown setting 'colour'"):
        Pool(SimulatedDevice(GiB), colour="blue")


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_defaults", Settings())
    monkeypatch.setattr(registry, "_device_settings", {})
    monkeypatch.setattr(registry, "_pools", {})


def test_registry_settings_reach_new_pools(clean_registry):
    registry.configure(limit=0.5, defrag=True)
    registry.set_device_settings(1, growth=False)
    assert registry.settings() == Settings(limit=0.5, defrag=True)
    assert registry.settings(1) == Settings(limit=0.5, defrag=True, growth=False)
    pool = registry.create_pool(SimulatedDevice(GiB, device_id=1))
    assert pool.settings() == registry.settings(1)
    assert registry.pool_of(1) is pool
    pool.malloc(1)
    assert compat.get_bytes_reserved(pool) == GiB // 2      # growth off: the arena at first use


def test_registry_configure_is_all_or_nothing_across_pools(clean_registry):
    used = registry.create_pool(SimulatedDevice(GiB, device_id=0))
    fresh = registry.create_pool(SimulatedDevice(GiB, device_id=1))
    used.malloc(1)
    with pytest.raises(RuntimeError, match="growth"):
        registry.configure(growth=False)
    assert registry.settings() == Settings()
    assert fresh.settings().growth and used.settings().growth
    registry.configure(defrag=True)
    assert used.settings().defrag and fresh.settings().defrag


def test_restore_settings_undoes_a_configure_and_keeps_each_pools_own(clean_registry):
    """What a failed Dask set-up puts back: the defaults, one device's own
    setting (configure drops it for the keys it is given) and a pool's own
    limit (Pool.configure), not the registry's values over the pool's."""
    pool = registry.create_pool(SimulatedDevice(GiB, device_id=0))
    pool.configure(limit=512 << 20)
    registry.set_device_settings(1, growth=False)
    state = registry.settings_state()
    registry.configure(growth=True, defrag=True, limit=GiB // 4)
    assert pool.settings().limit == GiB // 4 and registry.settings(1).growth
    registry.restore_settings(state)
    assert registry.settings() == Settings() and registry.settings(1).growth is False
    assert pool.settings().limit == 512 << 20 and not pool.settings().defrag


def test_numba_alloc_conf_is_read_at_import():
    env = {**os.environ, "NUMBA_ALLOC_CONF": "limit:0.25,defrag:true"}
    out = subprocess.run([sys.executable, "-c", "import numba_alloc; print(numba_alloc.settings())"],
                         env=env, capture_output=True, text=True, check=True).stdout
    assert "limit=0.25" in out and "defrag=True" in out


SIMULATED_POOLS = """
import numba_alloc
from numba_alloc import Pool, SimulatedDevice
print(Pool(SimulatedDevice(1 << 30)).settings())
print(Pool(SimulatedDevice(1 << 30), defrag=False).settings())
"""


def test_numba_alloc_conf_reaches_a_simulated_pool_whose_own_settings_win():
    """Issue 37, defect 10: without a GPU a simulated pool is the only pool
    there is, and NUMBA_ALLOC_CONF did not reach it."""
    env = {**os.environ, "NUMBA_ALLOC_CONF": "limit:0.25,defrag:true"}
    defaults, own = subprocess.run([sys.executable, "-c", SIMULATED_POOLS], env=env,
                                   capture_output=True, text=True, check=True).stdout.splitlines()
    assert defaults == repr(Settings(limit=0.25, defrag=True))
    assert own == repr(Settings(limit=0.25, defrag=False))


def test_configure_reaches_new_simulated_pools_whose_own_settings_win(clean_registry):
    before = Pool(SimulatedDevice(GiB), host_cache_limit="8MiB")
    registry.configure(defrag=True, limit="256MiB", keep_whole_segments=False)
    pool = Pool(SimulatedDevice(GiB))
    assert pool.settings() == Settings(defrag=True, limit=256 * MiB, keep_whole_segments=False)
    pool.malloc(1)
    assert compat.get_bytes_limit(pool) == 256 * MiB
    own = Pool(SimulatedDevice(GiB), limit="64MiB", defrag=False)
    assert own.settings() == Settings(limit=64 * MiB, keep_whole_segments=False)
    assert before.settings() == Settings(host_cache_limit=8 * MiB)     # made before: its own


BAD_CONF_USES = """
import numba_alloc
from numba_alloc.plugin import registry
for use in (numba_alloc.settings, lambda: numba_alloc.configure(defrag=True),
            lambda: registry.set_device_settings(0, defrag=True),
            lambda: registry.create_pool(numba_alloc.SimulatedDevice(1 << 30)),
            lambda: numba_alloc.Pool(numba_alloc.SimulatedDevice(1 << 30))):
    try:
        use()
    except ValueError as error:
        print(error)
print(registry.pools())
"""


@pytest.mark.parametrize("conf, message", [
    ("limit:lots", "limit must be a number of bytes"),
    ("limt:1", "unknown setting 'limt'; the settings are: max_split_size_mb, growth, limit"),
])
def test_a_bad_numba_alloc_conf_lets_the_import_finish_and_every_use_of_the_settings_fails(
        conf, message):
    """The import went through (``numba-alloc --help`` needs it); every
    function that needs the settings raises one line naming the variable,
    the key and what it allows, and no pool is made: a simulated one
    neither (issue 37, defect 10)."""
    env = {**os.environ, "NUMBA_ALLOC_CONF": conf}
    run = subprocess.run([sys.executable, "-c", BAD_CONF_USES], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    *errors, pools = run.stdout.splitlines()
    assert len(errors) == 5 and len(set(errors)) == 1
    assert errors[0].startswith(f"NUMBA_ALLOC_CONF={conf!r} is invalid: {message}")
    assert pools == "{}"


@pytest.mark.parametrize("conf, message", [
    ("growth", "entry 'growth' is not of the form key:value"),
    ("growth:false,max_split_size_mb:64", "max_split_size_mb applies only with growth on"),
])
def test_a_bad_numba_alloc_conf_names_the_variable(conf, message, monkeypatch):
    monkeypatch.setenv("NUMBA_ALLOC_CONF", conf)
    with pytest.raises(ValueError, match=f"NUMBA_ALLOC_CONF={conf!r} is invalid: {message}"):
        registry._settings_from_environment()


@pytest.mark.parametrize("value, expected", [(1, True), (0, False), ("1", True), (" off ", False),
                                             (True, True), (np.True_, True), (np.False_, False)])
def test_boolean_settings_take_1_and_0(value, expected):
    assert parse_settings({"growth": value, "defrag": value}) == {"growth": expected,
                                                                 "defrag": expected}


@pytest.mark.parametrize("bad", [2, -1, 1.0, "2", None])
def test_boolean_settings_refuse_other_values(bad):
    with pytest.raises(ValueError, match="defrag must be true or false .*1/0"):
        parse_settings({"defrag": bad})


@pytest.mark.parametrize("value", [float("inf"), "inf", " INF ", None, "none"])
def test_max_split_size_inf_means_no_limit(value):
    assert parse_settings({"max_split_size_mb": value}) == {"max_split_size_mb": None}
    assert Pool(SimulatedDevice(GiB), max_split_size_mb=value).memory_stats()["max_split_size"] \
        == (1 << 64) - 1


@pytest.mark.parametrize("bad", [float("-inf"), float("nan"), 128.0, [128], "1_000", "\u0661\u0662\u0668",
                                 1 << 42, str(10 ** 20)])
def test_max_split_size_refuses_anything_but_whole_mib_or_inf(bad):
    with pytest.raises(ValueError, match="max_split_size_mb must be a whole number of MiB"):
        parse_settings({"max_split_size_mb": bad})


@pytest.mark.parametrize("value", [1, "1", " 1 "])
def test_limit_1_is_refused_saying_to_write_1_0(value):
    with pytest.raises(ValueError, match=r"would be 1 byte: write 1.0 for the whole device"):
        parse_settings({"limit": value})
    with pytest.raises(ValueError, match="would be 1 byte"):
        parse_conf(f"limit:{value}")


def test_limit_1_0_is_the_whole_device():
    pool = Pool(SimulatedDevice(GiB), limit=1.0)
    assert parse_conf("limit:1.0") == {"limit": 1.0}
    assert compat.get_bytes_limit(pool) == GiB


@pytest.mark.parametrize("value", [2, 511, "100B"])
def test_a_limit_below_the_smallest_block_is_refused(value):
    with pytest.raises(ValueError, match="limit in bytes must be at least 512 .* a float in"):
        parse_settings({"limit": value})
    assert parse_settings({"limit": 512}) == {"limit": 512}


def test_parse_settings_passes_python_values():
    assert parse_settings({"growth": True, "limit": 0.3, "max_split_size_mb": 64}) == \
        {"growth": True, "limit": 0.3, "max_split_size_mb": 64}


def test_numpy_integers_are_taken_as_ints_in_every_setting():
    """A size computed with NumPy (np.int64) is an int, as nbytes is for malloc."""
    np = pytest.importorskip("numpy")
    assert parse_settings({"limit": np.int64(GiB), "host_limit": np.uint32(MiB),
                           "max_split_size_mb": np.int32(64), "defrag": np.int8(1)}) == \
        {"limit": GiB, "host_limit": MiB, "max_split_size_mb": 64, "defrag": True}
    assert type(parse_size(np.int64(GiB), "capacity")) is int
    assert SimulatedDevice(np.int64(GiB)).capacity == GiB
    with pytest.raises(ValueError, match="host_limit must be a number of bytes from 0 up"):
        parse_settings({"host_limit": np.int64(-1)})
    with pytest.raises(ValueError, match="would be 1 byte"):
        parse_settings({"limit": np.int64(1)})
    with pytest.raises(ValueError, match="max_split_size_mb must be a whole number"):
        parse_settings({"max_split_size_mb": np.int64(20)})


@pytest.mark.parametrize("size, expected", [(1, 1), ("64MiB", 64 * MiB), ((1 << 63) - 1, (1 << 63) - 1),
                                            ("none", None)])
def test_malloc_heap_size_takes_1_byte_to_2_63_minus_1(size, expected):
    assert parse_settings({"malloc_heap_size": size}) == {"malloc_heap_size": expected}


@pytest.mark.parametrize("bad", [0, 1 << 63, 2 ** 80])
def test_malloc_heap_size_outside_its_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="malloc_heap_size must be a number of bytes from 1"):
        parse_settings({"malloc_heap_size": bad})


@pytest.mark.parametrize("key", ["malloc_heap_size", "nrt_heap_size"])
@pytest.mark.parametrize("bad", [-1, np.int64(-1), "x", "16EiB", True, 1.5, 0, 1 << 63])
def test_a_bad_heap_size_is_refused_saying_all_it_allows(key, bad):
    # the range and none, whatever is wrong (-1 said only "must not be negative")
    with pytest.raises(ValueError, match=rf"^{key} must be a number of bytes from 1 to "
                                         r"2\*\*63 - 1 .*, or none .*, got "):
        parse_settings({key: bad})


def test_a_refused_malloc_heap_size_changes_no_setting_of_the_registry(clean_registry):
    pool = registry.create_pool(SimulatedDevice(GiB, device_id=0))
    with pytest.raises(ValueError, match="malloc_heap_size"):
        registry.configure(malloc_heap_size=0)
    assert registry.settings() == Settings() and pool.settings() == Settings()
    registry.create_pool(SimulatedDevice(GiB, device_id=1))    # the next device starts


def test_numpy_floats_are_fractions_of_the_device_in_limit():
    assert parse_settings({"limit": np.float32(0.5)}) == {"limit": 0.5}


def test_a_pool_whose_creation_hook_raises_is_not_registered(clean_registry):
    from numba_alloc.policy import live_pools

    def refuse(pool):
        raise RuntimeError("hook refused")
    live_pools.when_pool_made(refuse)
    try:
        with pytest.raises(RuntimeError, match="hook refused"):
            registry.create_pool(SimulatedDevice(GiB, device_id=0))
    finally:
        live_pools.stop_when_pool_made(refuse)
    assert registry.pool_of(0) is None and registry.pools() == {}


@pytest.mark.parametrize("key", ["host_limit", "host_cache_limit"])
@pytest.mark.parametrize("value", [-1, "x", "16EiB", True, 1.5])
def test_a_bad_host_limit_is_refused_naming_all_it_allows(key, value):
    """Every bad value gets the whole of what the setting takes: a size from
    0 up, or none (before, a negative size said only "must not be
    negative", and the others never said that none is allowed)."""
    with pytest.raises(ValueError) as refused:
        parse_settings({key: value})
    assert str(refused.value) == (f"{key} must be a number of bytes from 0 up (an int, or a "
                                  f"string such as '16GiB'), or none (no cap), got {value!r}")
