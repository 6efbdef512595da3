"""The device-memory ledger (observe/ledger.py): rows that add up to what
the driver reports used, in memory_ledger() and memory_summary(). Over
numba-cuda's driver layer: test_standin.py's staging scenario."""

import numba_alloc
from numba_alloc import Pool, SimulatedDevice
from numba_alloc.observe.ledger import ledger_rows

MiB = 1 << 20


def _snapshot(total=64 * MiB, free=40 * MiB, scratch=96 * 1024, allocated=10 * MiB,
              reserved=20 * MiB, staged=0):
    return {"device": {"total": total, "free": free, "scratch_bytes": scratch},
            "stats": {"allocated_bytes.all.current": allocated,
                      "reserved_bytes.all.current": reserved,
                      "staged_bytes.current": staged}}


def test_the_rows_add_up_to_the_device_used_memory():
    rows = ledger_rows(_snapshot())
    assert rows[-1] == ("device used", 24 * MiB)
    assert sum(n for _, n in rows[:-1]) == 24 * MiB
    assert dict(rows)["pool: cached blocks"] == 10 * MiB
    assert dict(rows)["outside the pool, other processes included"] == 4 * MiB - 96 * 1024


def test_with_per_process_figures_the_rest_splits_and_still_adds_up():
    rows = ledger_rows(_snapshot(), processes=(22 * MiB, MiB))
    table = dict(rows)
    assert table["this process, outside the pool"] == 2 * MiB - 96 * 1024
    assert table["other processes"] == MiB
    assert table["unaccounted (the driver's own)"] == MiB
    assert sum(n for _, n in rows[:-1]) == table["device used"]


def test_a_simulated_pool_holds_all_its_device_used_memory():
    pool = Pool(SimulatedDevice(64 * MiB))
    pool.malloc(5 * MiB)                        # a 20 MiB segment
    pool.stage(5000, lambda address: None)
    table = numba_alloc.memory_ledger(pool)
    assert table["device used"] == pool.current("reserved_bytes") == 22 * MiB
    assert table["pool: allocated blocks"] == 5 * MiB + 5120
    assert table["outside the pool, other processes included"] == 0
    pool.host_cache.take(4096)
    text = str(numba_alloc.memory_summary(pool))
    assert "of which staged for kernel launches" in text and "5.00 KiB" in text
    assert "pinned host cache" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Device memory"))
    ledger = lines[start:lines.index("-" * 84, start)]
    assert max(len(line) for line in ledger) <= 84 and len(ledger) == 9
