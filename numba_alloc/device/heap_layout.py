"""The device heap's layout: the constants that place its bookkeeping in
``meta`` (int64) and pack a page's word, the default size classes, and the
size of ``meta`` for a heap (plain Python: the device code, the host object
and the counter reader share them)."""

PAGE = 1 << 16                      # bytes per page
MIN_BLOCK = 16                      # the smallest class size, and the alignment
MAX_CLASSES = 64                    # size classes a heap may have
LARGE = MAX_CLASSES                 # the class index of page runs (above the largest class)
BITS = 32                           # blocks per bitmap word (low 32 bits of an int64)
FULL_WORD = (1 << BITS) - 1
WORDS_PER_PAGE = PAGE // MIN_BLOCK // BITS

# meta[0:HEADER]: counters, the class sizes and a page hint per class
BYTES_IN_USE, PEAK_BYTES_IN_USE, NUM_INVALID_FREES = range(3)
NUM_CLASSES = 6                     # how many size classes this heap has
RUN_HINT = 7                        # where the last page run ended: the next search starts there
CLASS_BASE = 8                      # per class, then for LARGE: the fields below
# CLASS_ALLOCS: for a size class, its allocations no longer in a page's word
# (moved there when a page changes class or its grants field is flushed); for
# LARGE, its allocations. CLASS_FREES: LARGE only. CLASS_FAILED: failed mallocs.
CLASS_ALLOCS, CLASS_FREES, CLASS_FAILED = range(3)
CLASS_FIELDS = 3
HINT_BASE = CLASS_BASE + CLASS_FIELDS * (MAX_CLASSES + 1)   # per class: a page to look at first
SIZE_BASE = HINT_BASE + MAX_CLASSES                         # per class: its block size
HEADER = 512
assert SIZE_BASE + MAX_CLASSES <= HEADER

# meta[HEADER + page]: the page's word, state * STATE_UNIT + grants * GRANT_UNIT
# + count. state: a class index while the page serves that class (it keeps
# it when empty), UNASSIGNED, or LARGE while a run owns it; count: the blocks
# reserved (in use, or about to be); grants: blocks granted since the page took
# its class (less what was flushed to CLASS_ALLOCS): a class's allocations
# are CLASS_ALLOCS plus the grants of its pages. One atomic on this word
# reserves blocks, checks the state and counts the allocations.
UNASSIGNED = -1
COUNT_BITS = 24                     # above the most blocks a page has plus those being backed off
COUNT_MASK = (1 << COUNT_BITS) - 1
GRANT_SHIFT = COUNT_BITS
GRANT_UNIT = 1 << GRANT_SHIFT
GRANT_BITS = 30
GRANT_MASK = (1 << GRANT_BITS) - 1
GRANT_FLUSH = 1 << (GRANT_BITS - 2)     # moved to CLASS_ALLOCS once grants reach twice that
STATE_SHIFT = GRANT_SHIFT + GRANT_BITS
STATE_UNIT = 1 << STATE_SHIFT           # states from -512 to 511 fit the 10 bits left
RESERVE_UNIT = GRANT_UNIT + 1           # a block reserved and granted
# meta[HEADER + pages + page]: at a run's first page, its length in pages
# (0 elsewhere, and once freed); then per page a bitmap of WORDS_PER_PAGE words


def page_fitted(size):
    """The largest multiple of MIN_BLOCK with as many blocks per page as
    ``size`` (a multiple of MIN_BLOCK, at most PAGE): ``size`` or more."""
    return PAGE // (PAGE // size) // MIN_BLOCK * MIN_BLOCK


def spaced_classes(per_octave, largest):
    """Size classes: every multiple of MIN_BLOCK up to ``per_octave`` of them,
    then ``per_octave`` a doubling, evenly spaced (jemalloc's spacing), up
    to ``largest`` (MIN_BLOCK x ``per_octave`` x a power of two), each
    :func:`page_fitted`; ascending, without repeats."""
    sizes = list(range(MIN_BLOCK, MIN_BLOCK * per_octave + 1, MIN_BLOCK))
    while sizes[-1] < largest:
        step = sizes[-1] // per_octave
        sizes += [sizes[-1] + step * i for i in range(1, per_octave + 1)]
    return tuple(sorted({page_fitted(size) for size in sizes}))


# 54 classes, 16 B ... 8 KiB: above 128 B a request is rounded up by under
# 17% (an eighth, but page fitting widens a gap: 4672 to 5456 bytes); of the
# bytes handed out for log-uniform requests, 4.5% are rounding (27% with
# power-of-two classes); a page's blocks leave under 16 B per block unused
DEFAULT_CLASSES = spaced_classes(8, 8192)


def meta_size(pages):
    """int64 entries of meta for a heap of ``pages`` pages."""
    return HEADER + 2 * pages + pages * WORDS_PER_PAGE
