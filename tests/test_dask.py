"""numba_alloc.dask on a LocalCluster of two worker processes, each with a
pool on a simulated device (NumbaAllocSetup(simulate=...)): tasks allocate
and free through their worker's pool, the cluster's table adds up to what
each worker reads, the metrics reach the scheduler, and bad arguments are
one clear error. The GPU path: test_gpu_dask.py, and over the driver
stand-in test_standin.py (a GPU worker's set-up, unspilling into the pool)."""

import ast
import pickle

import pytest

distributed = pytest.importorskip("distributed")

import numba_alloc  # noqa: E402
import numba_alloc.dask as nd  # noqa: E402
from numba_alloc.dask.metrics import METRIC_KEYS, device_metrics  # noqa: E402
from gpu_marks import HAVE_GPU  # noqa: E402

MiB = 1 << 20
CAPACITY = "256MiB"
HEARTBEATS = 20         # heartbeats to wait for the scheduler's metrics, at most
KEPT = []               # on a worker: the blocks its tasks keep


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster) as c:
            yield c


@pytest.fixture
def simulated(client):
    """Every worker with a fresh simulated pool that records history; the
    plugin is unregistered after the test."""
    client.register_plugin(nd.NumbaAllocSetup("garbage_collection_threshold:0.9",
                                              simulate=CAPACITY, history=True))
    yield client
    client.unregister_worker_plugin(nd.NumbaAllocSetup.name)
    client.run(_forget_blocks)


def _forget_blocks():
    KEPT.clear()


def allocate(keep, drop):
    """A task: ``keep`` blocks of these sizes stay allocated (on this
    worker), ``drop`` ones are freed again; the pool's allocated bytes."""
    pool = nd.worker_pools()[0]
    for size in drop:
        pool.free(pool.malloc(size))
    KEPT.extend(pool.malloc(size) for size in keep)
    return numba_alloc.memory_allocated(pool)


def free_kept(dask_worker):
    pool = nd.worker_pools(dask_worker)[0]
    while KEPT:
        pool.free(KEPT.pop())


def stats_on_the_worker(dask_worker):
    return numba_alloc.memory_stats(nd.worker_pools(dask_worker)[0])


def metrics_on_the_worker(dask_worker):
    return {"0": device_metrics(nd.worker_pools(dask_worker)[0])}


async def heartbeat(dask_worker):
    await dask_worker.heartbeat()


def run_tasks(client):
    """Two tasks on each worker, different sizes per worker; {address:
    bytes the worker's last task saw allocated}."""
    workers = sorted(client.scheduler_info()["workers"])
    seen = {}
    for i, address in enumerate(workers):
        first = client.submit(allocate, [(i + 1) * MiB], [8 * MiB], workers=[address], pure=False)
        second = client.submit(allocate, [MiB, 2 * MiB], [], workers=[address], pure=False)
        first.result()
        seen[address] = second.result()
    return seen


def test_tasks_allocate_and_free_through_each_workers_pool(simulated):
    seen = run_tasks(simulated)
    assert sorted(seen.values()) == [4 * MiB, 5 * MiB]
    on_workers = simulated.run(stats_on_the_worker)
    assert {a: s["allocated_bytes.all.current"] for a, s in on_workers.items()} == seen
    for stats in on_workers.values():
        assert stats["allocation.all.allocated"] == 4 and stats["allocation.all.freed"] == 1
    simulated.run(free_kept)
    assert [s["allocated_bytes.all.current"] for s in simulated.run(stats_on_the_worker).values()] \
        == [0, 0]


