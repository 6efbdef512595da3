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


def format_bytes(nbytes):
    """Bytes in a human unit: '512 B', '20.00 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes} B" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
