"""Puts the driver stand-in under numba-cuda at interpreter start-up when
NUMBA_ALLOC_STANDIN=1 (with NUMBA_ALLOC_STANDIN_DEVICES GPUs, default 1).
Under the stand-in the test suite puts this folder
on PYTHONPATH, so that the processes the GPU tests start (programs that
need a fresh CUDA context) run over it too. A process whose stand-in
recorded errors prints them and exits with status 70, so that the test
that started it fails as a test in the suite's own process would."""

import atexit
import os
import sys

if os.environ.get("NUMBA_ALLOC_STANDIN") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    import standin
    _standin = standin.install(devices=int(os.environ.get("NUMBA_ALLOC_STANDIN_DEVICES", "1")))

    @atexit.register
    def _report():
        errors = _standin.errors
        if errors:
            print("the driver stand-in recorded:", *(f"  {call}: {message}"
                                                  for call, message in errors),
                  sep="\n", file=sys.stderr)
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(70)
