"""``python -m numba_alloc.cli``: the ``numba-alloc`` command."""

import sys

from .main import main

sys.exit(main())
