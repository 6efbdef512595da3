"""Settings: what they mean, how they are parsed and validated, and the
defaults a new pool starts from.

``NUMBA_ALLOC_CONF="key:value,key:value"`` (read at import) and
:func:`numba_alloc.configure` both go through :func:`parse_settings`, which
validates every key and value before anything is applied. They set the
defaults in force, which the plugin keeps and registers here
(:func:`register_defaults`), so that every :class:`~numba_alloc.policy.pool.Pool`
starts from them, a simulated device's too.
"""

import dataclasses
import math
import re

import numpy as np

from ..units import MiB, parse_size, whole

ARENA_UNIT = 2 * MiB   # with growth off the arena is reserved in multiples of this
SMALLEST_BLOCK = 512   # every block the pool hands out is a multiple of this (pool.ROUND)

_WHOLE_RE = re.compile(r"\s*\d+\s*", re.ASCII)
_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def _parse_bool(key, value):
    """True or False from a bool, the int 1 or 0 (a NumPy integer too), or a
    string such as "on"."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if whole(value) in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{key} must be true or false (also on/off, yes/no, 1/0), got {value!r}")


def _parse_auto_bool(key, value):
    """None (auto) from None, "auto" or "none", else True or False as
    _parse_bool."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "none")):
        return None
    try:
        return _parse_bool(key, value)
    except ValueError:
        raise ValueError(f"{key} must be auto (None, 'none'), or true or false (also on/off, "
                         f"yes/no, 1/0), got {value!r}") from None


_MAX_SPLIT_MB = 1 << 42


def _parse_max_split(key, value):
    """None (no limit) from None, float("inf") or "inf"/"none"; else a whole
    number of MiB above 20 and below 2**42 (2**62 bytes: larger is no
    limit in effect, and the pool's core holds sizes in int64), from an int
    (a NumPy integer too) or a string of digits."""
    if value is None or (isinstance(value, float) and value == math.inf):
        return None
    if isinstance(value, str) and value.strip().lower() in ("inf", "none", ""):
        return None
    mb = whole(value)
    if isinstance(value, str) and _WHOLE_RE.fullmatch(value):
        mb = int(value)
    if mb is None or not 20 < mb < _MAX_SPLIT_MB:
        raise ValueError(
            f"{key} must be a whole number of MiB greater than 20 (the large "
            f"segment size) and below {_MAX_SPLIT_MB} (2**42), or inf (float('inf') "
            f"or 'inf') for no limit, got {value!r}")
    return mb