def test_memory_stats_adds_up_to_what_each_worker_reads(simulated, monkeypatch):
    run_tasks(simulated)
    on_workers = simulated.run(stats_on_the_worker)
    monkeypatch.setitem(__import__("sys").modules, "pandas", None)    # the rows as they are
    rows = nd.memory_stats(simulated)
    assert [(r["worker"], r["gpu"]) for r in rows] == [(a, 0) for a in sorted(on_workers)] + [
        ("total", None)]
    for row in rows[:-1]:
        assert {k: v for k, v in row.items() if k not in ("worker", "gpu")} == on_workers[
            row["worker"]]
    total = rows[-1]
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "num_alloc_retries",
                "allocation.all.allocated", "segment.all.current"):
        assert total[key] == sum(s[key] for s in on_workers.values()), key
    assert total["allocated_bytes.all.current"] == 9 * MiB
    assert total["max_split_size"] == 2**64 - 1      # the largest, not a sum
    assert total["largest_alloc_size"] == max(s["largest_alloc_size"] for s in on_workers.values())


def test_memory_stats_is_a_dataframe_with_pandas(simulated):
    pandas = pytest.importorskip("pandas")
    run_tasks(simulated)
    frame = nd.memory_stats(simulated)
    assert isinstance(frame, pandas.DataFrame)
    assert frame.index.names == ["worker", "gpu"]
    gpus = frame.index.get_level_values("gpu")
    assert [type(gpu) for gpu in gpus[:-1]] == [int, int] and pandas.isna(gpus[-1])
    assert frame.loc[(frame.index[0][0], 0), "allocated_bytes.all.current"] > 0
    assert frame.loc[("total", None), "allocated_bytes.all.current"] == 9 * MiB
    assert frame["allocated_bytes.all.current"].iloc[:-1].sum() == 9 * MiB


def test_memory_summary_is_one_table_with_totals(simulated):
    seen = run_tasks(simulated)
    lines = nd.memory_summary(simulated).splitlines()
    assert lines[0] == "numba_alloc on 2 workers, 2 devices"
    assert lines[1].split()[:3] == ["worker", "gpu", "allocated"]
    assert set(lines[2]) == {"-", " "}
    for line, address in zip(lines[3:5], sorted(seen)):
        assert line.split()[:4] == [address, "0", f"{seen[address] / MiB:.2f}", "MiB"]
    assert lines[5].split()[:3] == ["total", "9.00", "MiB"]


def test_the_metrics_arrive_at_the_scheduler(simulated):
    run_tasks(simulated)
    expected = simulated.run(metrics_on_the_worker)
    assert set(expected[next(iter(expected))]["0"]) == set(METRIC_KEYS)
    for _ in range(HEARTBEATS):     # a heartbeat already under way may land after ours
        simulated.run(heartbeat)
        workers = simulated.scheduler_info()["workers"]
        arrived = {a: w["metrics"].get("numba_alloc") for a, w in workers.items()}
        if arrived == expected:
            break
    assert arrived == expected, f"after {HEARTBEATS} heartbeats the scheduler has {arrived}"
    assert sorted(m["0"]["allocated_bytes"] for m in arrived.values()) == [4 * MiB, 5 * MiB]


def test_snapshots_and_traces_are_written_per_worker(simulated, tmp_path):
    run_tasks(simulated)
    names = sorted(simulated.run(lambda dask_worker: str(dask_worker.name)).values())
    snapshots = nd.dump_snapshots(simulated, tmp_path / "snapshots")
    assert [p.name for p in snapshots] == [f"{n}-gpu0.pickle" for n in names]
    traces = nd.dump_traces(simulated, tmp_path / "traces")
    assert [p.name for p in traces] == [f"{n}-gpu0.csv" for n in names]
    for snapshot_path, trace_path in zip(snapshots, traces):
        snap = pickle.loads(snapshot_path.read_bytes())
        live = [b for s in snap["segments"] for b in s["blocks"]
                if b["state"] == "active_allocated"]
        assert len(live) == 3
        actions = [e.action for e in numba_alloc.read_rmm_log(trace_path)]
        assert actions.count("allocate") == 4 and actions.count("deallocate") == 1


