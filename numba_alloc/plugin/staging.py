"""The device memory numba-cuda stages a kernel's host arguments in, served
by the pool.

numba-cuda (0.30, its PR #703) copies a NumPy array passed to a kernel (and
``cuda.In``/``Out``/``InOut``, record arguments) into device memory it gets
from ``ctx.device._dev.allocate``: cuda-core's ``Device``, one object per
device, held by numba-cuda's own Device (one per process) and used by every
thread's launches. Its default memory resource is the driver's
stream-ordered pool, which never returns memory and which the pool would
not see. :func:`install` gives that Device a :class:`PoolMemoryResource`
instead, when the plugin makes a device's pool.

Thread safe: allocate takes the pool's lock; deallocate takes none (cuda-core
calls it when a Buffer closes or is collected, also from a finalizer, on
any thread). Each staged buffer names a resource of its own
(:class:`StagedBlock`), which frees that buffer's block and nothing else.
"""

from cuda.core import MemoryResource
from numba.cuda.cudadrv import devicearray, devices

from . import activity


class PoolMemoryResource(MemoryResource):
    """cuda-core's MemoryResource over the pool of the current context of
    device ``device_id``: each buffer a staged block of the pool
    (Pool.stage: pinned, so never moved or reclaimed while its buffer is
    open, counted in ``staged_bytes``, within the pool's limit, and
    OutOfMemoryError where the pool has no room without moving blocks:
    the launch has read its device arrays' addresses; where the launch
    hooks keep those of this pool in place (its reclaim), it may move
    others). A closed buffer's block is
    freed as the pool frees any block: reusable once the GPU work queued
    before has finished on the legacy default stream and every blocking
    stream (docs/pool.md, stream safety). Where the current context's
    memory manager is not numba_alloc's (after set_memory_manager), the
    resource that was there before serves the request.
    """

    def __init__(self, device_id, previous):
        self._device_id = device_id
        self.previous = previous        # cuda-core's resource that this one replaced

    def allocate(self, size, *, stream=None):
        manager = devices.get_context().memory_manager
        if not getattr(manager, "is_numba_alloc", False):
            return self.previous.allocate(size, stream=stream)
        pool = manager.pool or manager.initialize()
        owner = StagedBlock(self)
        # numba-cuda's name for cuda-core's Buffer; the launch staging this
        # has read its device arrays' addresses: no block may move unless the
        # launch hooks (activity.py, this pool's reclaim) keep them in place
        with pool.lock:
            owner.block, buffer = pool.stage(
                size, lambda address: devicearray.Buffer.from_handle(
                    address, size, mr=owner, stream=stream),
                moves=activity.keeps_in_place(pool))
        return buffer

    def deallocate(self, ptr, size, *, stream=None):
        """Nothing to free: only numba-cuda's empty buffers name this
        resource (a staged block's buffer names its StagedBlock)."""

    @property
    def is_device_accessible(self):
        return True

    @property
    def is_host_accessible(self):
        return False

    @property
    def is_managed(self):
        return False

    @property
    def device_id(self):
        return self._device_id


class StagedBlock(PoolMemoryResource):
    """The resource one staged buffer names (its requests go to the
    device's): closing that buffer unstages its own ``block``, once, and
    nothing else. Keyed by address instead, a buffer kept past cuda.close()
    and closed later unstaged the block the next context's pool had staged
    at the same address, still in use."""

    def __init__(self, resource):
        super().__init__(resource.device_id, resource.previous)
        self.block = None

    def deallocate(self, ptr, size, *, stream=None):
        block, self.block = self.block, None
        if block is not None:
            block.pool.unstage_later(block)


def install(device):
    """Serve the staging of numba-cuda's Device ``device`` (its cuda-core
    Device, ``device._dev``) from the pool; once per device and process."""
    cuda_core_device = device._dev
    if not isinstance(cuda_core_device.memory_resource, PoolMemoryResource):
        cuda_core_device.memory_resource = PoolMemoryResource(
            device.id, cuda_core_device.memory_resource)
