"""The CUDA simulator's thread blocks, polled without holding on to the GIL.

numba-cuda's ``BlockManager.run`` (0.30) starts a Python thread per GPU
thread of a block and polls them in a loop that never lets go of the GIL:
a simulated thread that wakes (from ``syncthreads``, or from a warp
primitive of numba_alloc.device.heap_simulator waiting on its condition)
first waits out the poller's switch interval, 5 ms. A warp's 32 lanes then
take longer to reach ``activemask()`` than the heap simulator's gathering
window, so most gatherings wait the whole window, with the poller spinning
all along (test_heap_warp's script: 45 s of CPU alone on the 2-core VM).

:class:`BlockManager` is numba-cuda's with its polling loop copied and the
GIL let go once a round (``time.sleep(0)``), so that the threads run as
soon as they can: the same threads, the same release of ``syncthreads``
once every live thread is blocked, the same exceptions; only when the
poller runs changes. The heap scripts run under the simulator
(simulator_scripts.py) and the stand-in's kernels whose threads wait for
each other use it; conftest.py installs it for the tests' processes.
"""

import time

from numba.cuda.simulator import kernel


class BlockManager(kernel.BlockManager):
    """numba-cuda's BlockManager; :meth:`run` lets the block's threads run
    between its polls."""

    def run(self, grid_point, *args):
        """numba-cuda 0.30's ``BlockManager.run``, but for the
        ``time.sleep(0)`` at the top of each round."""
        threads = set()
        livethreads = set()
        blockedthreads = set()
        for block_point in kernel.np.ndindex(*self._block_dim):

            def target():
                self._f(*args)

            t = kernel.BlockThread(target, self, grid_point, block_point, self._debug)
            t.start()
            threads.add(t)
            livethreads.add(t)

        while livethreads:
            time.sleep(0)                   # the GIL, to threads that can run
            for t in livethreads:
                if t.syncthreads_blocked:
                    blockedthreads.add(t)
                elif t.exception:
                    for t_other in threads:
                        t_other.abort = True
                        t_other.syncthreads_blocked = False
                        t_other.syncthreads_event.set()
                    raise t.exception[0].with_traceback(t.exception[1])
            if livethreads == blockedthreads:
                for t in blockedthreads:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                blockedthreads = set()
            livethreads = set([t for t in livethreads if t.is_alive()])
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])


def install():
    """The simulator's kernel launches in this process run their blocks with
    :class:`BlockManager` (FakeCUDAKernel looks the class up at each launch)."""
    kernel.BlockManager = BlockManager
