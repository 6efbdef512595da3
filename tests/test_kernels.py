"""The copy kernel's arithmetic and planning, run by Numba's CUDA simulator."""

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="the property-based tests need hypothesis (pip install hypothesis)")

from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from numba_alloc.device import inspection, kernels
from numba_alloc.policy.phase import Phase


@st.composite
def move_tables(draw):
    """Non-overlapping moves (any alignment and length, zero too) from a
    source into a destination buffer; sometimes none."""
    size = 16 * draw(st.integers(8, 64))
    rows, src_cursor, dst_cursor = [], draw(st.integers(0, 40)), draw(st.integers(0, 40))
    while True:
        length = draw(st.one_of(st.integers(0, 40), st.integers(40, 300)))
        if src_cursor + length > size or dst_cursor + length > size:
            break
        rows.append((src_cursor, dst_cursor, length))
        src_cursor += length + draw(st.integers(0, 20))
        dst_cursor += length + draw(st.integers(0, 20))
        if draw(st.integers(0, 5)) == 0:
            break
    return size, np.array(rows, dtype=np.int64).reshape(-1, 3)


def run_and_check(size, table, first, **plan):
    """Run the simulated kernel over ``table``: every byte of the
    destination is the source's where a move put it and untouched
    elsewhere, the source unchanged, the counters exact, and every thread
    block that copied made exactly one global atomic. Returns the blocks'
    atomics."""
    rng = np.random.default_rng(size + len(table))
    src = rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.full(size, 0xEE, dtype=np.uint8)
    source, expected = src.copy(), dst.copy()
    for s, d, n in table:
        expected[d:d + n] = src[s:s + n]
    counters = np.array([5, 7, 11], dtype=np.int64)             # what earlier copies counted
    atomics = inspection.atomics_per_block(
        lambda: kernels.simulated_copy(dst, src, table, counters, first, **plan))
    np.testing.assert_array_equal(dst, expected)
    np.testing.assert_array_equal(src, source)
    assert counters[kernels.BYTES_MOVED] == 7 + table[:, 2].sum()
    assert counters[kernels.BLOCKS_MOVED] == 11 + len(table)
    assert counters[kernels.DEFRAGMENTATIONS] == 5 + (first if len(table) else 0)
    assert set(atomics.values()) <= {1}
    return atomics


@settings(max_examples=60, deadline=None)
@given(case=move_tables(), threads=st.sampled_from([1, 5, 8, 32]),
       chunk=st.sampled_from([16, 48, 64, 256, kernels.CHUNK]),
       target_chunks=st.sampled_from([1, 3, kernels.TARGET_CHUNKS]),
       grid=st.sampled_from([None, 1, 2, 7]), first=st.integers(0, 1))
def test_copy_moves_copies_every_byte_and_counts_them(case, threads, chunk, target_chunks, grid,
                                                      first):
    size, table = case
    run_and_check(size, table, first, threads=threads, chunk=chunk, target_chunks=target_chunks,
                  grid=grid)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("lead", [0, 5])
def test_aligned_moves_of_every_word_count_stop_at_their_end(threads, lead):
    """Equally aligned moves of 0 to two unrolled passes of words (and a
    word more), with edges or without: the loops stop at the move's last
    word, whichever thread has it."""
    words = range(2 * kernels.UNROLL * threads + 2)
    apart = 16 * len(words) + 32                # each move and what follows it
    table = np.array([(apart * w + lead, apart * w + 16 + lead, 16 * w) for w in words],
                     np.int64)
    run_and_check(apart * len(words), table, 0, threads=threads)


def test_a_block_copies_one_chunk_and_makes_one_global_atomic():
    """Moves cut into 64-byte chunks on the source's words: one block (and
    one atomic) a chunk, none for a move of no bytes."""
    table = np.array([[0, 0, 64],             # one chunk
                      [64, 100, 0],           # no bytes: no chunk, still a move
                      [72, 200, 130],         # 8 bytes into a word: chunks of 56, 64, 10
                      [300, 400, 16]], np.int64)
    atomics = run_and_check(1024, table, 1, threads=4, chunk=64, target_chunks=1 << 20)
    assert sorted(atomics) == [(0, (b, 0, 0)) for b in range(5)]


