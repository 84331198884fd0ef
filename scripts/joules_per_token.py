"""`bitnest joules` from a checkout (export/commands/joules.py): `python scripts/joules_per_token.py --help` for its options."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from export.commands.joules import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
