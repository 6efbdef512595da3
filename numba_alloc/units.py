"""Bytes: the units the project counts in, parsing a size a user gives, and
writing one for a person. A leaf: imports nothing of the package."""

import operator
import re
from fractions import Fraction

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", re.ASCII)


def whole(value):
    """``value`` as an int when it is an int or a NumPy integer (anything
    with ``__index__``), never a bool; else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def parse_size(value, name):
    """Bytes from an int (a NumPy integer too) or a string such as
    ``"512MiB"``, ``"16GiB"``, ``"1GB"`` (KiB/MiB/GiB/TiB are powers of 1024,
    KB/MB/GB/TB of 1000). Raises ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of bytes, got {value!r}")
    number = whole(value)
    if number is not None:
        if number < 0:
            raise ValueError(f"{name} must not be negative, got {number}")
        return number
    if isinstance(value, str):
        m = _SIZE_RE.fullmatch(value)
        if m and m.group(2).lower() in _UNITS:
            nbytes = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]   # exact
            if nbytes.denominator == 1:
                return int(nbytes)
    raise ValueError(
        f"{name} must be a number of bytes: an int or a string such as "
        f"'512MiB', '16GiB' or '1GB', got {value!r}")


BINARY_UNITS = (("B", 1), ("KiB", KiB), ("MiB", MiB), ("GiB", GiB), ("TiB", 1 << 40))


def binary_unit(nbytes):
    """(name, bytes in one) of the unit for ``nbytes`` (an int or a float):
    the largest of B, KiB, MiB, GiB and TiB that ``abs(nbytes)`` reaches
    (B below 1 KiB, TiB from 1 TiB up)."""
    chosen = BINARY_UNITS[0]
    for unit in BINARY_UNITS[1:]:
        if abs(nbytes) < unit[1]:
            break
        chosen = unit
    return chosen


def format_bytes(nbytes):
    """Bytes (an int or a float) in the unit of their magnitude:
    '512 B', '20.00 MiB', '3.00 TiB'."""
    name, size = binary_unit(nbytes)
    return f"{nbytes:.0f} B" if size == 1 else f"{nbytes / size:.2f} {name}"
