"""Perplexity and draft/target agreement of a nested checkpoint (see `edge.analysis.evaluate`)."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.analysis.evaluate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
