"""The device kernels numba_alloc runs: copies that move live blocks.

A launch copies moves (source offset, destination offset, length, in
bytes) within one uint8 array: on a GPU one spanning every segment of the
phase (:func:`phase_span`), so that a phase of moves between many segments
is a launch per LAUNCH_ROWS moves, not one per pair of segments. The host
cuts each move into chunks (:func:`launch_tables`): chunk boundaries fall
on 16-byte words of the source, every chunk but a move's last holds
``size`` bytes, a multiple of CHUNK (16 KiB) chosen so that a launch has
about ``target_chunks`` chunks (on a GPU CHUNKS_PER_BLOCK times the blocks
it holds at once: no more blocks than that copy, :func:`launch_config`), and thread
block ``b`` copies chunks ``b``, ``b + gridDim.x``, ... (so a launch ends
within one small chunk of its busiest block, not with a second wave of
big chunks): for each it finds its move by a binary search over the
moves' first chunks (no search for a launch of one move), then its
threads copy the chunk in block-stride loops. Where source and destination
are equally aligned the middle of a chunk goes in 16-byte words, each
thread loading UNROLL words (one 128-bit ``ld.global.v2.u64`` each) before
storing them (``st.global.v2.u64``); the edges, and moves whose source and
destination differ in alignment, go byte by byte.

Counting, in the scratch's first words: thread 0 of each block adds the
bytes of its chunks with one ``cuda.atomic.add`` (the block's only global
atomic; one per thread, all on one address, cost an H100 1.3 ms for 256
MiB, seven times the copy); thread 0 of block 0 also adds the launch's
moves and ``first`` with plain stores (no other thread of the launch writes
them, and the launches of a device run one after another):

    counters[DEFRAGMENTATIONS]  += first      (1 on the first launch of a defragmentation)
    counters[BYTES_MOVED]       += bytes copied
    counters[BLOCKS_MOVED]      += moves in the launch

The same Python function is compiled by ``cuda.jit`` for a GPU and run by
Numba's CUDA simulator (the tests, and the simulated device for batches up
to its ``kernel_limit``), where :func:`load16` and :func:`store16` are plain
Python (on a GPU their lowering below replaces them), so CI checks its
arithmetic.
"""

import numpy as np
from numba import cuda

from ..policy.backend import BLOCKS_MOVED, BYTES_MOVED, COUNTERS, DEFRAGMENTATIONS  # noqa: F401
from ..policy.phase import Phase

WORD = 16                   # bytes a thread loads and stores at once on the aligned path
UNROLL = 4                  # words a thread loads before it stores them
THREADS = 256               # threads per block of a launch on a GPU
CHUNK = UNROLL * THREADS * WORD     # 16 KiB: chunk sizes are multiples of this
TARGET_CHUNKS = 8192        # chunks a launch is cut into where the grid is not known
CHUNKS_PER_BLOCK = 8        # on a GPU: chunks a launch is cut into per block it holds at once
# Every launch has at least MIN_BLOCKS blocks: Numba warns at a launch of
# fewer than 128 (NumbaPerformanceWarning, "low occupancy"), which ``-W
# error`` makes an exception that would refuse defragmentation. Spare blocks
# (launch_config's rows above the first) copy nothing and cost no time. A warnings filter
# would not do: catch_warnings around the launches is not thread safe before
# Python 3.14, and a filter added at import hides the program's own
# low-occupancy warnings (and a test runner's per-test filters drop it again).
MIN_BLOCKS = 128

# The scratch, int64 words in device memory reserved once per device:
# [0, COUNTERS) the counters; [IDLE, IDLE + HEADER) a launch header that stays
# zero (the warm-up launch's: it moves nothing and writes nothing); from
# TABLE on, the headers and rows of the launches of one upload.
IDLE = 4
TABLE = 8
SCRATCH_WORDS = 12288       # 96 KiB
# a launch's header at scratch[at:], then its rows, ROW words each
ROWS, FIRST, SIZE, CHUNKS = range(4)    # moves, first, bytes per chunk, chunks
HEADER = 4
ROW = 4                     # source offset, destination offset, length, its first chunk
LAUNCH_ROWS = (SCRATCH_WORDS - TABLE - HEADER) // ROW   # moves per launch at most

SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)


def load16(array, offset):
    """The 16 bytes of the uint8 ``array`` from byte ``offset`` (a multiple
    of 16, with the array's start 16-byte aligned), for :func:`store16`. On
    a GPU one 128-bit load; here, with its bounds and alignment checked."""
    if offset < 0 or offset % WORD != 0 or offset + WORD > len(array):
        raise IndexError("load16: offset outside the array or not a multiple of 16")
    return array[offset:offset + WORD].copy()


def store16(array, offset, words):
    """Store ``words`` (from :func:`load16`) at byte ``offset`` of the uint8
    ``array`` (a multiple of 16). On a GPU one 128-bit store."""
    if offset < 0 or offset % WORD != 0 or offset + WORD > len(array):
        raise IndexError("store16: offset outside the array or not a multiple of 16")
    array[offset:offset + WORD] = words


def _register_lowering():
    """load16 and store16 in kernels compiled for a GPU: a ``<2 x i64>``
    load or store aligned to 16 bytes (a pair of uint64 in between)."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import lower_builtin, type_callable

    pair = types.UniTuple(types.uint64, 2)
    vector = ir.VectorType(ir.IntType(64), 2)

    def is_bytes(array):
        return isinstance(array, types.Array) and array.dtype == types.uint8 and array.ndim == 1

    @type_callable(load16)
    def _type_load(context):
        def typer(array, offset):
            if is_bytes(array) and isinstance(offset, types.Integer):
                return pair
        return typer

    @type_callable(store16)
    def _type_store(context):
        def typer(array, offset, words):
            if is_bytes(array) and isinstance(offset, types.Integer) and words == pair:
                return types.none
        return typer

    def pointer(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        offset = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.bitcast(builder.gep(data, [offset]), vector.as_pointer())

    def lane(i):
        return ir.Constant(ir.IntType(32), i)

    @lower_builtin(load16, types.Array, types.Integer)
    def _lower_load(context, builder, signature, args):
        words = builder.load(pointer(context, builder, signature, args), align=WORD)
        return context.make_tuple(builder, pair, [builder.extract_element(words, lane(i))
                                                  for i in range(2)])

    @lower_builtin(store16, types.Array, types.Integer, types.UniTuple)
    def _lower_store(context, builder, signature, args):
        words = ir.Constant(vector, ir.Undefined)
        for i in range(2):
            words = builder.insert_element(words, builder.extract_value(args[2], i), lane(i))
        builder.store(words, pointer(context, builder, signature, args), align=WORD)
        return context.get_dummy_value()


if not SIMULATOR:
    _register_lowering()


def copy_moves(dst, src, scratch, at):
    """Copy chunks ``blockIdx.x``, ``blockIdx.x + gridDim.x``, ... of the
    launch whose header is at ``scratch[at]`` from the uint8 array ``src``
    to ``dst`` (both 16-byte aligned; the same array when a launch spans
    the segments) and count them. Blocks past the last chunk, and those of
    ``blockIdx.y`` above 0 (launch_config's spares), copy nothing. Moves
    must not overlap each other's destinations or any source."""
    thread = cuda.threadIdx.x
    threads = cuda.blockDim.x
    rows = scratch[at + ROWS]
    spare = cuda.blockIdx.y != 0     # a row of blocks that only makes the grid MIN_BLOCKS
    if cuda.blockIdx.x == 0 and not spare and thread == 0:
        first = scratch[at + FIRST]
        if rows != 0 or first != 0:
            scratch[DEFRAGMENTATIONS] += first
            scratch[BLOCKS_MOVED] += rows
    chunks = 0 if spare else scratch[at + CHUNKS]
    size = scratch[at + SIZE]
    table = at + HEADER
    step = threads * WORD
    copied = 0                  # bytes of this block's chunks
    block = cuda.blockIdx.x
    while block < chunks:
        low = 0                 # the last row whose first chunk is at most ``block``
        high = rows - 1
        while low < high:
            middle = (low + high + 1) // 2
            if scratch[table + ROW * middle + 3] <= block:
                low = middle
            else:
                high = middle - 1
        row = table + ROW * low
        piece = block - scratch[row + 3]
        lead = scratch[row] % WORD  # chunk boundaries lie on the source's words
        start = max(piece * size - lead, 0)
        stop = min((piece + 1) * size - lead, scratch[row + 2])
        s = scratch[row] + start
        d = scratch[row + 1] + start
        length = stop - start
        head = length           # bytes before the first word (all of them when unaligned)
        if (s - d) % WORD == 0:
            head = min(-s % WORD, length)
        end = length - (length - head) % WORD
        for i in range(thread, head, threads):
            dst[d + i] = src[s + i]
        for i in range(end + thread, length, threads):
            dst[d + i] = src[s + i]
        i = head + thread * WORD
        while i + (UNROLL - 1) * step < end:      # UNROLL (four) words in flight
            a = load16(src, s + i)
            b = load16(src, s + i + step)
            c = load16(src, s + i + 2 * step)
            e = load16(src, s + i + 3 * step)
            store16(dst, d + i, a)
            store16(dst, d + i + step, b)
            store16(dst, d + i + 2 * step, c)
            store16(dst, d + i + 3 * step, e)
            i += UNROLL * step
        while i < end:
            store16(dst, d + i, load16(src, s + i))
            i += step
        copied += length
        block += cuda.gridDim.x
    if thread == 0 and cuda.blockIdx.x < chunks:
        cuda.atomic.add(scratch, BYTES_MOVED, copied)


# the one signature CudaDevice.copy launches copy_moves with: both segments as
# uint8, the scratch, and where the launch's header is in it
COPY_MOVES_SIGNATURE = "void(uint8[::1], uint8[::1], int64[::1], int64)"


def _launch_words(rows, first, chunk, target_chunks):
    """A launch's header and rows (int64) for the moves ``rows`` (n, 3)."""
    src, dst, length = rows[:, 0], rows[:, 1], rows[:, 2]
    size = max(1, -(-int(length.sum()) // target_chunks))
    size = -(-size // chunk) * chunk
    pieces = np.where(length > 0, -(-(src % WORD + length) // size), 0)
    words = np.empty(HEADER + ROW * len(rows), np.int64)
    words[:HEADER] = (len(rows), first, size, int(pieces.sum()))
    table = words[HEADER:].reshape(-1, ROW)
    table[:, :3] = rows
    table[:, 3] = np.cumsum(pieces) - pieces
    return words


def _checked_rows(batches):
    """Every batch's moves as one int64 (n, 3) array (a new one), in batch
    order, and each batch's count of moves; ValueError naming the first
    move outside its segments or of a negative length. One check for them
    all: a phase holds a batch per pair of segments."""
    parts = [np.asarray(moves, dtype=np.int64).reshape(-1, 3) for _, _, moves in batches]
    counts = [len(part) for part in parts]
    if not parts:
        return np.empty((0, 3), np.int64), counts
    rows = np.concatenate(parts)
    src, dst, length = rows[:, 0], rows[:, 1], rows[:, 2]
    src_size = np.repeat(np.array([size for _, (_, size), _ in batches], np.int64), counts)
    dst_size = np.repeat(np.array([size for (_, size), _, _ in batches], np.int64), counts)
    bad = (length < 0) | (src < 0) | (dst < 0) | (src + length > src_size) | (dst + length > dst_size)
    if bad.any():
        at = int(np.argmax(bad))
        index = int(np.searchsorted(np.cumsum(counts), at, "right"))
        row = at - sum(counts[:index])
        raise ValueError(f"batches[{index}]: move {row} {tuple(rows[at].tolist())} "
                         f"(source offset, destination offset, length) must lie within "
                         f"its segments ({src_size[at]} and {dst_size[at]} bytes)")
    return rows, counts


def _checked(batches):
    """Each batch's moves as an int64 (n, 3) array (:func:`_checked_rows`)."""
    rows, counts = _checked_rows(batches)
    return np.split(rows, np.cumsum(counts)[:-1]) if counts else []


def phase_span(phase):
    """A :class:`~numba_alloc.policy.phase.Phase` as one batch over the
    span from its lowest segment's address to its highest one's end:
    ((base, size), (base, size), rows), the rows (a new array) offsets
    from ``base``. Device memory is one address space, so one launch
    copies moves between any segments; the copy touches only the moves'
    bytes, never what lies between the segments. ValueError naming the
    first move outside its segments or of a negative length, for a
    segment address that is not a multiple of WORD (the aligned path's
    offsets are reckoned from ``base``), or for a phase of no moves."""
    moves, sources, destinations = phase
    if not len(moves):
        raise ValueError("a phase to copy must hold at least one move")
    segments = np.concatenate((sources, destinations))
    unaligned = np.flatnonzero(segments[:, 0] % WORD)
    if len(unaligned):
        raise ValueError(f"segment addresses must be multiples of {WORD}, got "
                         f"{int(segments[unaligned[0], 0]):#x}")
    src, dst, length = moves[:, 0], moves[:, 1], moves[:, 2]
    bad = ((length < 0) | (src < sources[:, 0]) | (dst < destinations[:, 0])
           | (src + length > sources[:, 0] + sources[:, 1])
           | (dst + length > destinations[:, 0] + destinations[:, 1]))
    if bad.any():
        at = int(np.argmax(bad))
        raise ValueError(f"move {at} {tuple(moves[at].tolist())} (source, destination, "
                         f"length) must lie within its segments ({tuple(sources[at].tolist())} "
                         f"and {tuple(destinations[at].tolist())}, address and size)")
    base = int(segments[:, 0].min())
    size = int((segments[:, 0] + segments[:, 1]).max()) - base
    rows = moves.copy()
    rows[:, :2] -= base
    return (base, size), (base, size), rows


def launch_tables(batches, first, chunk=CHUNK, target_chunks=TARGET_CHUNKS,
                  capacity=SCRATCH_WORDS - TABLE):
    """The launches that copy ``batches`` ((destination segment, source
    segment, moves), each segment an (address, size) pair and the moves an
    int64 array of rows (source offset, destination offset, length)), as
    uploads: [(words, [(batch index, at, chunks)])], ``words`` to be
    written at scratch[TABLE:] before its launches run, each launch with
    its header at scratch[at] and ``chunks`` blocks that copy. ``first``
    goes to the first launch. ``chunk`` (a multiple of 16) and
    ``target_chunks`` set the chunk size, ``capacity`` the words of an
    upload. ValueError, before anything is planned, for a move outside its
    segments or of a negative length."""
    if chunk <= 0 or chunk % WORD:
        raise ValueError(f"chunk must be a positive multiple of {WORD} bytes, got {chunk}")
    per_launch = (capacity - HEADER) // ROW
    if per_launch < 1:
        raise ValueError(f"capacity must hold a launch of one move ({HEADER + ROW} words), "
                         f"got {capacity}")
    uploads, words, launches, used = [], [], [], 0
    for index, rows in enumerate(_checked(batches)):
        for start in range(0, len(rows), per_launch):
            launch = _launch_words(rows[start:start + per_launch], first, chunk, target_chunks)
            first = 0
            if used + len(launch) > capacity:
                uploads.append((np.concatenate(words), launches))
                words, launches, used = [], [], 0
            launches.append((index, TABLE + used, int(launch[CHUNKS])))
            words.append(launch)
            used += len(launch)
    if launches:
        uploads.append((np.concatenate(words), launches))
    return uploads


def launch_config(chunks, resident=None, least=MIN_BLOCKS):
    """((x, y) blocks, threads) of a copy launch of ``chunks`` chunks
    (launch_tables): x a block a chunk, or no more than the ``resident``
    blocks the device holds at once (block ``b`` then copies chunks ``b``,
    ``b + x``, ...), at least 1; and y rows of them, so that the grid has at
    least ``least`` blocks: the rows above the first copy nothing (a
    GPU that holds fewer than MIN_BLOCKS would otherwise run the copying
    blocks in two waves)."""
    x = max(1, chunks if resident is None else min(chunks, resident))
    return (x, -(-least // x)), THREADS


def resident_blocks(kernel):
    """How many blocks of THREADS threads of the loaded copy
    ``kernel`` (a dispatcher of one signature) the current context's device
    holds at once: the occupancy calculator's blocks per SM (registers and
    all) times its SMs. None where the driver cannot say (a launch is then
    a block a chunk)."""
    try:
        (compiled,) = kernel.overloads.values()
        return int(compiled.max_cooperative_grid_blocks(THREADS)) or None
    except Exception:      # noqa: BLE001 - a driver without the occupancy calls
        return None


def _disk_cache_usable():
    """Whether Numba can cache kernels of this file on disk (a writable
    __pycache__, NUMBA_CACHE_DIR or the user's cache directory)."""
    from numba.cuda.dispatcher import CUDACache
    try:
        CUDACache(copy_moves)
    except RuntimeError:            # "cannot cache function ...: no locator available"
        return False
    return True


def gpu_copy_moves():
    """A new dispatcher of ``copy_moves`` compiled for the GPU, for
    COPY_MOVES_SIGNATURE only, in the current context (from Numba's on-disk
    cache when it has it: the cubin, no NVVM or linking). Compiling is then
    disabled: a launch with other argument types raises instead of compiling
    under whatever lock its caller holds.

    New for each context, and after each reset of one: its first launch
    loads the module into the current context, and Numba keeps the loaded
    function by device number for good (CUDACodeLibrary._cufunc_cache),
    although Context.reset() unloads its module and cuda.close() makes a new
    context; an old dispatcher would launch the unloaded function."""
    return cuda.jit(COPY_MOVES_SIGNATURE, cache=_disk_cache_usable())(copy_moves)


class _Memory:
    """A NumPy array as a kernel run by the CUDA simulator sees it here:
    indexed as the array, without the simulator's wrapper of device arrays
    (which copies NumPy arrays in and out, and costs ten times more an
    access)."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __getitem__(self, index):
        return self.array[index]

    def __setitem__(self, index, value):
        self.array[index] = value

    def __len__(self):
        return len(self.array)


def simulated_copy(dst, src, table, counters, first, threads=8, chunk=CHUNK,
                   target_chunks=TARGET_CHUNKS, capacity=SCRATCH_WORDS - TABLE, grid=None,
                   least=1):
    """Run ``copy_moves`` under Numba's CUDA simulator on NumPy arrays: the
    moves ``table`` from the uint8 segment ``src`` to ``dst``, planned by
    :func:`launch_tables` (``chunk``, ``target_chunks``, ``capacity``),
    ``threads`` per block and a block a chunk, or at most ``grid`` blocks,
    in a grid of at least ``least`` (:func:`launch_config`),
    adding to the int64 ``counters`` what ran (also when a launch raises).
    The kernel indexes the arrays themselves (:class:`_Memory`), so that
    views of one array share memory as views of one device allocation do
    on a GPU."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    kernel = FakeCUDAKernel(copy_moves, device=False)       # its grid is set per launch
    batch = ((0, dst.size), (0, src.size), table)
    for words, launches in launch_tables([batch], first, chunk, target_chunks, capacity):
        scratch = np.zeros(TABLE + len(words), np.int64)
        scratch[:COUNTERS] = counters
        scratch[TABLE:] = words
        try:
            for _, at, chunks in launches:
                blocks, _ = launch_config(chunks, grid, least)
                kernel[blocks, threads](_Memory(dst), _Memory(src), _Memory(scratch), at)
        finally:
            counters[:] = scratch[:COUNTERS]
