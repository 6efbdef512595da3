"""Results computed once and shared by the processes of a test run
(pytest-xdist's workers): the ``once`` fixture of conftest.py."""

import fcntl
import pickle


def once(folder, name, compute):
    """What ``compute()`` returns (picklable), computed by the first caller
    for ``name`` in ``folder`` (a pathlib.Path); later callers, in any
    process, wait for it under a lock and read it from a file. A
    ``compute()`` that raises leaves nothing: the next caller computes."""
    path = folder / f"once-{name}.pickle"
    with open(folder / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value
