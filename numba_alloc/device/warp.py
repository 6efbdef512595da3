"""Warp-level device functions: a scan over the lanes that call together,
the bits a group of lanes names, a warp-aggregated ``atomic.add``, and the
decorator that makes a function device code on a GPU and Python under the
CUDA simulator (whose ``cuda`` here is :class:`heap_simulator.SimulatorCuda`,
with warp primitives that gather the simulator's threads).

Contract of every ``*_sync``-based function here, as CUDA's: all lanes of
``mask`` call it together, with the same ``mask``.
"""

from numba import cuda

from .heap_simulator import SimulatorCuda

SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF


def device_function(function):
    """A device function: compiled into whatever calls it on a GPU (an
    overload, as ``register_jitable`` makes: no current device is needed to
    compile, so ``cuda.compile_ptx`` works without a GPU); a plain Python
    function under NUMBA_ENABLE_CUDASIM."""
    if SIMULATOR:
        return function
    from numba.cuda.extending import register_jitable
    return register_jitable(function)


@device_function
def warp_scan(mask, value):
    """(the sum of ``value`` over the lanes of ``mask`` below this one, the
    sum over all of them): ``value`` >= 0 (int64). A whole warp: five
    ``shfl_up_sync`` and one ``shfl_sync``; a partial one: two
    ``ballot_sync`` per bit of the largest value, plus one."""
    lane = cuda.laneid
    if mask == FULL_MASK:
        inclusive = value
        delta = 1
        for _ in range(5):
            below = cuda.shfl_up_sync(mask, inclusive, delta)
            if lane >= delta:
                inclusive += below
            delta *= 2
        return inclusive - value, cuda.shfl_sync(mask, inclusive, 31)
    lower = mask & ((1 << lane) - 1)
    prefix = 0
    total = 0
    rest = value
    for bit in range(63):
        if cuda.ballot_sync(mask, rest != 0) == 0:
            break
        ones = cuda.ballot_sync(mask, rest & 1 != 0)
        prefix += cuda.popc(ones & lower) << bit
        total += cuda.popc(ones) << bit
        rest >>= 1
    return prefix, total


@device_function
def group_bits(mask, bit):
    """(the OR of ``1 << bit`` over the lanes of ``mask``, whether a lane of
    ``mask`` below this one has the same ``bit``): ``bit`` from 0 to 31;
    five ``ballot_sync``, then each lane reads every lane's bit off them."""
    b0 = cuda.ballot_sync(mask, bit & 1 != 0)
    b1 = cuda.ballot_sync(mask, bit & 2 != 0)
    b2 = cuda.ballot_sync(mask, bit & 4 != 0)
    b3 = cuda.ballot_sync(mask, bit & 8 != 0)
    b4 = cuda.ballot_sync(mask, bit & 16 != 0)
    lane = cuda.laneid
    bits = 0
    repeated = False
    rest = mask & FULL_MASK
    while rest != 0:
        src = cuda.ffs(rest) - 1
        rest &= rest - 1
        other = (((b0 >> src) & 1) | ((b1 >> src) & 1) << 1 | ((b2 >> src) & 1) << 2
                 | ((b3 >> src) & 1) << 3 | ((b4 >> src) & 1) << 4)
        bits |= 1 << other
        if src < lane and other == bit:
            repeated = True
    return bits, repeated


@device_function
def lowest_bits(bits, n):
    """The ``n`` (>= 0) lowest set bits of ``bits`` (all of them if fewer)."""
    rest = bits
    for _ in range(n):
        if rest == 0:
            break
        rest &= rest - 1
    return bits & ~rest


@device_function
def nth_bit(bits, n):
    """The index of the set bit of ``bits`` with ``n`` set bits below it
    (``bits`` has more than ``n``)."""
    rest = bits
    for _ in range(n):
        rest &= rest - 1
    return cuda.ffs(rest) - 1


@device_function
def aggregated_add(array, index, value):
    """``cuda.atomic.add(array, index, value)`` for the lanes of a warp that
    call it together (``activemask``; each with the same ``array`` and
    ``index``, ``value`` >= 0) in one atomic: the lowest lane adds their
    sum, and each lane gets the value before plus the values of the lanes
    below it, as if they had added one after another in lane order."""
    active = cuda.activemask()
    prefix, total = warp_scan(active, value)
    leader = cuda.ffs(active) - 1
    old = 0
    if cuda.laneid == leader:
        old = cuda.atomic.add(array, index, total)
    return cuda.shfl_sync(active, old, leader) + prefix


if SIMULATOR:
    cuda = SimulatorCuda()          # noqa: F811 (the device functions' ``cuda``)
