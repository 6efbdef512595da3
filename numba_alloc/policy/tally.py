"""A counter kept in Python as PyTorch keeps its stats: current value,
peak, total increase (allocated) and total decrease (freed). For the
counts beside the compiled core's (the pinned host cache, managed memory).
Not thread safe: its owner calls it under its own lock.
"""

METRICS = ("current", "peak", "allocated", "freed")


class Tally:
    """One counter; ``current`` and ``peak`` are read directly."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def up(self, amount):
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def down(self, amount):
        self.current -= amount
        self.freed += amount

    def reset_peak(self):
        self.peak = self.current

    def reset_accumulated(self):
        self.allocated = self.freed = 0

    def items(self, name):
        """``(f"{name}.{metric}", value)`` for each metric."""
        return ((f"{name}.{metric}", getattr(self, metric)) for metric in METRICS)