def _means_none(value):
    """Whether a setting's ``value`` is none: None, "none" or ""."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("none", ""))


def _parse_limit(key, value):
    """None, a fraction of device memory (a float in (0, 1], or a string
    with a decimal point such as "0.8" or "1.0") or a number of bytes (an int
    or a size string) of at least SMALLEST_BLOCK: so ``limit=1`` is refused
    rather than read as one byte or as the whole device."""
    if _means_none(value):
        return None
    if isinstance(value, (float, np.floating)) or (isinstance(value, str) and re.fullmatch(r"\s*0?\.\d+\s*|\s*1\.0*\s*", value)):
        fraction = float(value)
        if 0 < fraction <= 1 and math.isfinite(fraction):
            return fraction
        raise ValueError(f"{key} as a fraction of device memory must be in (0, 1], got {value!r}")
    try:
        nbytes = parse_size(value, key)
    except ValueError:
        raise ValueError(
            f"{key} must be a number of bytes (an int or a string such as "
            f"'4096MiB' or '8GiB'), a fraction of device memory in (0, 1] "
            f"such as 0.8, or none, got {value!r}") from None
    if nbytes == 1:
        raise ValueError(
            f"{key}={value!r} would be 1 byte: write 1.0 for the whole device (a float "
            f"in (0, 1] is a fraction of device memory), or a size such as '1GiB'")
    if nbytes < SMALLEST_BLOCK:
        raise ValueError(
            f"{key} in bytes must be at least {SMALLEST_BLOCK} (the smallest block), got "
            f"{value!r}; a fraction of device memory is a float in (0, 1] such as 0.8")
    return nbytes


def _parse_host_limit(key, value):
    """None (no cap) or a number of bytes (an int or a size string); the
    error says both."""
    if _means_none(value):
        return None
    try:
        return parse_size(value, key)
    except ValueError:
        raise ValueError(f"{key} must be a number of bytes from 0 up (an int, or a string "
                         f"such as '16GiB'), or none (no cap), got {value!r}") from None


MOST_HEAP = (1 << 63) - 1   # cuCtxSetLimit takes a size_t; the core counts in int64


def _heap_bytes(key, value, unset):
    """None or a number of bytes from 1 to MOST_HEAP (an int or a size
    string); ``unset`` says what none means, for the error, which says the
    whole range whatever is wrong."""
    if _means_none(value):
        return None
    try:
        nbytes = parse_size(value, key)
    except ValueError:
        nbytes = 0
    if 1 <= nbytes <= MOST_HEAP:
        return nbytes
    raise ValueError(f"{key} must be a number of bytes from 1 to 2**63 - 1 (an int or a "
                     f"string such as '64MiB'), or none {unset}, got {value!r}")


def _parse_heap_size(key, value):
    """None (CUDA's own size) or a number of bytes from 1 to MOST_HEAP."""
    return _heap_bytes(key, value, "for CUDA's 8 MiB")


def _parse_nrt_heap_size(key, value):
    """None (off: NRT uses CUDA's device malloc heap) or a number of bytes
    from 1 to MOST_HEAP (the heap rounds it up to whole 64 KiB pages)."""
    return _heap_bytes(key, value, "to leave NRT on CUDA's device malloc heap")


def _parse_gc_threshold(key, value):
    if _means_none(value):
        return None
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        threshold = math.nan
    if isinstance(value, bool) or not 0.0 < threshold < 1.0:
        raise ValueError(f"{key} must be a fraction strictly between 0 and 1, or none, got {value!r}")
    return threshold


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a pool does; docs/settings.md describes each setting.

    max_split_size_mb: free blocks of this many MiB or more are never split
        (None: no limit).
    growth: True to take segments on demand; False to reserve the pool's
        limit (or all free device memory) at first use.
    limit: most bytes the pool may reserve: None (the device's memory), a
        number of bytes (an int, at least 512), or a fraction of total device
        memory (a float in (0, 1]; 1.0 is the whole device, 1 is refused),
        refused by the pool when it comes to fewer bytes than an int limit
        may be.
    garbage_collection_threshold: when reserving a new segment would take the
        pool above this fraction of its limit, it first returns fully free
        cached segments to the device (None: off).
    keep_whole_segments: once the pool has reserved 35% of its limit
        (memory grows scarce), a large request is not carved from a wholly
        free cached segment more than 20 MiB larger than PyTorch's segment
        for it: the pool reserves a segment of its own instead (returning
        cached free segments to the device when it must), so that free
        memory does not end up stuck behind a long-lived block; below that,
        and with False always, any free block that fits serves, as in
        PyTorch's caching allocator (fewer device calls and less reserved,
        more memory lost to fragmentation when memory is scarce).
    separate_big_segments: while in force, once the pool has reserved 35%
        of its limit, a large request below 10 MiB is not carved from the
        free blocks of a big segment (one reserved for a request of 10 MiB
        or more) while the pool can grow: it takes the best fit elsewhere
        or gets a segment of its own size (rounded up to 2 MiB), so that a
        big segment whose big block is freed is whole again, for the next
        big request or for the device; once growing has failed, any free
        block serves. None (auto, the default): in force while defrag is
        off (moving blocks undoes what it prevents, and its tight segments
        cost defragmentation room); True or False: always or never (False:
        best fit over all free blocks, as in PyTorch's caching allocator).
    expandable_segments: the large pool's segments are runs of pages
        mapped under one range of reserved addresses (PyTorch's setting of
        that name): a request maps the fewest pages that, with a free
        block beside them, hold it, and the pool returns the whole pages
        inside free blocks to the device (not only wholly free segments),
        so that a free block stuck behind a long-lived one costs at most
        the partial pages at its ends. None (auto): in force
        where the device maps pages (the simulated device, and a GPU
        through the driver's virtual memory calls), growth is on and
        max_split_size_mb unset; True: the
        same, an error on a device that cannot or with max_split_size_mb;
        False (the default): never. Cannot change once the pool has
        reserved memory.
    defrag: move live blocks to serve a request that fails only because free
        memory is scattered; once memory is scarce (35% of the limit
        reserved), a large block then keeps no rest of the free block it is
        carved from (a defragmentation can gather the rests).
    reclaim: when a request cannot be met otherwise, copy inactive blocks
        (outside Pool.use) to pinned host memory and free their device
        memory; a block comes back on its next use (TensorFlow Large Model
        Support's reclaim); under the Numba plugin, kernel launches, copies
        and address reads make arrays active (numba_alloc.plugin.activity).
    host_limit: most bytes of host memory reclaimed blocks may hold (None:
        no cap), as TF_GPU_HOST_MEM_LIMIT_IN_MB did.
    host_cache_limit: most bytes of pinned host memory the host cache
        (Numba's pinned and mapped arrays under the plugin) holds, in use and
        cached together (None: no cap).
    malloc_heap_size: bytes of CUDA's device malloc heap, which NRT's
        np.empty inside kernels draws from, outside the pool (None: CUDA's
        8 MiB); set before the context's first kernel that uses it.
    nrt_heap_size: None (off), or bytes of a device heap carved from the
        pool that serves NRT's allocations inside kernels instead of CUDA's
        device malloc heap (every kernel Numba compiles with NRT under the
        plugin links numba_alloc's NRT); the heap is carved when the first
        such kernel is loaded, and a new size replaces it between launches.
    """

    max_split_size_mb: int | None = None
    growth: bool = True
    limit: int | float | None = None
    garbage_collection_threshold: float | None = None
    keep_whole_segments: bool = True
    separate_big_segments: bool | None = None
    expandable_segments: bool | None = False
    defrag: bool = False
    reclaim: bool = False
    host_limit: int | None = None
    host_cache_limit: int | None = None
    malloc_heap_size: int | None = None
    nrt_heap_size: int | None = None

    def __post_init__(self):
        if not self.growth and self.max_split_size_mb is not None:
            raise ValueError(
                "max_split_size_mb applies only with growth on: with growth off "
                "every block is carved from one preallocated arena")
        if self.expandable_segments and self.max_split_size_mb is not None:
            raise ValueError(
                "expandable_segments cannot be on with max_split_size_mb: segments of "
                "pages never keep a free block whole (set one of them)")
        if not self.growth and isinstance(self.limit, int) and self.limit < ARENA_UNIT:
            raise ValueError(
                f"limit must be at least {ARENA_UNIT} bytes (2 MiB) with growth off, "
                f"the unit the arena is reserved in, got {self.limit}")

    @property
    def big_segments_apart(self):
        """Whether separate_big_segments is in force (auto: without defrag)."""
        if self.separate_big_segments is None:
            return not self.defrag
        return self.separate_big_segments

    @property
    def max_split_size(self):
        """max_split_size_mb in bytes; None when unlimited."""
        return None if self.max_split_size_mb is None else self.max_split_size_mb * MiB

    def check_limit_of(self, total) -> None:
        """Raise ValueError naming ``limit`` when it is a fraction that comes
        to fewer bytes of a device of ``total`` bytes than an int limit may
        be: SMALLEST_BLOCK, with growth off ARENA_UNIT."""
        if not isinstance(self.limit, float):
            return
        resolved = self.resolve_limit(total)
        if not self.growth and resolved < ARENA_UNIT:
            raise ValueError(
                f"limit {self.limit} of this device is {resolved} bytes, below the "
                f"{ARENA_UNIT} bytes the arena is reserved in with growth off")
        if resolved < SMALLEST_BLOCK:
            raise ValueError(
                f"limit {self.limit} of this device is {resolved} bytes, below the "
                f"{SMALLEST_BLOCK} bytes of the smallest block")

    def resolve_limit(self, total) -> int:
        """The limit in bytes for a device of ``total`` bytes."""
        if self.limit is None:
            return total
        if isinstance(self.limit, float):
            return int(self.limit * total)
        return self.limit


_PARSERS = {
    "max_split_size_mb": _parse_max_split,
    "growth": _parse_bool,
    "limit": _parse_limit,
    "garbage_collection_threshold": _parse_gc_threshold,
    "keep_whole_segments": _parse_bool,
    "separate_big_segments": _parse_auto_bool,
    "expandable_segments": _parse_auto_bool,
    "defrag": _parse_bool,
    "reclaim": _parse_bool,
    "host_limit": _parse_host_limit,
    "host_cache_limit": _parse_host_limit,
    "malloc_heap_size": _parse_heap_size,
    "nrt_heap_size": _parse_nrt_heap_size,
}


def parse_settings(changes):
    """Validate a mapping of setting names to values; return the parsed values.
    Raises ValueError naming the first bad key and what it allows."""
    parsed = {}
    for key, value in changes.items():
        parser = _PARSERS.get(key)
        if parser is None:
            raise ValueError(
                f"unknown setting {key!r}; the settings are: {', '.join(_PARSERS)}")
        parsed[key] = parser(key, value)
    return parsed


def parse_conf(text):
    """Parse ``"key:value,key:value"`` (NUMBA_ALLOC_CONF) into settings;
    raises ValueError as :func:`parse_settings`, and for an entry without
    a value or a key given twice."""
    changes = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ValueError(f"entry {item.strip()!r} is not of the form key:value "
                             "(write none to leave a setting unset)")
        if key in changes:
            raise ValueError(f"{key} is given twice ({changes[key]!r} and {value!r})")
        changes[key] = value
    return parse_settings(changes)


_defaults_in_force = None       # the registered provider of the defaults, or None


def register_defaults(provider):
    """Start every Pool made from now on from ``provider()``, the
    :class:`Settings` in force (the plugin registers NUMBA_ALLOC_CONF's and
    configure()'s at import); ``provider`` may raise ValueError (a bad
    NUMBA_ALLOC_CONF), which the pool's maker gets. Raises TypeError when
    ``provider`` is not callable, changing nothing."""
    global _defaults_in_force
    if not callable(provider):
        raise TypeError(f"provider must be a callable returning Settings, got {provider!r}")
    _defaults_in_force = provider


def defaults_in_force() -> Settings:
    """The :class:`Settings` a new pool starts from: the registered
    provider's, else Settings(). Raises what the provider raises."""
    return Settings() if _defaults_in_force is None else _defaults_in_force()
