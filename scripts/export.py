"""Export a nested W4/W8 checkpoint from a model (see `export.cli`)."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/ (this file shadows `export`)

from export.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
