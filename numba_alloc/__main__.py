"""``python -m numba_alloc``: the ``numba-alloc`` command."""

import sys

from .cli import main

sys.exit(main())
