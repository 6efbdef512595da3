"""NRT's allocator served by the device heap: the device code that
numba-cuda's runtime (NRT: ``np.empty`` and the like inside kernels) calls
instead of CUDA's ``malloc`` and ``free`` under the ``nrt_heap_size``
setting.

Two parts, linked into every kernel that uses NRT (plugin/nrt_link.py):

* :func:`nrt_source`: numba-cuda's own NRT source (``nrt.cu``, its
  ``NRT_Allocate``, ``NRT_Allocate_External``, ``NRT_Free``, the MemInfo
  functions and the statistics it keeps in ``TheMSys``), unchanged but for
  its two calls of CUDA's allocator: ``malloc(n)`` and ``free(p)`` are
  macros for :data:`ALLOCATE` and :data:`RELEASE`, defined in
  :data:`PRELUDE`. They read the heap from :data:`DESCRIPTOR_SYMBOL`, a
  module global holding the address of the heap's descriptor (DESCRIPTOR:
  its data address and bytes, its meta address and words; written when the
  module is loaded), and call the heap's functions with the C ABI.
* :func:`heap_ptx`: those functions, :func:`nrt_heap_malloc` and
  :func:`nrt_heap_free` over carrays of the descriptor's pointers, compiled
  by Numba from heap_kernels' malloc and free to PTX for the lowest
  compute capability NVVM supports from 7.0 up (warp matching): PTX links
  into a kernel of any later one, LTO or not. (As LTO-IR, nvJitLink drops
  NRT's functions that the kernel's own PTX calls once two LTO-IR modules
  are linked with it: numba-cuda's kernels are PTX unless ``lto=True``.)

A failed allocation (heap full, or more than 2**63 - 1 bytes) returns the
null pointer, as CUDA's ``malloc`` does, so NRT does what it does today (the
kernel's MemoryError status); the heap counts it as a failure of its size
class. ``free(NULL)`` is ignored; a pointer outside the heap (or not the
start of a live block) is counted as an invalid free and ignored.
"""

from .heap_kernels import heap_free, heap_malloc
from .warp import SIMULATOR

# the heap's descriptor: int64 words at the address DESCRIPTOR_SYMBOL holds
DATA_ADDRESS, DATA_BYTES, META_ADDRESS, META_WORDS = range(4)
DESCRIPTOR_WORDS = 4
DESCRIPTOR_SYMBOL = "numba_alloc_nrt_heap"
MALLOC_SYMBOL = "numba_alloc_heap_malloc"
FREE_SYMBOL = "numba_alloc_heap_free"
ALLOCATE = "numba_alloc_nrt_allocate"
RELEASE = "numba_alloc_nrt_release"
LOWEST_CC = (7, 0)                  # match_any_sync

PRELUDE = rf"""// numba_alloc: NRT's malloc and free served by the pool's device heap
#include <cuda/atomic>

__device__ long long* {DESCRIPTOR_SYMBOL};  // set when the module is loaded

extern "C" __device__ long long {MALLOC_SYMBOL}(
    unsigned char* data, long long data_bytes, long long* meta, long long meta_words,
    long long nbytes);
extern "C" __device__ long long {FREE_SYMBOL}(     // returns 0
    unsigned char* data, long long data_bytes, long long* meta, long long meta_words,
    long long offset);

static __device__ void* {ALLOCATE}(size_t size)
{{
  long long* heap = {DESCRIPTOR_SYMBOL};
  if (heap == nullptr) {{ return nullptr; }}
  unsigned char* data = (unsigned char*)heap[{DATA_ADDRESS}];
  // more than 2**63 - 1 bytes: a negative size, which the heap refuses and counts
  long long nbytes = size > 0x7fffffffffffffffull ? -1 : (long long)size;
  long long offset = {MALLOC_SYMBOL}(data, heap[{DATA_BYTES}],
                                     (long long*)heap[{META_ADDRESS}], heap[{META_WORDS}],
                                     nbytes);
  return offset < 0 ? nullptr : (void*)(data + offset);
}}

static __device__ void {RELEASE}(void* ptr)
{{
  long long* heap = {DESCRIPTOR_SYMBOL};
  if (ptr == nullptr || heap == nullptr) {{ return; }}
  unsigned char* data = (unsigned char*)heap[{DATA_ADDRESS}];
  {FREE_SYMBOL}(data, heap[{DATA_BYTES}], (long long*)heap[{META_ADDRESS}], heap[{META_WORDS}],
                (long long)((unsigned char*)ptr - data));
}}

#define malloc(size) {ALLOCATE}(size)
#define free(ptr) {RELEASE}(ptr)
"""


def nrt_source(numba_nrt_source):
    """The CUDA C++ source of NRT served by the heap: PRELUDE, then
    ``numba_nrt_source`` (numba-cuda's ``nrt.cu``, as text) as it is."""
    return PRELUDE + numba_nrt_source


if not SIMULATOR:
    from numba.cuda.np.numpy_support import carray


def nrt_heap_malloc(data, data_bytes, meta, meta_words, nbytes):
    """(C ABI, on a GPU) heap_malloc over the heap at ``data``
    (``data_bytes`` bytes) and ``meta`` (``meta_words`` int64): a byte
    offset, or -1."""
    return heap_malloc(carray(data, data_bytes), carray(meta, meta_words), nbytes)


def nrt_heap_free(data, data_bytes, meta, meta_words, offset):
    """(C ABI, on a GPU) heap_free of the block at byte ``offset`` of that
    heap; returns 0 (an int64, as the C declaration says: the PTX of a void
    function compiled with Numba's C ABI still writes a 64-bit return)."""
    heap_free(carray(data, data_bytes), carray(meta, meta_words), offset)
    return 0


_compiled = {}


def ptx_cc():
    """The compute capability the heap's PTX is compiled for: the lowest
    NVVM supports, and at least LOWEST_CC."""
    from numba.cuda.cudadrv import nvrtc
    return max(LOWEST_CC, min(nvrtc.get_supported_ccs()))


def heap_ptx():
    """{symbol: PTX} of :func:`nrt_heap_malloc` and :func:`nrt_heap_free`
    with the C ABI, named MALLOC_SYMBOL and FREE_SYMBOL, for :func:`ptx_cc`;
    compiled once (a few seconds), with NRT off (so that they make no
    reference-count calls of their own). Needs NVVM; compiling Numba's
    device functions needs a current device (as numba-cuda does). Thread
    safe: holds Numba's compiler lock, under which no other compilation
    reads NRT's setting meanwhile."""
    from numba import cuda, types
    from numba.cuda import config
    from numba.cuda.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:
        if not _compiled:
            int64, pointer = types.int64, types.CPointer
            arguments = (pointer(types.uint8), int64, pointer(int64), int64, int64)
            nrt = config.CUDA_ENABLE_NRT
            config.CUDA_ENABLE_NRT = False
            try:
                compiled = {
                    symbol: cuda.compile(function, restype(*arguments), device=True, abi="c",
                                         abi_info={"abi_name": symbol}, output="ptx",
                                         cc=ptx_cc())[0]
                    for symbol, function, restype in (
                        (MALLOC_SYMBOL, nrt_heap_malloc, int64),
                        (FREE_SYMBOL, nrt_heap_free, int64))}
            finally:
                config.CUDA_ENABLE_NRT = nrt
            _compiled.update(compiled)
        return dict(_compiled)