def test_the_log_directory_gets_each_pools_trace_at_teardown(client, tmp_path):
    client.register_plugin(nd.NumbaAllocSetup(simulate=CAPACITY, log_directory=tmp_path))
    try:
        run_tasks(client)
        client.run(free_kept)
        assert list(tmp_path.iterdir()) == []
    finally:
        client.unregister_worker_plugin(nd.NumbaAllocSetup.name)
    logs = sorted(tmp_path.iterdir())
    assert len(logs) == 2
    for log in logs:
        actions = [e.action for e in numba_alloc.read_rmm_log(log)]
        assert actions.count("allocate") == 4 and actions.count("deallocate") == 4


def test_empty_cache_and_reset_peaks_reach_every_pool(simulated):
    run_tasks(simulated)
    simulated.run(free_kept)
    nd.empty_cache(simulated)
    nd.reset_peak_memory_stats(simulated)
    for stats in simulated.run(stats_on_the_worker).values():
        assert stats["reserved_bytes.all.current"] == 0
        assert stats["reserved_bytes.all.peak"] == 0 and stats["allocated_bytes.all.peak"] == 0


def test_the_settings_reach_each_workers_pool(client):
    client.register_plugin(nd.NumbaAllocSetup("limit:64MiB,defrag:true", simulate=CAPACITY,
                                              defrag=False, max_split_size_mb=64))
    try:
        settings = client.run(lambda dask_worker: nd.worker_pools(dask_worker)[0].settings())
    finally:
        client.unregister_worker_plugin(nd.NumbaAllocSetup.name)
    for s in settings.values():
        assert (s.limit, s.defrag, s.max_split_size_mb) == (64 * MiB, False, 64)


@pytest.mark.parametrize("args, kwargs, error, message", [
    (("limit:lots",), {}, ValueError, r"conf='limit:lots' is invalid: limit"),
    ((42,), {}, TypeError, r"conf must be a str in NUMBA_ALLOC_CONF's syntax"),
    ((), {"colour": "blue"}, ValueError, r"unknown setting 'colour'"),
    ((), {"growth": False, "max_split_size_mb": 64}, ValueError, r"max_split_size_mb applies only"),
    ((), {"simulate": "lots"}, ValueError, r"simulate must be a number of bytes"),
    ((), {"simulate": 0}, ValueError, r"simulate must be a capacity above 0"),
    ((), {"history": "yes"}, TypeError, r"history must be True or False"),
    ((), {"max_entries": 0}, ValueError, r"max_entries must be an int from 1 to"),
    ((), {"log_directory": 7}, TypeError, r"log_directory must be a str or path-like"),
])
def test_bad_plugin_arguments_are_one_clear_error_and_change_nothing(simulated, args, kwargs,
                                                                    error, message):
    before = simulated.run(lambda dask_worker: id(dask_worker.plugins["numba_alloc"]))
    with pytest.raises(error, match=message):
        simulated.register_plugin(nd.NumbaAllocSetup(*args, **kwargs))
    assert simulated.run(lambda dask_worker: id(dask_worker.plugins["numba_alloc"])) == before


@pytest.mark.parametrize("kwargs, message", [
    ({"simulate": "1GiB", "history": True, "max_entries": 2 ** 64},
     r"max_entries must be an int from 1 to \d+, got 18446744073709551616"),
    ({"simulate": "100MiB", "growth": False, "limit": 0.001},
     r"limit 0.001 of this device is 104857 bytes, below the 2097152 bytes the arena"),
    ({"simulate": "1GiB", "limit": 1e-300},
     r"limit 1e-300 of this device is 0 bytes, below the 512 bytes of the smallest block"),
])
def test_what_the_set_up_would_refuse_is_refused_when_the_plugin_is_made(kwargs, message):
    """Not in setup() on each worker, as the docstring says."""
    with pytest.raises(ValueError, match=message):
        nd.NumbaAllocSetup(**kwargs)


