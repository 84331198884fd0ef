"""Shared command-line plumbing: one-line errors with exit code 2 (no traceback), the final --json object, and
optional plotting."""

import json
import sys
from typing import Callable

from edge.errors import BitNestError


def run_cli(body: Callable[[], dict], as_json: bool, prog: str, echo: bool = True) -> int:
    """Run `body`; print its result as one JSON object last (with --json) or, with `echo`, as `key: value` lines.
    User errors and bad option values become `prog: error: ...` on stderr and exit code 2."""
    try:
        result = body()
    except (BitNestError, ValueError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:            # the machine, not the input: a full disk, a read-only folder, a vanished file
        print(f"{prog}: error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    if as_json:
        print(json.dumps(result))
    elif echo:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


def pyplot(option: str):
    """matplotlib.pyplot on the Agg backend, or a one-line error naming `option` and the extra that brings it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BitNestError(f"{option} needs matplotlib: pip install -e .[analysis]") from None
    return plt
