"""Live comparison of every decoding policy (target, draft, speculative, adaptive, every gate) with
bytes per token, escalation rates, paired bootstrap differences and McNemar tests; see edge/analysis/compare.py."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.analysis.compare import main  # noqa: E402
from export.pipeline import ensure_default_checkpoint  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_checkpoint=ensure_default_checkpoint))
