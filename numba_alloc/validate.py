"""Checking integer arguments, one way everywhere."""

import operator


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
