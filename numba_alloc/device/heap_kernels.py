"""The device heap's device code: malloc, malloc_warp, free and view inside
kernels.

Every function here is a device function (:func:`warp.device_function`)
over two arrays, the heap's bytes ``data`` (uint8) and its bookkeeping
``meta`` (int64), laid out as :mod:`heap_layout` and
:mod:`numba_alloc.plugin.device_heap` describe. On a GPU, ``heap.malloc``,
``heap.malloc_warp``, ``heap.free`` and ``heap.view`` are methods of the
Numba extension type :class:`DeviceHeapType` that call them; under the
CUDA simulator the host object's methods call them as Python, on NumPy
arrays, with the simulator's atomics. The same source runs both ways.
"""

from numba import cuda

from .heap_layout import (BITS, BYTES_IN_USE, CLASS_ALLOCS, CLASS_BASE, CLASS_FAILED,
                          CLASS_FIELDS, CLASS_FREES, COUNT_MASK, FULL_WORD, GRANT_FLUSH,
                          GRANT_MASK, GRANT_SHIFT, GRANT_UNIT, HEADER, HINT_BASE, LARGE,
                          MIN_BLOCK, NUM_INVALID_FREES, PAGE, PEAK_BYTES_IN_USE,
                          RESERVE_UNIT, RUN_HINT, SIZE_BASE, STATE_SHIFT, STATE_UNIT, UNASSIGNED,
                          WORDS_PER_PAGE)
from .heap_search import class_of, search_page
from .heap_simulator import WARP, SimulatorCuda
from .warp import SIMULATOR, group_bits, lowest_bits, nth_bit, warp_scan
from .warp import device_function as _device

TAKE_TRIES = 4                      # reads of a page word whose cas another thread won
TICKET_SHIFT = 8                    # _reserve: the blocks reserved | the page's before them << 8
TICKET_MASK = (1 << TICKET_SHIFT) - 1