def test_a_failed_set_up_keeps_no_pool(monkeypatch):
    from types import SimpleNamespace
    from numba_alloc.dask import worker_plugin

    def refuse(*args, **kwargs):
        raise RuntimeError("history refused")
    monkeypatch.setattr(worker_plugin, "record_history", refuse)
    plugin = nd.NumbaAllocSetup(simulate=CAPACITY, history=True)
    worker = SimpleNamespace(name="w0", metrics={})
    with pytest.raises(RuntimeError, match="worker w0: history refused"):
        plugin.setup(worker)
    assert plugin.devices() == {} and worker.metrics == {}


@pytest.mark.parametrize("step, error, raised, message", [
    ("record_history", OSError("no room"), RuntimeError,
     r"worker w0: OSError: no room \(starting its pool's history: history=True, "
     r"max_entries=100000\)"),
    ("Pool", MemoryError("no host memory"), RuntimeError,
     r"worker w0: MemoryError: no host memory \(making its pool with limit=67108864\)"),
    ("Pool", RuntimeError("refused"), RuntimeError,
     r"worker w0: refused \(making its pool with limit=67108864\)"),
    ("Pool", ValueError("limit: too much"), ValueError, r"worker w0: limit: too much"),
])
def test_a_failed_set_up_names_the_worker_and_keeps_the_error_as_its_cause(
        monkeypatch, step, error, raised, message):
    """Whatever error a set-up meets, what it raises names the worker (a
    driver's error, or any other but a ValueError or a RuntimeError, was
    raised as it was: only ``failure`` named the worker), the step and the
    settings (a ValueError names the setting refused itself), with the
    error met as its ``__cause__`` (a ValueError or RuntimeError had none)."""
    from types import SimpleNamespace
    from numba_alloc.dask import worker_plugin

    def refuse(*args, **kwargs):
        raise error
    monkeypatch.setattr(worker_plugin, step, refuse)
    plugin = nd.NumbaAllocSetup("limit:64MiB", simulate=CAPACITY, history=True)
    worker = SimpleNamespace(name="w0", metrics={})
    with pytest.raises(raised) as caught:
        plugin.setup(worker)
    assert caught.type is raised and caught.match(f"^{message}$")
    assert caught.value.__cause__ is error and plugin.failure == str(caught.value)
    assert plugin.devices() == {} and worker.metrics == {}


def test_a_teardown_whose_log_cannot_be_written_still_stops_the_history(tmp_path):
    """distributed drops the plugin before its teardown: when writing the
    log fails, the history this plugin started must stop all the same (it
    went on recording the pool's every allocation, with no plugin left to
    stop it), and the error is raised."""
    from types import SimpleNamespace
    from numba_alloc.observe.history import history_of
    (tmp_path / "file").write_text("")
    plugin = nd.NumbaAllocSetup(simulate=CAPACITY, history=True,
                                log_directory=tmp_path / "file" / "logs")
    worker = SimpleNamespace(name="w0", metrics={})
    plugin.setup(worker)
    pool = plugin.devices()[0]
    assert history_of(pool) is not None
    with pytest.raises(OSError):
        plugin.teardown(worker)
    assert history_of(pool) is None and worker.metrics == {} and plugin.devices() == {}


@pytest.mark.skipif(HAVE_GPU, reason="a worker without a GPU refuses the GPU set-up")
def test_a_worker_without_a_gpu_refuses_the_gpu_set_up_naming_what_to_do(client):
    try:
        with pytest.raises(RuntimeError, match=r"worker \S+: no usable CUDA driver .*"
                                               r"NumbaAllocSetup\(simulate=capacity\)"):
            client.register_plugin(nd.NumbaAllocSetup("defrag:true"), name="numba_alloc-gpu")
    finally:
        client.unregister_worker_plugin("numba_alloc-gpu")
    assert client.run(lambda dask_worker: "numba_alloc" in dask_worker.metrics) == {
        a: False for a in client.scheduler_info()["workers"]}


