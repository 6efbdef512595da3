"""The plugin's pools, one per device, the settings they are made with, and
the device argument every per-device function takes (:func:`resolve_pool`).

Settings start from ``NUMBA_ALLOC_CONF`` (read at import; a bad value does
not stop the import, so that ``numba-alloc --help`` still works: every
function that needs the settings raises a ValueError naming the variable
instead, and :func:`check_environment` says so first), change with
:func:`configure` (every device) or :func:`set_device_settings` (one
device, as set_memory_growth does), and apply to a device's pool when Numba
first uses the device. Thread safe.

:func:`resolve_pool` turns the device argument of every per-device function
(numba_alloc.api.functions, memory_summary, record_history, ...) into a pool: a GPU
number (an int >= 0), a TensorFlow device name ("GPU:0", ...), a
:class:`~numba_alloc.Pool`, or None for the current GPU.
"""

import contextlib
import operator
import os
import threading
from typing import NamedTuple

from ..policy.config import Settings, parse_conf, parse_settings, register_defaults
from .devices import check_gpu_number, match_gpu, parse_device_name
from ..policy.pool import Pool


def _for_the_plugin(parsed):
    """``parsed`` settings, refused (ValueError) when they turn reclaim on
    where the Numba glue cannot make Numba's arrays active, or set
    nrt_heap_size where it cannot link NRT served by the pool (this
    numba-cuda's internals differ from those it was built for). Under the
    CUDA simulator, which has no plugin, nothing is refused."""
    if parsed.get("reclaim") or parsed.get("nrt_heap_size") is not None:
        from numba import cuda
        if not cuda.config.ENABLE_CUDASIM:
            from . import activity, nrt
            for wanted, check in ((parsed.get("reclaim"), activity.unsupported_reason),
                                  (parsed.get("nrt_heap_size"), nrt.unsupported_reason)):
                reason = wanted and check()
                if reason:
                    raise ValueError(reason)
    return parsed


def _nrt_switch_refused(parsed):
    """RuntimeError when ``parsed`` sets nrt_heap_size after kernels that use
    NRT were linked with CUDA's device malloc heap (plugin/nrt.py)."""
    if parsed.get("nrt_heap_size") is not None:
        from numba import cuda
        if not cuda.config.ENABLE_CUDASIM:
            from .nrt import switch_on_refused
            reason = switch_on_refused()
            if reason:
                raise RuntimeError(reason)


def _settings_from_environment():
    """The Settings NUMBA_ALLOC_CONF asks for; ValueError naming it."""
    text = os.environ.get("NUMBA_ALLOC_CONF", "")
    try:
        return Settings(**_for_the_plugin(parse_conf(text)))
    except ValueError as e:
        raise ValueError(f"NUMBA_ALLOC_CONF={text!r} is invalid: {e}") from None


def _read_environment():
    """(the Settings NUMBA_ALLOC_CONF asks for, None), or (Settings(), the
    one-line message of what is wrong with it)."""
    try:
        return _settings_from_environment(), None
    except ValueError as error:
        return Settings(), str(error)


_lock = threading.Lock()
_defaults, _environment_error = _read_environment()
_device_settings = {}   # device id -> parsed settings set for that device only
_pools = {}             # device id -> Pool of the device's current context
_made = None            # [(device id, Pool)] create_pool made, once keep_made_pools is on


def _defaults_in_force():
    """The defaults every new Pool starts from (registered with the policy
    below); ValueError when NUMBA_ALLOC_CONF is invalid. Takes no lock
    (create_pool calls Pool with it held): ``_defaults`` is replaced whole."""
    check_environment()
    return _defaults


register_defaults(_defaults_in_force)


def check_environment():
    """Raise ValueError (one line naming NUMBA_ALLOC_CONF, the key and what
    it allows) when the variable's value, read at import, is invalid; every
    function here that needs the settings does so first."""
    if _environment_error is not None:
        raise ValueError(_environment_error)


def _settings_for(device_id):
    check_environment()
    return Settings(**{**_defaults.__dict__, **_device_settings.get(device_id, {})})


def create_pool(backend):
    """A pool for ``backend``'s device with the settings in force; it
    replaces the device's previous pool (a new Numba context)."""
    with _lock:
        pool = Pool(backend, **_settings_for(backend.device_id).__dict__)
        _pools[backend.device_id] = pool
        if _made is not None:
            _made.append((backend.device_id, pool))
    return pool


def forget_pool(pool):
    """Unregister ``pool`` (its set-up failed after :func:`create_pool`):
    its device has no pool until the next create_pool, and
    :func:`made_pools` leaves it out."""
    with _lock:
        if _pools.get(pool.backend.device_id) is pool:
            del _pools[pool.backend.device_id]
        if _made is not None:
            _made[:] = [(device_id, made) for device_id, made in _made if made is not pool]


def keep_made_pools():
    """From now on keep every pool :func:`create_pool` makes, for
    :func:`made_pools`, also once its context is gone (cuda.close()) and
    Numba holds it no more (``numba-alloc run`` reports them all when the
    program ends). Stays on."""
    global _made
    with _lock:
        if _made is None:
            _made = []


