"""A user of a pool whose live blocks each hold their own data pattern, so
that any byte a pool operation corrupts is noticed."""

import numpy as np

from numba_alloc import OutOfMemoryError


def pattern(seed, nbytes):
    """``nbytes`` random bytes, the same for the same ``seed``. Drawn as
    64-bit words, eight bytes a draw: a draw per byte (integers(0, 256))
    took over half of test_pool_faults's time."""
    words = np.random.default_rng(seed).bit_generator.random_raw(-(-nbytes // 8))
    return words.view(np.uint8)[:nbytes]


class Owner:
    """Live blocks of one user, each filled with its own pattern."""

    def __init__(self, device, pool):
        self.device, self.pool, self.live, self.serial = device, pool, [], 0

    def malloc(self, size):
        try:
            block = self.pool.malloc(size)
        except OutOfMemoryError:
            return None
        self.serial += 1
        seed = (id(self), self.serial)
        for offset, data in self.expected(block, seed):
            self.device.write(block.address + offset, data)
        self.live.append((block, seed))
        return block

    def expected(self, block, seed):
        """(offset, bytes) that a live block holds: its pattern, in every byte."""
        return [(0, pattern(seed, block.size))]

    def free(self, index):
        block, seed = self.live.pop(index % len(self.live))
        for offset, data in self.expected(block, seed):
            assert (self.device.read(block.address + offset, len(data)) == data).all(), \
                "live data changed"
        self.pool.free(block)
