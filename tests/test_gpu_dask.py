"""numba_alloc.dask on GPU workers (skipped without a GPU): a cluster of
worker processes whose Numba arrays come from each worker's pool, read
from the client and the scheduler; with dask-cuda, a LocalCUDACluster, one
worker per GPU. The same path on simulated pools: test_dask.py; a GPU
worker's set-up and unspilling over the driver stand-in: test_standin.py."""

import sys

import numpy as np
import pytest

from gpu_marks import GPU_MARKS, gpu_toolchain  # noqa: F401 (GPU_MARKS uses it)

pytestmark = GPU_MARKS

MiB = 1 << 20
HEARTBEATS = 20         # heartbeats to wait for the scheduler's metrics, at most


def keep_on_the_gpu(n):
    """A task: a Numba array of ``n`` float32 on the worker's GPU (the
    result stays on the worker while its future lives)."""
    from numba import cuda
    return cuda.to_device(np.arange(n, dtype=np.float32))


def defrag_setting():
    import numba_alloc
    return numba_alloc.settings(0).defrag


async def heartbeat(dask_worker):
    await dask_worker.heartbeat()


def check_a_gpu_cluster(client, monkeypatch, register=True):
    """The plugin's settings reach every worker, an array kept on the i-th
    worker ((i + 1) * 4 MiB) is in its pool, in the client's table and in
    the scheduler's metrics. ``register``: the client registers the
    plugin (else the workers' preload has)."""
    import distributed
    import numba_alloc.dask as nd
    if register:
        client.register_plugin(nd.NumbaAllocSetup("garbage_collection_threshold:0.9",
                                                  defrag=True))
    workers = sorted(client.scheduler_info()["workers"])
    kept = [client.submit(keep_on_the_gpu, (i + 1) * MiB, workers=[a], pure=False)
            for i, a in enumerate(workers)]
    distributed.wait(kept)      # (a result fetched here would make a Numba context here)
    assert set(client.run(defrag_setting).values()) == {True}
    monkeypatch.setitem(sys.modules, "pandas", None)        # the table as rows
    rows = nd.memory_stats(client)
    expected = {a: (i + 1) * 4 * MiB for i, a in enumerate(workers)}
    assert {r["worker"]: r["allocated_bytes.all.current"] for r in rows[:-1]} == expected
    assert rows[-1]["allocated_bytes.all.current"] == sum(expected.values())
    for _ in range(HEARTBEATS):     # a heartbeat already under way may land after ours
        client.run(heartbeat)
        arrived = {a: sum(g["allocated_bytes"] for g in w["metrics"]["numba_alloc"].values())
                   for a, w in client.scheduler_info()["workers"].items()
                   if "numba_alloc" in w["metrics"]}
        if arrived == expected:
            break
    assert arrived == expected, f"after {HEARTBEATS} heartbeats the scheduler has {arrived}"


def test_a_cluster_of_gpu_worker_processes(monkeypatch):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            check_a_gpu_cluster(client, monkeypatch)


def test_workers_preloading_numba_alloc_dask_with_their_environments_settings(monkeypatch):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None, preload=["numba_alloc.dask"],
                                  env={"NUMBA_ALLOC_CONF": "defrag:true"}) as cluster:
        with distributed.Client(cluster) as client:
            check_a_gpu_cluster(client, monkeypatch, register=False)


def test_a_local_cuda_cluster(monkeypatch):
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    with dask_cuda.LocalCUDACluster(dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            check_a_gpu_cluster(client, monkeypatch)


def test_the_example_on_gpu_workers():
    """examples/dask_cluster.py without --simulate: tasks of 4 to 11 Numba
    arrays of 1 MiB keep half of them, 28 MiB across the workers' GPUs."""
    import subprocess
    from pathlib import Path
    pytest.importorskip("distributed")
    example = Path(__file__).resolve().parents[1] / "examples" / "dask_cluster.py"
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = next(line for line in proc.stdout.splitlines() if line.startswith("total"))
    assert total.split()[1:3] == ["28.00", "MiB"]