def made_pools():
    """[(device id, pool)] of every pool the plugin made since
    :func:`keep_made_pools` ([] before), those whose context is gone among
    them, in the order made."""
    with _lock:
        return list(_made or ())


def unregistered_pool(backend):
    """A pool for ``backend``'s device with the settings in force, which
    does not replace the device's pool (a Context Numba did not make)."""
    with _lock:
        return Pool(backend, **_settings_for(backend.device_id).__dict__)


def _drop_closed():
    """Unregister the pools whose context is gone (cuda.close(): the
    device's next use makes a new context and pool); under the lock."""
    for device_id, pool in list(_pools.items()):
        if not pool.backend.context_alive:
            del _pools[device_id]


def pool_of(device_id):
    """The device's pool, or None when Numba has not used the device yet
    (or not since cuda.close())."""
    with _lock:
        _drop_closed()
        return _pools.get(device_id)


def pools():
    """{device id: pool} of every device Numba uses (not those it used
    before cuda.close())."""
    with _lock:
        _drop_closed()
        return dict(_pools)


def configure(**settings) -> None:
    """Change settings for every device, in use or not: the keys given
    replace those set for one device (:func:`numba_alloc.set_memory_growth`).
    Raises ValueError for an unknown key, a bad value, a combination some
    device could not use or an invalid NUMBA_ALLOC_CONF, RuntimeError
    for a setting that can no longer apply to a pool already in use (or an
    nrt_heap_size set after kernels that use NRT were linked with CUDA's
    heap), and a pool's OutOfMemoryError for an nrt_heap_size its NRT heap
    cannot be replaced with; nothing is changed then."""
    global _defaults, _device_settings
    check_environment()
    parsed = _for_the_plugin(parse_settings(settings))
    _nrt_switch_refused(parsed)
    with _lock, contextlib.ExitStack() as held:
        _drop_closed()
        pools_in_use = [_pools[device_id] for device_id in sorted(_pools)]
        for pool in pools_in_use:              # validated and applied at one instant
            held.enter_context(pool.lock)
        defaults = Settings(**{**_defaults.__dict__, **parsed})
        overrides = {device_id: kept for device_id, own in _device_settings.items()
                     if (kept := {k: v for k, v in own.items() if k not in parsed})}
        for own in overrides.values():         # every device's combination is valid
            Settings(**{**defaults.__dict__, **own})
        checked = []
        try:
            for pool in pools_in_use:
                checked.append((pool, pool.check_settings(parsed)))
            for pool, new in checked:         # what can still fail, before any commit
                pool.prepare(new)
        except BaseException:
            for pool, new in checked:         # (a heap carved for NRT's new size goes back)
                pool.discard(new)
            raise
        _defaults, _device_settings = defaults, overrides
        for pool, new in checked:             # cannot fail
            pool.commit(new)


def set_device_settings(device_id, **settings):
    """Change settings for one device; raises as :func:`configure`."""
    check_environment()
    parsed = _for_the_plugin(parse_settings(settings))
    _nrt_switch_refused(parsed)
    with _lock:
        _drop_closed()
        merged = {**_device_settings.get(device_id, {}), **parsed}
        Settings(**{**_defaults.__dict__, **merged})  # validates the combination
        pool = _pools.get(device_id)
        with pool.lock if pool is not None else contextlib.nullcontext():
            if pool is not None:
                new = pool.check_settings(parsed)
                try:
                    pool.prepare(new)
                except BaseException:
                    pool.discard(new)
                    raise
            _device_settings[device_id] = merged
            if pool is not None:
                pool.commit(new)


def settings_state():
    """What :func:`restore_settings` puts back: the defaults, the settings
    set for single devices and each pool's own."""
    with _lock:
        _drop_closed()
        return (_defaults, {device_id: dict(own) for device_id, own in _device_settings.items()},
                {pool: pool.settings() for pool in _pools.values()})


def restore_settings(state):
    """Put back the settings of ``state`` (from :func:`settings_state`):
    the defaults, those of single devices, and the settings of each pool
    then in use, and still, that have changed since; a pool made since
    gets those put back for its device (undoing a :func:`configure`, and
    the pools made under it, after an error the caller raises). Never
    raises: a pool whose settings can no longer go back (Pool.configure
    refuses) keeps them."""
    global _defaults, _device_settings
    defaults, device_settings, pool_settings = state
    with _lock:
        _defaults, _device_settings = defaults, {k: dict(v) for k, v in device_settings.items()}
        _drop_closed()
        for device_id, pool in list(_pools.items()):
            try:
                before = pool_settings.get(pool) or _settings_for(device_id)
                now = pool.settings().__dict__
                changed = {key: value for key, value in before.__dict__.items()
                           if now[key] != value}
                if changed:
                    pool.configure(**changed)
            except Exception:           # noqa: BLE001 - the caller's error is the one raised
                pass


