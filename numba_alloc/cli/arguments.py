"""What the commands share: the error for bad input, and the argparse
types of their arguments."""

import argparse
import math

from ..units import parse_size


class UsageError(Exception):
    """An error in what the user asked for (an argument, or a file or device
    it names); ``main`` prints it as one line and returns 2."""


def positive(kind, most=math.inf):
    """An argparse type: ``kind`` (int or float) of the text, refused unless
    finite, greater than 0 and at most ``most``."""
    bound = "" if most == math.inf else f" of at most {most}"

    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value <= most or value == math.inf:
            raise argparse.ArgumentTypeError(
                f"must be a positive {kind.__name__}{bound}, got {text!r}")
        return value
    return convert


def validated(check):
    """An argparse type that keeps the text once ``check(text)`` accepts it;
    the ValueError ``check`` raises is the argument's error."""
    def convert(text):
        try:
            check(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text
    return convert


def capacity(text):
    """An argparse type: the size of a simulated device (``--capacity``), a
    positive number of bytes such as "1GiB"; the text is kept."""
    def check(text):
        if parse_size(text, "capacity") <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {text!r}")
    return validated(check)(text)


def gpu_available():
    """Whether Numba can run kernels on a real GPU (not the CUDA simulator)."""
    from numba import cuda
    return not cuda.config.ENABLE_CUDASIM and cuda.is_available()
