"""Numba arrays that Dask brings back from host memory land in the pool.

When a worker spills a Numba device array (``distributed.protocol.numba``'s
``dask_serialize``: a copy to host memory) and later unspills it, or
receives one over TCP, distributed's ``dask_deserialize`` makes the device
copy: with ``numba.cuda.to_device`` (Numba's memory manager, so our pool)
where RMM cannot be imported, but inside an ``rmm.DeviceBuffer`` (RMM's
memory resource, outside the pool) where it can. :func:`register` replaces
that deserializer on the worker with one that always copies into a Numba
array, so the array comes from the pool either way. Device-to-device
transfers (UCX, ``cuda_deserialize``) receive into the buffers the
communication layer allocates and are left as they are.
"""

import numpy as np


def deserialize_into_the_pool(header, frames):
    """The Numba array of ``header`` (``distributed.protocol.numba``'s:
    shape, strides, typestr) with its bytes (one host frame) copied into a
    new Numba device array: under numba_alloc, a block of the pool."""
    from numba import cuda
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    (frame,) = frames
    data = cuda.to_device(np.asarray(memoryview(frame)).view(np.uint8).reshape(-1))
    return DeviceNDArray(shape=tuple(header["shape"]), strides=tuple(header["strides"]),
                         dtype=np.dtype(header["typestr"]), gpu_data=data.gpu_data)


def register():
    """Make :func:`deserialize_into_the_pool` Dask's deserializer of Numba
    device arrays in this process (imports numba.cuda, and distributed's
    own registration first, so that it cannot replace this one later)."""
    from distributed.protocol import numba as _distributed_numba  # noqa: F401
    from distributed.protocol.serialize import dask_deserialize
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    dask_deserialize.register(DeviceNDArray)(deserialize_into_the_pool)