def settings(device_id=None):
    """The settings in force for device number ``device_id`` (its pool's,
    once it has one), or the defaults for every device when it is None.
    The caller checks that the device exists (numba_alloc.settings does).
    Raises ValueError when NUMBA_ALLOC_CONF is invalid."""
    check_environment()
    with _lock:
        if device_id is None:
            return _defaults
        _drop_closed()
        pool = _pools.get(device_id)
        return pool.settings() if pool is not None else _settings_for(device_id)


_INSTALL_HINT = ("set NUMBA_CUDA_MEMORY_MANAGER=numba_alloc, or call "
                 "numba_alloc.install() before CUDA is first used")
_SIMULATE_HINT = ("without a GPU use numba_alloc.Pool(numba_alloc.SimulatedDevice(capacity)) "
                  "and pass the pool as the device")


def _require_gpu_runtime():
    """RuntimeError, pointing to the simulated device, where Numba can reach
    no GPU: under the CUDA simulator, or without a usable CUDA driver."""
    from numba.cuda import config
    if config.ENABLE_CUDASIM:
        raise RuntimeError("the CUDA simulator has no memory manager plugins; " + _SIMULATE_HINT)
    from numba.cuda.cudadrv.driver import driver
    from numba.cuda.cudadrv.error import CudaSupportError
    try:
        available = driver.is_available
    except CudaSupportError:        # the first failed cuInit raises, later ones return False
        available = False
    if not available:
        reason = " ".join(str(driver.initialization_error).split())
        raise RuntimeError(f"no usable CUDA driver ({reason}); {_SIMULATE_HINT}")


# -- the device argument --------------------------------------------------------
class DeviceName(NamedTuple):
    """A TensorFlow device name and the GPU index it asks for (None: any GPU)."""
    name: str
    index: int | None


def check_device(device, argument="device"):
    """``device`` checked without asking the driver anything: the Pool itself,
    None, a GPU number as an int, or a :class:`DeviceName`. Raises TypeError
    for another type and ValueError for a negative number or a bad name,
    both naming ``argument``."""
    if device is None or isinstance(device, Pool):
        return device
    if isinstance(device, str):
        return DeviceName(device, parse_device_name(device, argument))
    number = None
    if not isinstance(device, bool):
        try:
            number = operator.index(device)     # an int, or a NumPy integer
        except TypeError:
            pass
    if number is None:
        raise TypeError(
            f"{argument} must be a GPU number (an int >= 0), a TensorFlow device name "
            f"such as 'GPU:0', a numba_alloc.Pool, or None (the current GPU), got {device!r}")
    if number < 0:
        raise ValueError(f"{argument} must be a GPU number >= 0, got {number}")
    return number


def current_gpu():
    """The number of Numba's current GPU (its context is created if need be)."""
    _require_gpu_runtime()
    from numba import cuda
    return cuda.get_current_device().id


def _gpu_count():
    _require_gpu_runtime()
    from numba import cuda
    return len(cuda.gpus)


def _gpu_number(checked, argument):
    """The GPU number of a checked device other than a Pool; raises
    ValueError naming ``argument`` when it names no GPU."""
    if checked is None:
        return current_gpu()
    if isinstance(checked, DeviceName):
        return match_gpu(checked.name, checked.index, _gpu_count(), argument)
    return check_gpu_number(checked, _gpu_count(), argument)


def _numba_alloc_chosen():
    """Whether a context Numba makes now gets numba_alloc's manager
    (install(), set_memory_manager, or NUMBA_CUDA_MEMORY_MANAGER's module:
    resolved as a new context resolves it, raising what that raises)."""
    from numba.cuda.cudadrv import driver
    driver._ensure_memory_manager()
    return getattr(driver._memory_manager, "is_numba_alloc", False)


@contextlib.contextmanager
def resolve_pool(device=None, argument="device"):
    """Context manager: the pool ``device`` names (a GPU number, a
    TensorFlow name, a Pool, or None for the current GPU), with its GPU's
    context current (a Pool is yielded as it is). Raises TypeError or
    ValueError naming ``argument`` for a bad device, RuntimeError where no
    GPU can be reached or numba_alloc is not Numba's memory manager."""
    checked = check_device(device, argument)
    if isinstance(checked, Pool):
        yield checked
        return
    gpu_id = _gpu_number(checked, argument)
    from numba import cuda

    gpu = cuda.gpus[gpu_id]
    device = getattr(gpu, "_device", None)          # numba-cuda's Device (its context, if made)
    if device is not None and device.primary_context is None and not _numba_alloc_chosen():
        # refused before a context is made: it would keep Numba's own manager for good
        raise RuntimeError(f"numba_alloc is not Numba's memory manager: {_INSTALL_HINT}")
    with gpu:
        manager = cuda.current_context().memory_manager
        if not getattr(manager, "is_numba_alloc", False):     # (emm.NumbaAllocManager)
            raise RuntimeError(f"numba_alloc is not Numba's memory manager: {_INSTALL_HINT}")
        manager.initialize()
        yield manager.pool