@pytest.mark.parametrize("grid, least", [(2, 5), (3, 7)])
def test_the_spare_rows_that_fill_a_grid_up_copy_and_count_nothing(grid, least):
    """A GPU that holds fewer blocks than a launch must have: the blocks
    that copy are one row, the rows above it only fill the grid up; the
    counters are added once, by the first row."""
    table = np.array([[0, 512, 64], [72, 600, 130], [300, 800, 200]], np.int64)
    atomics = run_and_check(1024, table, 1, threads=4, chunk=64, target_chunks=1 << 20,
                            grid=grid, least=least)
    assert sorted(atomics) == [(0, (b, 0, 0)) for b in range(grid)]


@pytest.mark.parametrize("chunks, resident, grid", [
    (0, None, (1, 128)), (1, None, (1, 128)), (127, None, (127, 2)), (4096, None, (4096, 1)),
    (4096, 1056, (1056, 1)), (100, 1056, (100, 2)), (888, 112, (112, 2)), (888, 96, (96, 2)),
    (50, 96, (50, 3))])
def test_a_launch_has_at_least_min_blocks_and_no_more_copying_blocks_than_resident(
        chunks, resident, grid):
    assert kernels.launch_config(chunks, resident) == (grid, kernels.THREADS)


@pytest.mark.parametrize("grid", [1, 2, 3])
def test_a_grid_smaller_than_the_chunks_strides_over_them_with_one_atomic_a_block(grid):
    """Fewer blocks than chunks (a GPU's launch holds no more than its
    resident blocks): block b copies chunks b, b + grid, ..., every byte
    lands, and each block adds its chunks' bytes with one atomic."""
    table = np.array([[0, 512, 64], [72, 600, 130], [300, 800, 200], [4, 1000, 3]], np.int64)
    chunks = 1 + 3 + 4 + 1          # 64; 56, 64, 10; 52, 64, 64, 20 (on source words); 3
    atomics = run_and_check(1024, table, 1, threads=4, chunk=64, target_chunks=1 << 20, grid=grid)
    assert sorted(atomics) == [(0, (b, 0, 0)) for b in range(min(grid, chunks))]


def test_many_moves_take_several_launches_and_uploads():
    """More moves than a launch holds, and more launches than an upload
    holds: the counters still add up."""
    table = np.array([(48 * i, 48 * i + 7, 40) for i in range(200)], np.int64)
    uploads = kernels.launch_tables([((0, 9600), (0, 9600), table)], 1, chunk=16,
                                    capacity=kernels.HEADER + 30 * kernels.ROW)
    assert len(uploads) == 7 and all(len(launches) == 1 for _, launches in uploads)
    atomics = run_and_check(9600, table, 1, threads=3, chunk=16,
                            capacity=kernels.HEADER + 30 * kernels.ROW)
    assert len(atomics) == 600                  # 40 bytes a move: 3 chunks of up to 16


