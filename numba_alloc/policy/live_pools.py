"""Every live :class:`~numba_alloc.policy.pool.Pool` of the process, and
the hooks told of each new one (the IPython extension follows a session's
pools with them, the plugin's and those a user makes alike).

A pool joins when its ``__init__`` has finished and leaves when it is
garbage; nothing here keeps a pool alive. Thread safe; no cost on any
request path (a pool's creation pays one set insertion and one call a hook).
"""

import threading
import weakref

_lock = threading.Lock()
_live = weakref.WeakSet()
_hooks = ()     # called with each new pool, in the order added


def live_pools() -> list:
    """The pools alive now, in no particular order."""
    with _lock:
        return list(_live)


def when_pool_made(hook) -> None:
    """Call ``hook(pool)`` with every Pool made from now on, in the thread
    that makes it, before it serves any request. ``hook`` must not raise
    (what it raises goes to the pool's maker) and must be quick. TypeError
    when ``hook`` is not callable."""
    global _hooks
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {hook!r}")
    with _lock:
        _hooks = _hooks + (hook,)


def stop_when_pool_made(hook) -> None:
    """Undo :func:`when_pool_made` (the first registration of ``hook``);
    ValueError when ``hook`` is not registered."""
    global _hooks
    with _lock:
        hooks = list(_hooks)
        if hook not in hooks:
            raise ValueError(f"stop_when_pool_made: {hook!r} is not registered")
        hooks.remove(hook)
        _hooks = tuple(hooks)


def pool_made(pool) -> None:
    """Called by Pool.__init__ once ``pool`` is ready: records it and tells the hooks."""
    with _lock:
        _live.add(pool)
        hooks = _hooks
    for hook in hooks:
        hook(pool)
