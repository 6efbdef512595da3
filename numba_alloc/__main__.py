"""``python -m numba_alloc``: the ``numba-alloc`` command."""

import sys

from .cli.main import main

sys.exit(main())
