"""How a :class:`~numba_alloc.dask.NumbaAllocSetup` travels to a worker.

Its pickle calls :func:`load_on_worker`, carried by value (cloudpickle:
this module is registered to be pickled by value, and holds nothing
else), so that a worker that cannot import numba_alloc still unpickles
it: into a stand-in plugin whose set-up raises RuntimeError naming the
worker and the import error, which ``client.register_plugin`` raises.
Without it, distributed fails in ``plugin_add`` before any plugin code
runs, and the client gets a bare ``Exception: ImportError(...)`` naming
no worker.
"""

import pickle
import sys

import cloudpickle

PLUGIN_NAME = "numba_alloc"


def load_on_worker(plugin_pickle):
    """Runs on the worker (by value: it may use only what every Dask worker
    has): the plugin whose class and ``__dict__`` ``plugin_pickle``
    pickles, or where its class (numba_alloc) cannot be imported, a plugin
    whose ``setup`` raises RuntimeError naming the worker and the error."""
    try:
        cls, state = pickle.loads(plugin_pickle)
    except ImportError as error:
        from distributed import WorkerPlugin

        reason = f"{type(error).__name__}: {error}"
        plugin_name = PLUGIN_NAME   # (a class body's globals are not carried by value)

        class NumbaAllocMissing(WorkerPlugin):
            name = plugin_name

            def setup(self, worker):
                raise RuntimeError(f"worker {worker.name}: cannot import numba_alloc ({reason}); "
                                   f"install numba-alloc[dask] on every worker")
        return NumbaAllocMissing()
    plugin = cls.__new__(cls)
    plugin.__dict__.update(state)
    return plugin


class _Call:
    """Pickles as the call ``function(*args)``, made when it is unpickled."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def portable_reduce(plugin):
    """``plugin.__reduce__``'s answer: ``pickle.loads`` of cloudpickle's
    bytes of the call ``load_on_worker(pickle of (its class, its
    __dict__))``, which unpickle on a worker without numba_alloc too."""
    plugin_pickle = pickle.dumps((type(plugin), plugin.__dict__))
    return pickle.loads, (cloudpickle.dumps(_Call(load_on_worker, plugin_pickle)),)


cloudpickle.register_pickle_by_value(sys.modules[__name__])
