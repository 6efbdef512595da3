"""numba_alloc across a Dask cluster: every worker's pool set up by one
plugin, tasks allocating through it, and the cluster's memory read as one
table from the client (needs the dask extra: pip install -e ".[dask]").

    python examples/dask_cluster.py                    # GPU workers, else simulated
    python examples/dask_cluster.py --simulate 1GiB    # simulated pools, no GPU needed
    python examples/dask_cluster.py --snapshots out/   # also each pool's snapshot

With GPUs, dask-cuda's LocalCUDACluster (one worker per GPU) where it is
installed, else a LocalCluster of one worker process; tasks make Numba
arrays, which come from each worker's pool. Without a GPU (or with
--simulate), a LocalCluster of --workers processes, each with a pool on a
simulated device, and tasks allocate and free blocks of it.
"""

import argparse
import gc

import numpy as np
from distributed import Client, LocalCluster, wait

import numba_alloc
import numba_alloc.dask as nd

MiB = 1 << 20


def gpu_present():
    from numba import cuda
    try:
        return cuda.is_available()
    except Exception:           # no driver library
        return False


def numba_arrays(n):
    """A task on a GPU worker: n MiB of Numba arrays, half freed again;
    the other half is the result, kept on the worker."""
    from numba import cuda
    arrays = [cuda.to_device(np.full(MiB // 4, i, np.float32)) for i in range(n)]
    return arrays[: n // 2]


def simulated_blocks(n):
    """A task on a simulated worker: n blocks of 1 to n MiB, every other
    one freed again (the rest stay allocated); the bytes the worker's pool
    then has allocated."""
    pool = nd.worker_pools()[0]
    blocks = [pool.malloc((i + 1) * MiB) for i in range(n)]
    for block in blocks[::2]:
        pool.free(block)
    return numba_alloc.memory_allocated(pool)


async def heartbeat(dask_worker):
    await dask_worker.heartbeat()


def make_cluster(simulate, workers):
    if simulate is None:
        try:
            from dask_cuda import LocalCUDACluster
            return LocalCUDACluster(dashboard_address=None)
        except ImportError:
            return LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
    return LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", metavar="CAPACITY",
                        help="a simulated device of this size per worker "
                             "(default without a GPU: 1GiB)")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes of a simulated cluster (default 2)")
    parser.add_argument("--snapshots", metavar="FOLDER",
                        help="write each pool's snapshot (pytorch.org/memory_viz) here")
    args = parser.parse_args(argv)
    simulate = args.simulate or (None if gpu_present() else "1GiB")
    plugin = nd.NumbaAllocSetup("garbage_collection_threshold:0.8", defrag=True,
                                simulate=simulate, history=args.snapshots is not None)
    with make_cluster(simulate, args.workers) as cluster, Client(cluster) as client:
        client.register_plugin(plugin)
        task = numba_arrays if simulate is None else simulated_blocks
        results = client.map(task, range(4, 12), pure=False)
        wait(results)       # the results stay on the workers (Numba arrays there)
        # arrays the tasks dropped but distributed's bookkeeping still holds in
        # reference cycles are freed by the workers' next garbage collection:
        # have it now, so that the table shows what the results hold
        client.run(gc.collect)
        print(nd.memory_summary(client))
        client.run(heartbeat)       # the metrics the scheduler (and its dashboard) has now
        for address, worker in sorted(client.scheduler_info()["workers"].items()):
            print(address, worker["metrics"].get("numba_alloc"))
        if args.snapshots:
            for path in nd.dump_snapshots(client, args.snapshots):
                print("wrote", path)


if __name__ == "__main__":
    main()
