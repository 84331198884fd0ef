"""`bitnest draft-layers` from a checkout (export/commands/draft_layers.py): `python scripts/draft_layers.py --help` for its options."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from export.commands.draft_layers import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