@st.composite
def phases_between_segments(draw):
    """Segments at 16-byte-aligned addresses of one address space, gaps
    between them, and one phase of moves between any of them: sources from
    each segment's first half, destinations packed into second halves
    (no destination overlaps another or any source)."""
    segments, address = [], 16 * draw(st.integers(1, 8))
    for _ in range(draw(st.integers(1, 5))):
        size = 32 * draw(st.integers(4, 16))
        segments.append((address, size))
        address += size + 16 * draw(st.integers(0, 8))
    space = address + 64
    src_at = [0] * len(segments)
    dst_at = [size // 2 for _, size in segments]
    batches = {}
    for _ in range(draw(st.integers(0, 12))):
        i = draw(st.integers(0, len(segments) - 1))
        j = draw(st.integers(0, len(segments) - 1))
        length = draw(st.integers(0, 60))
        src = src_at[i] + draw(st.integers(0, 7))
        if src + length > segments[i][1] // 2 or dst_at[j] + length > segments[j][1]:
            continue
        batches.setdefault((j, i), []).append((src, dst_at[j], length))
        src_at[i], dst_at[j] = src + length, dst_at[j] + length + draw(st.integers(0, 5))
    return space, [(segments[j], segments[i], np.array(rows, np.int64))
                   for (j, i), rows in batches.items()]


@settings(max_examples=60, deadline=None)
@given(case=phases_between_segments(), threads=st.sampled_from([1, 8, 32]))
def test_one_launch_over_the_span_of_the_segments_copies_every_pairs_moves(case, threads):
    """A phase's batches (one per pair of segments) as one batch over the
    span of their segments, as CudaDevice.copy launches it: every byte as
    the pairs' own copies put it, nothing outside the moves written (the
    gaps between segments included), the counters exact."""
    space, batches = case
    memory = np.random.default_rng(space).integers(0, 256, space, dtype=np.uint8)
    expected = memory.copy()
    for (dst, _), (src, _), rows in batches:
        for s, d, n in rows.tolist():
            expected[dst + d:dst + d + n] = memory[src + s:src + s + n]
    if not batches:
        return
    (base, size), same, rows = kernels.phase_span(Phase.of_batches(batches))
    assert same == (base, size) and len(rows) == sum(len(b[2]) for b in batches)
    span = memory[base:base + size]
    counters = np.zeros(kernels.COUNTERS, np.int64)
    kernels.simulated_copy(span, span, rows, counters, 1, threads=threads, chunk=16)
    np.testing.assert_array_equal(memory, expected)
    assert counters[kernels.BYTES_MOVED] == rows[:, 2].sum()
    assert counters[kernels.BLOCKS_MOVED] == len(rows)


@settings(max_examples=60, deadline=None)
@given(case=phases_between_segments())
def test_a_phase_of_batches_gives_back_one_batch_a_pair_of_segments_in_address_order(case):
    """Phase.of_batches then Phase.batches: every move once, in a batch of
    its own pair of segments, the pairs in (destination, source) address
    order and a pair's moves in the order given."""
    _, batches = case
    phase = Phase.of_batches(batches)
    assert len(phase.moves) == sum(len(rows) for _, _, rows in batches)
    back = phase.batches()
    pairs = [(dst, src) for dst, src, _ in back]
    assert pairs == sorted(set(pairs))
    given_rows = {(dst, src): rows.tolist() for dst, src, rows in batches if len(rows)}
    assert {(dst, src): rows.tolist() for dst, src, rows in back} == given_rows


def test_the_span_refuses_moves_outside_their_segments_and_unaligned_segments():
    def span(*batches):
        return kernels.phase_span(Phase.of_batches(batches))

    good = ((4096, 256), (1024, 256), np.array([[0, 0, 16]], np.int64))
    # the phase's move 1: source 1024 + 250, destination 4096, 16 bytes
    with pytest.raises(ValueError, match=r"move 1 \(1274, 4096, 16\).*within its segments "
                                         r"\(\(1024, 256\) and \(4096, 256\)"):
        span(good, ((4096, 256), (1024, 256), np.array([[250, 0, 16]])))
    with pytest.raises(ValueError, match="multiples of 16, got 0x408"):
        span(good, ((1032, 256), (4096, 256), np.array([[0, 0, 16]])))
    # a move past its destination's end (an empty batch between), one before its
    # source, one of a negative length
    empty = ((4096, 256), (1024, 256), np.empty((0, 3), np.int64))
    with pytest.raises(ValueError, match=r"move 2 \(1024, 4346, 16\).*\(4096, 64\)"):
        span(good, empty, ((4096, 64), (1024, 256), np.array([[0, 0, 16], [0, 250, 16]])))
    with pytest.raises(ValueError, match=r"move 1 \(1008, 4096, 16\)"):
        span(good, ((4096, 256), (1024, 256), np.array([[-16, 0, 16]])))
    with pytest.raises(ValueError, match=r"move 1 \(1024, 4096, -1\)"):
        span(good, ((4096, 256), (1024, 256), np.array([[0, 0, -1]])))
    with pytest.raises(ValueError, match="at least one move"):
        span(empty)


def test_aligned_words_go_through_load16_and_edges_byte_by_byte(monkeypatch):
    """An equally aligned move loads its middle as 16-byte words; a move
    whose source and destination differ in alignment loads none."""
    loaded = []
    load = kernels.load16
    monkeypatch.setattr(kernels, "load16", lambda a, o: loaded.append(o) or load(a, o))
    src = np.arange(256, dtype=np.uint8)
    dst = np.zeros(256, dtype=np.uint8)
    counters = np.zeros(kernels.COUNTERS, np.int64)
    kernels.simulated_copy(dst, src, np.array([[1, 129, 72]]), counters, 0, threads=2)
    assert sorted(loaded) == [16, 32, 48]              # 15 head bytes, 3 words, 9 tail bytes
    assert list(dst[129:201]) == list(range(1, 73))
    loaded.clear()
    kernels.simulated_copy(dst, src, np.array([[0, 1, 100]]), counters, 0, threads=2)
    assert loaded == [] and list(dst[1:101]) == list(range(100))


@pytest.mark.parametrize("offset", [-16, 8, 1024 - 8, 1024])
def test_the_simulated_word_access_checks_bounds_and_alignment(offset):
    array = np.zeros(1024, np.uint8)
    with pytest.raises(IndexError, match="multiple of 16"):
        kernels.load16(array, offset)
    with pytest.raises(IndexError, match="multiple of 16"):
        kernels.store16(array, offset, np.zeros(16, np.uint8))


def test_a_move_outside_its_segment_is_refused_before_anything_runs():
    src = np.arange(256, dtype=np.uint8)
    dst = np.zeros(256, dtype=np.uint8)
    counters = np.zeros(kernels.COUNTERS, np.int64)
    table = np.array([[0, 0, 16], [200, 0, 100]], np.int64)
    with pytest.raises(ValueError, match=r"batches\[0\]: move 1 \(200, 0, 100\).*within"):
        kernels.simulated_copy(dst, src, table, counters, 1)
    assert not dst.any() and not counters.any()
    with pytest.raises(ValueError, match="positive multiple of 16"):
        kernels.launch_tables([], 0, chunk=24)


def test_chunks_are_sized_for_the_target_and_cut_on_source_words():
    MiB = 1 << 20
    table = np.array([[5, 5, 64 * MiB], [64 * MiB + 16, 3, 512]], np.int64)
    ((words, launches),) = kernels.launch_tables([((0, 128 * MiB), (0, 128 * MiB), table)], 1)
    (_, at, chunks), = launches
    header = words[at - kernels.TABLE:][:kernels.HEADER]
    size = header[kernels.SIZE]
    assert size % kernels.CHUNK == 0 and size >= 64 * MiB // kernels.TARGET_CHUNKS
    rows = words[at - kernels.TABLE + kernels.HEADER:].reshape(-1, kernels.ROW)
    # the first move starts 5 bytes into a word: its chunks end on the source's words
    assert rows[0, 3] == 0 and rows[1, 3] == -(-(5 + 64 * MiB) // size) == chunks - 1
    assert tuple(header[[kernels.ROWS, kernels.FIRST, kernels.CHUNKS]]) == (2, 1, chunks)


def two_atomics(out):
    shared = cuda.shared.array(1, np.int64)
    shared[0] = 0
    cuda.atomic.add(shared, 0, 1)
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(out, 0, 1)
        cuda.atomic.max(out, 1, cuda.blockIdx.x)


def test_the_simulator_counter_counts_every_global_atomic_of_a_block():
    """atomics_per_block counts what kernels do: two global atomics a block
    here (and none on a shared array)."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    out = np.zeros(2, np.int64)
    atomics = inspection.atomics_per_block(lambda: FakeCUDAKernel(two_atomics, False)[3, 4](out))
    assert atomics == {(0, (0, 0, 0)): 2, (0, (1, 0, 0)): 2, (0, (2, 0, 0)): 2}
    assert list(out) == [3, 2]
