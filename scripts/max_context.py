"""`bitnest max-context` from a checkout (export/commands/max_context.py): `python scripts/max_context.py --help` for its options."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from export.commands.max_context import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
