"""Calibrate the gate thresholds (entropy and margin at 3, 7, 15 and 30% escalation) of a checkpoint
and backend, saved beside the checkpoint; see edge/decode/thresholds.py."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.decode.thresholds import main  # noqa: E402
from export.pipeline import ensure_default_checkpoint  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_checkpoint=ensure_default_checkpoint))
