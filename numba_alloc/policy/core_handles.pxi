# The handles the core hands out, and malloc's and free's fast paths, which
# make and retire them in one call each. Included by _core.pyx, after the
# entry points (it uses _take and _release).


cdef class Block:
    """The handle :meth:`Pool.malloc` returns for a block.

    ``address`` (int; it changes when defragmentation moves the block),
    ``size`` (bytes requested; ``requested_size`` is PyTorch's name for it)
    and ``allocated_size`` (bytes reserved for it, a multiple of 512; a
    snapshot's block ``size`` is this one, as in PyTorch's). ``address`` and
    ``allocated_size`` are read from the pool's core until a value is kept
    in the handle: the pool keeps both when it frees, reclaims or resets
    the block; so a dead handle keeps the values it had, and a copy of a
    handle those of when it was made. ``state``
    is ALLOCATED, then PENDING once freed, then DEAD once its bytes are
    reusable; ``pinned`` counts the reasons the block must not move (see
    Pool.pin); ``segment`` is the :class:`Segment` holding a live block
    (None once dead). Those three are read from the pool's core. A handle
    is never handed out twice, so a stale one is always recognised.
    """

    cdef public object size, pool
    cdef public int64_t _ticket
    # None while read from the core
    cdef public object _address, _allocated_size
    cdef object __weakref__

    @property
    def address(self):
        if self._address is None:
            return _view(self.pool._p)[TABLE + (self._ticket & ROW_MASK) * NF + ADDR]
        return self._address

    @address.setter
    def address(self, address):
        self._address = address

    @property
    def allocated_size(self):
        if self._allocated_size is None:
            return _view(self.pool._p)[TABLE + (self._ticket & ROW_MASK) * NF + SIZE]
        return self._allocated_size

    @allocated_size.setter
    def allocated_size(self, allocated_size):
        self._allocated_size = allocated_size

    @property
    def requested_size(self):
        return self.size

    @property
    def state(self):
        return self.pool.state_of(self)

    @property
    def pinned(self):
        return self.pool.pins_of(self)

    @property
    def resident(self):
        """True while the block is live with device memory; False once it
        is dead, and while reclaim keeps its bytes in host memory (its
        address then means nothing until Pool.use brings it back)."""
        return self.pool.is_resident(self)

    @property
    def segment(self):
        return self.pool.segment_of(self)

    def __reduce__(self):
        """What copy.copy and pickle take: a copy keeps the values of now."""
        return _copied_block, (self.pool, self._ticket, self.size, self.address,
                               self.allocated_size)

    def __repr__(self):
        return (f"Block(address={self.address:#x}, size={self.size}, "
                f"allocated_size={self.allocated_size}, state={self.state})")


def _copied_block(pool, ticket, size, address, allocated_size):
    """A copy of a handle (Block.__reduce__): never registered, so the pool
    tells it from the handle it copies."""
    cdef Block block = Block.__new__(Block)
    block.pool, block._ticket, block.size = pool, ticket, size
    block._address, block._allocated_size = address, allocated_size
    return block


def take_block(pool, int64_t p, list handles, object nbytes):
    """malloc's fast path, under the pool's lock: the handle of a block of
    ``nbytes`` (an int, 0 <= nbytes < 2**62) carved as take() carves it,
    registered in ``handles`` at its row; or take()'s answer when it is
    negative (nothing changed then)."""
    cdef int64_t *a = _view(p)
    cdef int64_t ticket = _take(a, nbytes, a[H_REUSE_FIRST])
    cdef Block block
    if ticket < 0:
        return ticket
    block = Block.__new__(Block)
    block._ticket = ticket
    block.pool = pool
    block.size = nbytes
    block._address = None
    block._allocated_size = None
    handles[ticket & ROW_MASK] = block
    return block


def release_block(int64_t p, list handles, Block block):
    """free's fast path, under the pool's lock: when ``block`` is the live
    handle registered at its row, keep its address and allocated size in
    it, release it as release() does and unregister it: 1, or 2 when the
    open frees now fill a batch. 0 (nothing changed) otherwise."""
    cdef int64_t *a = _view(p)
    cdef int64_t row = block._ticket & ROW_MASK
    cdef int64_t r = TABLE + row * NF
    cdef int64_t done
    if row >= len(handles) or handles[row] is not block:
        return 0
    done = _release(a, row, block._ticket >> ROW_BITS)
    if done:
        block._address = a[r + ADDR]
        block._allocated_size = a[r + SIZE]
        handles[row] = None
    return done


def chains(int64_t p, const int64_t[::1] first_rows):
    """Every row of the segments whose first rows are ``first_rows``, in
    address order, segment after segment: (rows, offsets), int64 arrays;
    segment i's rows are rows[offsets[i]:offsets[i + 1]]. One walk in C
    of what Core.rows_of walks in Python."""
    cdef int64_t *a = _view(p)
    cdef Py_ssize_t nseg = first_rows.shape[0], i
    cdef int64_t total = 0, row, n = 0
    for i in range(nseg):
        row = first_rows[i]
        while row >= 0:
            total += 1
            row = a[TABLE + row * NF + NEXT]
    rows_array = np.empty(total, np.int64)
    offsets_array = np.empty(nseg + 1, np.int64)
    cdef int64_t[::1] rows = rows_array, offsets = offsets_array
    for i in range(nseg):
        offsets[i] = n
        row = first_rows[i]
        while row >= 0:
            rows[n] = row
            n += 1
            row = a[TABLE + row * NF + NEXT]
    offsets[nseg] = n
    return rows_array, offsets_array


def held(list handles, const int64_t[::1] rows, object holder):
    """A bool array: True where the handle registered at ``rows[i]`` is in
    ``holder`` (a dict's keys, a set)."""
    cdef Py_ssize_t n = rows.shape[0], i
    out_array = np.zeros(n, np.bool_)
    cdef unsigned char[::1] out = out_array.view(np.uint8)
    for i in range(n):
        if handles[rows[i]] in holder:
            out[i] = 1
    return out_array


def registered(list handles, const int64_t[::1] rows, const int64_t[::1] gens):
    """A uint8 array: 1 where the handle registered at ``rows[i]`` is of
    that row's generation ``gens[i]``, 0 where none is (such a block must
    not move)."""
    cdef Py_ssize_t n = rows.shape[0], i
    out_array = np.zeros(n, np.uint8)
    cdef unsigned char[::1] out = out_array
    cdef object handle
    for i in range(n):
        handle = handles[rows[i]]
        if handle is not None and (<Block>handle)._ticket >> ROW_BITS == gens[i]:
            out[i] = 1
    return out_array
