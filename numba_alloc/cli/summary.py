"""``numba-alloc summary SNAPSHOT``: the text report of a snapshot file that
``numba_alloc.dump_snapshot`` (or ``numba-alloc run --snapshot``) wrote, as
``python -m torch.cuda._memory_viz stats`` prints PyTorch's."""

import os

from ..observe.memory_viz import load_snapshot
from ..observe.summary import format_saved_summary


def add_arguments(parser):
    """The options of ``numba-alloc summary``."""
    parser.add_argument("snapshot", help="a snapshot pickle written by numba_alloc.dump_snapshot "
                                         "or numba-alloc run --snapshot")
    parser.add_argument("--abbreviated", action="store_true",
                        help="leave out the per-pool rows and the segment lines")


def run(args):
    """Print the report; returns the exit status, 0. Raises UsageError for
    a file that cannot be read or is not a numba_alloc snapshot (a part
    the report reads missing or of the wrong kind)."""
    from .arguments import UsageError
    try:
        data = load_snapshot(args.snapshot)
    except OSError as error:
        raise UsageError(f"can't read the snapshot {args.snapshot!r}: "
                         f"{error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(error) from None
    try:
        report = format_saved_summary(data, os.path.basename(args.snapshot), args.abbreviated)
    except KeyError as error:
        raise UsageError(f"{args.snapshot}: not a numba_alloc snapshot: it has no "
                         f"{error.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as error:
        raise UsageError(f"{args.snapshot}: not a numba_alloc snapshot: a part of it is "
                         f"malformed ({error})") from None
    print(report)
    return 0
