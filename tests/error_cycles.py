"""Whether a handled error keeps alive, through a reference cycle, what
the frames it was raised through held."""

import gc
import weakref

import pytest


def assert_freed_without_the_collector(request, error):
    """``request(held)`` raises ``error``; once the caller has handled it and
    dropped ``held`` (an object only the call's frames saw), ``held`` goes
    at once, with the cyclic garbage collector off."""
    class Held:
        pass

    held = Held()
    alive = weakref.ref(held)
    enabled = gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(error):
            request(held)
        del held
        assert alive() is None
    finally:
        if enabled:
            gc.enable()
