"""Two devices under the plugin, over the driver stand-in:
tests/devices_standin.py's scenarios, each in a fresh process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_standin import pytestmark  # noqa: F401 (NVVM, and a process of its own)

TESTS = Path(__file__).parent


def scenario(name, conf=""):
    """devices_standin.py's scenario ``name``'s JSON, run in a fresh
    process with NUMBA_ALLOC_CONF ``conf``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "NUMBA_CUDA_MEMORY_MANAGER", "NUMBA_ALLOC_CONF",
                        "NUMBA_ALLOC_STANDIN")}
    env.update(NUMBA_ALLOC_CONF=conf,
               PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(TESTS / "devices_standin.py"), name], env=env,
                          cwd=TESTS, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_bring_back_inside_another_devices_call_copies_in_its_own_devices_context():
    """A copy_to_host of device 1's reclaimed array made while device 0 is
    current brings it back by defragmenting device 1's pool: its copy
    kernel runs in device 1's context (Numba attaches device 0's for the
    call), every byte right, device 0's pool untouched."""
    out = scenario("bring_back_inside_another_devices_call",
                   "limit:16MiB,reclaim:true,defrag:true,host_limit:8MiB")
    assert out["errors"] == []
    assert out["reclaimed_before"] == 8 << 20                # the 8 MiB array
    assert out["big_right"] and out["smalls"] == [[1.0], [3.0], [5.0], [7.0]]
    assert out["defragmentations"] == 1 and out["device0_defragmentations"] == 0


@pytest.mark.parametrize("name, value", [("read_by_a_copy_from_another_device", 7.0),
                                         ("read_by_a_launch_on_another_device", 8.0)])
def test_a_read_from_another_device_waits_for_the_copies_that_brought_an_array_back(name,
                                                                                  value):
    """Device 1's reclaimed array brought back by a device 1 launch that
    reads it (its copies queued there, not waited for), then read while
    device 0 is current, by a copy or a launch that Numba queues in device
    0's context: the read waits for the copies (another context's work does
    not follow them), every byte right."""
    out = scenario(name, "limit:16MiB,reclaim:true,host_limit:8MiB")
    assert out["errors"] == []
    assert out["reclaimed_before"] == 4 << 20
    assert out["values"] == [value]


def test_a_pinned_block_another_devices_copy_still_writes_is_not_handed_out():
    """Pinned memory serves every device's work: a pinned array of device
    0's host cache that a copy queued on device 1 writes, dropped, is
    handed to the next pinned array only after device 1's work (the cache
    waits for both devices rather than pin more): the copy cannot
    overwrite the new array."""
    out = scenario("pinned_block_waits_for_another_devices_copy")
    assert out["errors"] == []
    assert out["same_block"] and out["values"] == [7.0]


@pytest.mark.parametrize("name", ["pinned_block_reused_once_every_device_is_done",
                                  "pinned_block_reused_after_another_device_is_reset"])
def test_a_pinned_block_is_reused_without_waiting_once_every_device_is_done(name):
    """Once both devices have run the work queued before the block came
    back (or device 1 has been reset since, its event destroyed and never
    queried), the block is reused with no synchronization and no new pin."""
    out = scenario(name)
    assert out["errors"] == []
    assert out["same_block"]
    assert not {"cuCtxSynchronize", "cuEventSynchronize", "cuMemHostAlloc"} & set(out["calls"])
    # an event a live device: both devices', or device 0's alone once device 1 is reset
    assert out["calls"].count("cuEventQuery") == (1 if "reset" in name else 2)


def test_a_reset_frees_a_pinned_block_only_after_another_devices_work_on_it():
    """Device 0's reset returns its host cache's blocks to the driver: one
    that device 1's queued copy still writes is freed only after device
    1's work has run (the reset waits for the other devices then)."""
    out = scenario("pinned_block_freed_at_a_reset_after_another_devices_copy")
    assert out["errors"] == []
    [queued] = out["queued_at_free"]                # freed once, device 1's copy done
    assert "cuMemcpyDtoHAsync" not in queued


def test_a_reclaim_waits_for_another_devices_work_on_the_array_it_takes():
    """A launch queued on device 0 reads device 1's array; a device 1
    request then reclaims that array and fills its place: the pool waits
    for device 0's work first (it synchronized device 1 only, so device 0's
    launch read the new array's 1s)."""
    out = scenario("reclaim_while_another_device_reads",
                   "limit:16MiB,growth:false,reclaim:true,host_limit:8MiB")
    assert out["errors"] == []
    assert out["reclaimed"] == 4 << 20
    assert out["values"] == [8.0]


def test_a_defragmentation_waits_for_another_devices_work_on_the_arrays_it_moves():
    """Launches queued on device 0 read device 1's arrays; a device 1
    request then defragments device 1's pool, moving them and filling
    their old places: the pool waits for device 0's work first (it
    synchronized device 1 only, so some launches read the new array's 100s)."""
    out = scenario("defragmentation_while_another_device_reads",
                   "limit:16MiB,growth:false,defrag:true")
    assert out["errors"] == []
    assert out["defragmentations"] == 1
    assert out["values"] == [[float(i + 1)] for i in range(1, 16, 2)]
