"""Checking integer and flag arguments, one way everywhere."""

import operator

import numpy as np


def as_int(value, name, kind="an int"):
    """``value`` as an int: an int or anything with ``__index__`` (NumPy
    integers), never a bool. Raises TypeError naming ``name`` and ``kind``,
    what is allowed."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {kind}, got {value!r}") from None


def request_size(nbytes):
    """A request's size in bytes as an int; TypeError or ValueError naming
    ``nbytes`` (an integer number of bytes, not negative)."""
    if type(nbytes) is not int:
        nbytes = as_int(nbytes, "nbytes", "an integer number of bytes")
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    return nbytes


def as_flag(value, name):
    """``value`` as a bool: True or False (a NumPy bool too). Raises
    TypeError naming ``name`` for anything else (1, "no", None)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")
