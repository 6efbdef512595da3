"""Whether plain data read from a file is a snapshot a pool could have
written (:func:`numba_alloc.dump_snapshot`'s), checked before a report
reads it: :func:`check_snapshot`.

A pool writes each segment, block and device heap of its snapshot (and
their lists) once, so the check refuses data that holds one of them in two
places: a small pickle can repeat a list of blocks in every segment and
grow, read, to hundreds of millions of blocks. Every part the summary
reads must be what a pool writes: sizes and addresses ints (never a float,
NaN or a bool), sizes above 0, each segment's blocks adding up to its
size, counters ints >= 0. The check stops at the first part repeated, so
it takes time linear in the file's size (the parts it does not read, such
as ``device_traces``, may share lists: a pool's trace entries share their
frames).
"""

from numbers import Integral

_STATES = ("active_allocated", "active_pending_free", "inactive")
_SEGMENT_TYPES = ("large", "small")


def check_snapshot(data) -> None:
    """Return if ``data`` (a dict read from a snapshot file) could have
    been written by a pool, else raise ValueError saying what no pool
    writes (``where: what``)."""
    once = _Once()
    stats = _dict(data, "stats", "")
    for key in stats:
        _count(stats, key, "stats")
    segments = once(_list(data, "segments", ""), "segments")
    for i in range(len(segments)):
        _segment(once(_dict(segments, i, "segments"), f"segments[{i}]"), f"segments[{i}]", once)
    heaps = once(_list(data, "device_heaps", ""), "device_heaps") if "device_heaps" in data else []
    for i in range(len(heaps)):
        where = f"device_heaps[{i}]"
        heap = once(_dict(heaps, i, "device_heaps"), where)
        _heap(heap, where, once)
    if data.get("nrt_heap") is not None:
        _heap(once(_dict(data, "nrt_heap", ""), "nrt_heap"), "nrt_heap", once)


class _Once:
    """Calling it with a container and its place: the container, or
    ValueError when it was given before (reached in two places)."""

    def __init__(self):
        self.seen = set()       # ids of the containers given, all alive in the data

    def __call__(self, container, where):
        if id(container) in self.seen:
            raise ValueError(f"{where} is the same {type(container).__name__} as another part "
                             "(a pool writes each segment, block and heap once)")
        self.seen.add(id(container))
        return container


def _segment(segment, where, once):
    _count(segment, "address", where)
    total = _size(segment, "total_size", where)
    _one_of(segment, "segment_type", where, _SEGMENT_TYPES)
    blocks = once(_list(segment, "blocks", where), f"{where}['blocks']")
    covered = 0
    for j in range(len(blocks)):
        block = once(_dict(blocks, j, f"{where}['blocks']"), f"{where}['blocks'][{j}]")
        covered += _size(block, "size", f"{where}['blocks'][{j}]")
        _one_of(block, "state", f"{where}['blocks'][{j}]", _STATES)
    if covered != total:
        raise ValueError(f"{where}: its blocks add up to {covered} bytes, not its total_size "
                         f"{total}")


def _heap(heap, where, once):
    _count(heap, "address", where)
    _size(heap, "size", where)
    classes = once(_dict(heap, "classes", where), f"{where}['classes']")
    for name in classes:
        size_class = once(_dict(classes, name, f"{where}['classes']"),
                          f"{where}['classes'][{name!r}]")
        for key in ("live_blocks", "bytes_in_use"):
            _count(size_class, key, f"{where}['classes'][{name!r}]")


def _name(where, key):
    """How a message names ``container[key]`` of the part named ``where``."""
    return f"{where}[{key!r}]" if where else str(key)


def _get(container, key, where):
    """``container[key]``; ValueError saying it is missing."""
    try:
        return container[key]
    except KeyError:
        raise ValueError(f"{where or 'it'} has no {key!r}") from None


def _count(container, key, where):
    value = _get(container, key, where)
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{_name(where, key)} is {value!r}, not an int >= 0")
    return value


def _size(container, key, where):
    value = _count(container, key, where)
    if value == 0:
        raise ValueError(f"{_name(where, key)} is 0, not a size above 0")
    return value


def _one_of(container, key, where, allowed):
    value = _get(container, key, where)
    if value not in allowed:
        raise ValueError(f"{_name(where, key)} is {value!r}, not one of {', '.join(allowed)}")


def _dict(container, key, where):
    value = _get(container, key, where)
    if not isinstance(value, dict):
        raise ValueError(f"{_name(where, key)} is a {type(value).__name__}, not a dict")
    return value


def _list(container, key, where):
    value = _get(container, key, where)
    if not isinstance(value, list):
        raise ValueError(f"{_name(where, key)} is a {type(value).__name__}, not a list")
    return value