def test_the_preload_is_for_workers_only():
    import asyncio
    scheduler = distributed.Scheduler.__new__(distributed.Scheduler)     # never started
    with pytest.raises(TypeError, match=r"numba_alloc.dask is a worker preload .* Scheduler"):
        asyncio.run(nd.dask_setup(scheduler))


def test_worker_pools_needs_a_worker_with_the_plugin(client):
    with pytest.raises(ValueError, match="No worker found"):
        nd.worker_pools()
    with pytest.raises(RuntimeError, match=r"has no NumbaAllocSetup plugin: client.register_"):
        client.submit(nd.worker_pools, pure=False).result()
    with pytest.raises(RuntimeError, match=r"has no NumbaAllocSetup plugin"):
        nd.memory_stats(client)



def test_the_example_runs_a_simulated_cluster(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    example = Path(__file__).resolve().parents[1] / "examples" / "dask_cluster.py"
    proc = subprocess.run([sys.executable, str(example), "--simulate", "512MiB", "--workers", "1",
                           "--snapshots", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "numba_alloc on 1 worker, 1 device"
    # tasks of 4 to 11 blocks of 1, 2, ... MiB, every other one kept (in
    # blocks perhaps larger: a free block too small to split is handed out whole)
    kept = sum(sum((i + 1) for i in range(n) if i % 2) for n in range(4, 12)) * MiB
    total, unit = lines[4].split()[1:3]                      # (a rule under the header)
    metric = ast.literal_eval(lines[5].split(" ", 1)[1])["0"]     # the scheduler's, as printed
    assert unit == "MiB" and float(total) * MiB == metric["allocated_bytes"] >= kept
    assert [p.name for p in tmp_path.iterdir()] == ["0-gpu0.pickle"]


def test_a_cluster_without_workers_has_a_summary_of_zeros():
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as empty:
        lines = nd.memory_summary(empty).splitlines()
    assert lines[0] == "numba_alloc on 0 workers, 0 devices"
    assert lines[-1].split()[:3] == ["total", "0", "B"]


def _summary_and_stats_raise(client, match):
    for read in (nd.memory_summary, nd.memory_stats, lambda c: nd.dump_traces(c, "unused")):
        with pytest.raises(RuntimeError, match=match):
            read(client)


@pytest.mark.skipif(HAVE_GPU, reason="a worker without a GPU refuses the GPU set-up")
def test_after_a_failed_set_up_the_client_functions_name_the_worker_and_why(client):
    try:
        with pytest.raises(RuntimeError, match=r"worker \S+: no usable CUDA driver"):
            client.register_plugin(nd.NumbaAllocSetup())
        _summary_and_stats_raise(client, r"worker \S+: no usable CUDA driver .*NumbaAllocSetup "
                                         r"failed to set the worker up")
    finally:
        client.unregister_worker_plugin(nd.NumbaAllocSetup.name)


def test_the_preloads_failed_set_up_is_named_by_the_client_functions():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", preload=["numba_alloc.dask"],
                                  env={"NUMBA_ALLOC_CONF": "limit:lots"}) as cluster, \
            distributed.Client(cluster) as bad:
        _summary_and_stats_raise(bad, r"worker 0: NUMBA_ALLOC_CONF='limit:lots' is invalid: "
                                      r".*NumbaAllocSetup failed to set the worker up")


def test_a_worker_that_cannot_import_numba_alloc_is_named():
    from pathlib import Path
    preload = str(Path(__file__).with_name("dask_without_numba_alloc.py"))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", preload=[preload]) as cluster, \
            distributed.Client(cluster) as bare:
        [address] = bare.scheduler_info()["workers"]
        with pytest.raises(RuntimeError, match=r"^worker 0: cannot import numba_alloc "
                                               r"\(ImportError: No module named 'numba_alloc'"):
            bare.register_plugin(nd.NumbaAllocSetup(simulate=CAPACITY))
        _summary_and_stats_raise(bare, rf"^worker {address}: ImportError\(.*'numba_alloc'")
