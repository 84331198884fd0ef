"""Chat with a nested checkpoint; without --checkpoint, the embedded default (exported first if absent)."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.cli.chat import main  # noqa: E402
from export.pipeline import ensure_default_checkpoint  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_checkpoint=ensure_default_checkpoint))
