"""The plugin's pools, one per device, and the settings they are made with.

Settings start from ``NUMBA_ALLOC_CONF`` (read at import: a bad value is a
ValueError naming the variable), change with
:func:`configure` (every device) or :func:`set_device_settings` (one
device, as set_memory_growth does), and apply to a device's pool when Numba
first uses the device. Thread safe.
"""

import contextlib
import os
import threading

from .config import Settings, parse_conf, parse_settings
from .pool import Pool


def _settings_from_environment():
    """The Settings NUMBA_ALLOC_CONF asks for; ValueError naming it."""
    text = os.environ.get("NUMBA_ALLOC_CONF", "")
    try:
        return Settings(**parse_conf(text))
    except ValueError as e:
        raise ValueError(f"NUMBA_ALLOC_CONF={text!r} is invalid: {e}") from None


_lock = threading.Lock()
_defaults = _settings_from_environment()
_device_settings = {}   # device id -> parsed settings set for that device only
_pools = {}             # device id -> Pool of the device's current context


def _settings_for(device_id):
    return Settings(**{**_defaults.__dict__, **_device_settings.get(device_id, {})})


def create_pool(backend):
    """A pool for ``backend``'s device with the settings in force; it
    replaces the device's previous pool (a new Numba context)."""
    with _lock:
        pool = Pool(backend, **_settings_for(backend.device_id).__dict__)
        _pools[backend.device_id] = pool
        return pool


def pool_of(device_id):
    """The device's pool, or None when Numba has not used the device yet."""
    return _pools.get(device_id)


def pools():
    """{device id: pool} of every device Numba has used."""
    with _lock:
        return dict(_pools)


def configure(**settings):
    """Change settings for every device, in use or not: the keys given
    replace what set_device_settings set for one device. Raises ValueError
    for an unknown key, a bad value or a combination some device could not
    use, and RuntimeError for a setting that can no longer apply to a pool
    already in use; nothing is changed then."""
    global _defaults, _device_settings
    parsed = parse_settings(settings)
    with _lock, contextlib.ExitStack() as held:
        pools_in_use = [_pools[device_id] for device_id in sorted(_pools)]
        for pool in pools_in_use:              # validated and applied at one instant
            held.enter_context(pool.lock)
        defaults = Settings(**{**_defaults.__dict__, **parsed})
        overrides = {device_id: kept for device_id, own in _device_settings.items()
                     if (kept := {k: v for k, v in own.items() if k not in parsed})}
        for own in overrides.values():         # every device's combination is valid
            Settings(**{**defaults.__dict__, **own})
        prepared = [(pool, pool.prepare(parsed)) for pool in pools_in_use]
        _defaults, _device_settings = defaults, overrides
        for pool, new in prepared:             # cannot fail
            pool.commit(new)


def set_device_settings(device_id, **settings):
    """Change settings for one device; raises as :func:`configure`."""
    parsed = parse_settings(settings)
    with _lock:
        merged = {**_device_settings.get(device_id, {}), **parsed}
        Settings(**{**_defaults.__dict__, **merged})  # validates the combination
        pool = _pools.get(device_id)
        with pool.lock if pool is not None else contextlib.nullcontext():
            new = pool.prepare(parsed) if pool is not None else None
            _device_settings[device_id] = merged
            if pool is not None:
                pool.commit(new)


def settings(device_id=None):
    """The settings in force for device number ``device_id`` (its pool's,
    once it has one), or the defaults for every device when it is None.
    The caller checks that the device exists (numba_alloc.settings does)."""
    with _lock:
        if device_id is None:
            return _defaults
        pool = _pools.get(device_id)
        return pool.settings() if pool is not None else _settings_for(device_id)