def _relaxed_load_intrinsic():
    """``load(array, index)``: array[index] of an int64 array as a relaxed
    load at GPU scope (``ld.relaxed.gpu``), for words other threads change
    with atomics: a plain load may be served from an SM's L1 cache, which
    other SMs' writes do not update."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.core.extending import intrinsic

    @intrinsic
    def load(typingctx, array, index):
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, signature.args[0], ary,
                                               [args[1]])
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), [pointer.type]),
                               "ld.relaxed.gpu.s64 $0, [$1];", "=l,l", side_effect=True)
            return builder.call(asm, [pointer])
        return types.int64(array, types.int64), codegen
    return load


if SIMULATOR:
    def _load(array, index):
        return array[index]
else:
    _load = _relaxed_load_intrinsic()


@_device
def _add_in_use(meta, nbytes):
    """Add ``nbytes`` (negative: bytes given back) to BYTES_IN_USE; after an
    addition, raise PEAK_BYTES_IN_USE to the new sum (so the peak is the
    largest value BYTES_IN_USE has held) with an atomic no thread waits for
    (reading the peak first cost a round trip to L2 while it rose)."""
    now = cuda.atomic.add(meta, BYTES_IN_USE, nbytes) + nbytes
    if nbytes > 0:
        cuda.atomic.max(meta, PEAK_BYTES_IN_USE, now)


@_device
def _move_grants(meta, state, seen):
    """A page whose word was ``seen`` (of class ``state``, or not a size
    class's) changed class: its grants go to the class's CLASS_ALLOCS."""
    if 0 <= state < LARGE:
        grants = (seen >> GRANT_SHIFT) & GRANT_MASK
        if grants > 0:
            cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * state + CLASS_ALLOCS, grants)


@_device
def _flush_grants(meta, k, at):
    """Keep the grants field of page word meta[at] (class ``k``) from
    overflowing: from 2 * GRANT_FLUSH up, GRANT_FLUSH of them go to the
    class's CLASS_ALLOCS (a ``cas``; when the word changed meanwhile, a later
    reservation tries again)."""
    seen = _load(meta, at)
    if seen >> STATE_SHIFT == k and (seen >> GRANT_SHIFT) & GRANT_MASK >= 2 * GRANT_FLUSH:
        if cuda.atomic.cas(meta, at, seen, seen - GRANT_FLUSH * GRANT_UNIT) == seen:
            cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * k + CLASS_ALLOCS, GRANT_FLUSH)


@_device
def _take_seen(meta, at, seen, word):
    """Set page word meta[at] from ``seen`` to ``word`` if ``seen`` is an
    empty page's: unassigned, or of a size class with no block reserved
    (whose grants go to that class's CLASS_ALLOCS). One ``cas``; whether
    it did (False also when the word was no longer ``seen``)."""
    state = seen >> STATE_SHIFT
    if seen & COUNT_MASK != 0 or state < UNASSIGNED or state >= LARGE:
        return False
    if cuda.atomic.cas(meta, at, seen, word) != seen:
        return False
    _move_grants(meta, state, seen)
    return True


@_device
def _take_empty(meta, at, word):
    """:func:`_take_seen` of the word as read now (a plain read first)."""
    return _take_seen(meta, at, _load(meta, at), word)


@_device
def _reserve(meta, k, at, want, capacity):
    """Reserve up to ``want`` blocks of class ``k`` on the page whose word
    is meta[at]: how many were reserved (0 when the page is full, owned by
    a run or in use by another class), plus, shifted by TICKET_SHIFT, the
    blocks reserved on the page before them: a ticket, the blocks after
    those being the ones whose bits are clear while the page fills. A page
    of class ``k``: one
    ``atomic.add`` on its word reserves them, counts them as allocations
    (its grants) and says whether the page still serves ``k`` (else it is
    undone); an empty page (unassigned, or of another class) is taken for
    ``k`` with one ``cas``. A ``cas`` that finds the word changed reads it
    again (up to TAKE_TRIES times): the warp that won it may have taken the
    page for ``k``, and then this one shares it, so that a crowd of warps
    reaching a fresh page at once fills it instead of passing it by."""
    seen = _load(meta, at)
    for _ in range(TAKE_TRIES):
        if seen >> STATE_SHIFT == k:
            break
        granted = min(want, capacity)
        if _take_seen(meta, at, seen, k * STATE_UNIT + granted * RESERVE_UNIT):
            return granted
        again = _load(meta, at)
        if again == seen:
            return 0            # not empty, and not ``k``'s
        seen = again
    if seen >> STATE_SHIFT != k or seen & COUNT_MASK >= capacity:
        return 0                # a plain read first: a full page costs no atomic
    old = cuda.atomic.add(meta, at, want * RESERVE_UNIT)
    used = old & COUNT_MASK
    if old >> STATE_SHIFT != k or used >= capacity:
        cuda.atomic.add(meta, at, -want * RESERVE_UNIT)
        return 0
    granted = min(want, capacity - used)
    if granted < want:          # the count stays above 0: we hold ``granted``
        cuda.atomic.add(meta, at, (granted - want) * RESERVE_UNIT)
    if (old >> GRANT_SHIFT) & GRANT_MASK >= 2 * GRANT_FLUSH:
        _flush_grants(meta, k, at)
    return granted | used << TICKET_SHIFT


@_device
def _claim_word(meta, base, words, last, w, bit, want):
    """Set up to ``want`` clear bits of one bitmap word of a page (its words
    at meta[base:base + words], the last one holding ``last`` blocks) with
    one ``atomic.or_``: with ``bit`` >= 0, word ``w``'s lowest bits from
    ``bit`` on, not read first (the reservation's ticket: while a page
    fills they are clear, and the ``or`` says which were); else the first
    word from ``w`` on with a clear bit as read. (the word, the bits this
    call set (0: other threads took them first), the word to look at
    next), or (-1, 0, w) when every word was full as read."""
    for i in range(words):
        at = (w + i) % words
        full = FULL_WORD
        if at == words - 1:
            full = (1 << last) - 1
        if bit >= 0:
            clear = full >> bit << bit
        else:
            clear = ~_load(meta, base + at) & full
        if clear != 0:
            pick = lowest_bits(clear, want)
            old = cuda.atomic.or_(meta, base + at, pick)
            after = at
            if bit >= 0 or ~(old | pick) & full == 0:     # (a ticket goes on in the next)
                after = (at + 1) % words
            return at, pick & ~old, after
    return -1, 0, w


@_device
def _take_bits(meta, pages, page, size, granted, peers, leader, rank, first):
    """The offset of the block of ``page`` (class blocks of ``size`` bytes)
    that the lane of ``rank`` (0 to ``granted`` - 1; -1: none) among those
    the page was reserved for gets, or -1. The group ``peers`` holds
    ``granted`` reservations of the page, so that many clear bits exist:
    its ``leader`` sets them, a bitmap word at a time (one ``atomic.or_``
    each: block ``first``'s bit and those after it in its word, the ticket
    :func:`_reserve` gave, without a read; then the clear bits as read),
    and hands each word's bits out by rank (``shfl_sync``). It tries until
    it has them all: a free clears its bit
    before its page's count drops and a malloc reserves before it sets
    bits, so there are never fewer clear bits than reservations not yet
    served (once a free's two atomics are both seen: until then the bits
    look taken and the leader tries again). A try that finds none lost to
    a thread that took a bit: threads that keep freeing and taking blocks
    of the page can win every race, so the tries are bounded (each block
    taken twice over); bits not found by then give their reservations
    back, and those lanes get -1 (counted as failed: moving them on to
    another page cost the malloc 8 registers a thread, a third of its
    occupancy)."""
    capacity = PAGE // size
    words = (capacity + BITS - 1) // BITS
    last = capacity - (words - 1) * BITS
    base = HEADER + 2 * pages + page * WORDS_PER_PAGE
    w = first // BITS
    bit = first % BITS
    served = 0
    off = -1
    for _ in range(2 * capacity + words):
        at = -1
        got = 0
        if cuda.laneid == leader:
            at, got, w = _claim_word(meta, base, words, last, w, bit, granted - served)
            bit = -1
        at = cuda.shfl_sync(peers, at, leader)
        got = cuda.shfl_sync(peers, got, leader)
        if at < 0:
            continue            # every word full as read: bits freed meanwhile
        n = cuda.popc(got)
        if served <= rank < served + n:
            off = page * PAGE + (at * BITS + nth_bit(got, rank - served)) * size
        served += n
        if served == granted:
            break
    if served < granted and cuda.laneid == leader:     # the reservations (and grants) back
        cuda.atomic.add(meta, HEADER + page, (served - granted) * RESERVE_UNIT)
    return off


@_device
def _malloc_small(meta, pages, k, peers, salt):
    """malloc for the lanes ``peers`` of a warp, which all ask for class
    ``k``: the lowest lane reserves blocks for all of them, a page at a
    time (one atomic per page instead of one per thread), and takes their
    bits (:func:`_take_bits`: one atomic per bitmap word), handing blocks
    out by lane order; it counts the group's failures (the reservations
    counted its allocations). The leader tries the pages in
    :func:`heap_search.search_page`'s order (``salt``: the warp's index in
    the grid), and takes the bits its reservation names first. A leader
    that reserves past the hint's page makes that page the hint, unless
    another warp moved it meanwhile (a plain read and store: a late warp
    seldom moves it back, and a hint is only where the search starts)."""
    size = meta[SIZE_BASE + k]
    capacity = PAGE // size
    lane = cuda.laneid
    leader = cuda.ffs(peers) - 1
    me = 1 << lane
    remaining = peers & FULL_WORD   # match_any_sync gives an int32: no sign extension
    start = _load(meta, HINT_BASE + k)
    cursor = 0                  # pages the leader is done with
    off = -1
    for _ in range(WARP + 1):   # each round serves at least one lane, or ends
        page = -1
        reserved = 0
        if lane == leader:
            want = cuda.popc(remaining)
            while cursor < pages and reserved == 0:
                page = search_page(pages, capacity, start, cursor, salt)
                reserved = _reserve(meta, k, HEADER + page, want, capacity)
                if reserved & TICKET_MASK < want:
                    cursor += 1
            if reserved == 0:
                page = -1
            elif page != start and _load(meta, HINT_BASE + k) == start:
                meta[HINT_BASE + k] = page
        page = cuda.shfl_sync(peers, page, leader)
        reserved = cuda.shfl_sync(peers, reserved, leader)
        granted = reserved & TICKET_MASK
        if page < 0:
            break
        rank = cuda.popc(remaining & (me - 1))
        mine = (remaining & me) != 0 and rank < granted
        got = _take_bits(meta, pages, page, size, granted, peers, leader, rank if mine else -1,
                         reserved >> TICKET_SHIFT)
        if mine:
            off = got
        remaining &= ~lowest_bits(remaining, granted)
        if remaining == 0:
            break
    done = cuda.ballot_sync(peers, off >= 0)
    if lane == leader:
        failed = cuda.popc(peers) - cuda.popc(done)
        if failed > 0:
            cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * k + CLASS_FAILED, failed)
    return off


@_device
def _malloc_large(meta, pages, nbytes):
    """A run of whole pages: take the words of consecutive empty pages
    (:func:`_take_empty`) for LARGE, rolling back on the first busy page
    (those taken become UNASSIGNED); from the run hint to the end, then
    from the start. Counts the allocation (or the failure) and its bytes."""
    failed = CLASS_BASE + CLASS_FIELDS * LARGE + CLASS_FAILED
    if nbytes > pages * PAGE:           # (also keeps need below from overflowing)
        cuda.atomic.add(meta, failed, 1)
        return -1
    need = (nbytes + PAGE - 1) // PAGE
    start = _load(meta, RUN_HINT)
    if start < 0 or start + need > pages:
        start = 0
    s = start
    end = pages
    for _ in range(2):
        while s + need <= end:
            got = 0
            for j in range(need):
                if not _take_empty(meta, HEADER + s + j, LARGE * STATE_UNIT):
                    break
                got += 1
            if got == need:
                cuda.atomic.exch(meta, HEADER + pages + s, need)    # its length: freeable
                meta[RUN_HINT] = s + need
                cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * LARGE + CLASS_ALLOCS, 1)
                _add_in_use(meta, need * PAGE)
                return s * PAGE
            for j in range(got):
                # (an addition: keeps what a reservation backing off added meanwhile)
                cuda.atomic.add(meta, HEADER + s + j, (UNASSIGNED - LARGE) * STATE_UNIT)
            s += got + 1
        if start == 0:
            break
        s, end = 0, min(pages, start + need - 1)    # runs that start before the hint
    cuda.atomic.add(meta, failed, 1)
    return -1


@_device
def heap_malloc(data, meta, nbytes):
    """A 16-byte-aligned byte offset of ``nbytes`` free bytes of the heap,
    or -1 (counted as a failure of its class) when none is free or
    ``nbytes`` < 0. The lanes of a warp that call it together and ask for
    the same class share the reservation atomic and the bitmap words'
    atomics; one lane of them all adds their bytes to BYTES_IN_USE."""
    pages = data.size // PAGE
    k = LARGE
    if nbytes >= 0:
        k = class_of(meta, nbytes)
    lane = cuda.laneid
    active = cuda.activemask()
    peers = cuda.match_any_sync(active, k)
    off = -1
    units = 0                   # 16-byte units of a small block this lane got
    if k < LARGE:
        off = _malloc_small(meta, pages, k, peers, cuda.grid(1) // WARP)
        if off >= 0:
            units = meta[SIZE_BASE + k] // MIN_BLOCK
    elif nbytes < 0:
        cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * LARGE + CLASS_FAILED, 1)
    else:
        off = _malloc_large(meta, pages, nbytes)
    _, total = warp_scan(active, units)
    if total > 0 and lane == cuda.ffs(active) - 1:
        _add_in_use(meta, total * MIN_BLOCK)
    return off


@_device
def _malloc_alone(meta, pages, nbytes, salt):
    """malloc of ``nbytes`` >= 0 by this lane alone, its bytes in use counted."""
    k = class_of(meta, nbytes)
    if k == LARGE:
        return _malloc_large(meta, pages, nbytes)
    off = _malloc_small(meta, pages, k, 1 << cuda.laneid, salt)
    if off >= 0:
        _add_in_use(meta, meta[SIZE_BASE + k])
    return off


@_device
def heap_malloc_warp(data, meta, nbytes):
    """One allocation for the lanes of a warp that call this together
    (``activemask``): each lane's ``nbytes`` rounded up to 16 bytes, laid
    out in lane order (the offsets from a warp scan of the sizes) in one
    block that the lowest lane mallocs: one reservation, one bitmap word
    and one update of the bytes in use for the warp. (this lane's byte
    offset, 16-byte aligned; whether this lane holds the block's start:
    the one lane that frees the block, with ``free(offset)``). (-1, False)
    on every lane when the block could not be had (one failed malloc of its
    class counted), and on a lane asking ``nbytes`` < 0 (a failed malloc
    counted, as malloc counts it; the others are served without it)."""
    pages = data.size // PAGE
    lane = cuda.laneid
    active = cuda.activemask()
    units = 0
    if nbytes >= 0:             # (capped above the heap: the sum cannot overflow)
        units = min(nbytes // MIN_BLOCK + (nbytes % MIN_BLOCK != 0),
                    pages * (PAGE // MIN_BLOCK) + 1)
    asking = cuda.ballot_sync(active, nbytes >= 0) & FULL_WORD
    prefix, total = warp_scan(active, units)
    leader = cuda.ffs(asking) - 1
    base = -1
    if lane == leader:
        base = _malloc_alone(meta, pages, total * MIN_BLOCK, cuda.grid(1) // WARP)
    if lane == cuda.ffs(active) - 1 and asking != active:
        refused = cuda.popc(active & ~asking)
        cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * LARGE + CLASS_FAILED, refused)
    if asking != 0:
        base = cuda.shfl_sync(active, base, leader)
    if base < 0 or nbytes < 0:
        return -1, False
    return base + prefix * MIN_BLOCK, lane == leader


@_device
def heap_free(data, meta, off):
    """Give back the allocation at byte offset ``off``; -1 is ignored. An
    offset that is not the start of a live allocation is counted in
    NUM_INVALID_FREES and otherwise ignored (as far as it is recognised:
    freeing memory that is not yours is not supported). A free's bytes
    come off BYTES_IN_USE before its block is free for another malloc, so
    the peak never counts a block twice: one lane of the warp takes off
    the bytes of every block the warp's lanes free (a small block's, when
    its offset is a block's start), the memory fence orders that before
    the bits; then the lanes freeing blocks of one bitmap word clear their
    bits with one ``atomic.and_`` (a bit found clear, or freed by a lower
    lane of the group too, is a block not live: its bytes go back, raising
    the peak as a malloc's do, an invalid free), and the lanes that free
    blocks of one page together drop its count with one atomic."""
    if off == -1:
        return
    pages = data.size // PAGE
    page = -1                   # the small page of the block freed
    units = 0                   # its 16-byte units
    at = 0                      # its bitmap word (0: none)
    bit = 0                     # its bit there
    invalid = True
    if 0 <= off < pages * PAGE:
        p = off // PAGE
        state = _load(meta, HEADER + p) >> STATE_SHIFT
        if 0 <= state < LARGE:
            size = meta[SIZE_BASE + state]
            rel = off - p * PAGE
            if rel % size == 0:
                block = rel // size
                bit = block % BITS
                at = HEADER + 2 * pages + p * WORDS_PER_PAGE + block // BITS
                page = p                # the bit's atomic below decides
                units = size // MIN_BLOCK
        elif state == LARGE and off == p * PAGE and _load(meta, HEADER + pages + p) > 0:
            need = cuda.atomic.exch(meta, HEADER + pages + p, 0)
            if need > 0:        # (0: another thread freed it first)
                invalid = False
                _add_in_use(meta, -need * PAGE)
                cuda.threadfence()
                for j in range(need):
                    cuda.atomic.add(meta, HEADER + p + j, (UNASSIGNED - LARGE) * STATE_UNIT)
                cuda.atomic.add(meta, CLASS_BASE + CLASS_FIELDS * LARGE + CLASS_FREES, 1)
    lane = cuda.laneid
    active = cuda.activemask()
    _, total = warp_scan(active, units)
    if lane == cuda.ffs(active) - 1 and total > 0:
        _add_in_use(meta, -total * MIN_BLOCK)
        cuda.threadfence()
    cuda.syncwarp(active)
    word_peers = cuda.match_any_sync(active, at)
    if units > 0:
        bits, repeated = group_bits(word_peers, bit)
        first = cuda.ffs(word_peers) - 1
        old = 0
        if lane == first:
            old = cuda.atomic.and_(meta, at, ~bits & FULL_WORD)
        old = cuda.shfl_sync(word_peers, old, first)
        if old & (1 << bit) != 0 and not repeated:
            invalid = False
        else:                   # not live (freed before, or by another thread first)
            _add_in_use(meta, units * MIN_BLOCK)    # a malloc meanwhile counted without them
            page = -1
    peers = cuda.match_any_sync(active, page)
    if page >= 0 and lane == cuda.ffs(peers) - 1:
        cuda.atomic.add(meta, HEADER + page, -cuda.popc(peers))
    bad = cuda.popc(cuda.ballot_sync(active, invalid))
    if lane == cuda.ffs(active) - 1 and bad > 0:
        cuda.atomic.add(meta, NUM_INVALID_FREES, bad)


@_device
def view_bounds(size, off, count, itemsize):
    """(first byte, items) of ``heap.view(off, count, dtype)`` over a heap of
    ``size`` bytes: the bytes [off, off + count * itemsize) clipped to the
    heap, whole items only; none for a negative ``off`` (a failed malloc's
    -1, whatever ``count``)."""
    if off < 0:
        return 0, 0
    start = min(off, size)
    stop = min(max(off + count * itemsize, start), size)
    return start, (stop - start) // itemsize


if SIMULATOR:
    cuda = SimulatorCuda()          # noqa: F811 (the device functions' ``cuda``)
