"""Teacher-forced replay of the gates and of verified speculation over the target's greedy trajectories
(AUCs with bootstrap intervals, budget tables, cost model, figures); see edge/analysis/replay.py."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.analysis.replay import main  # noqa: E402
from export.pipeline import ensure_default_checkpoint  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_checkpoint=ensure_default_checkpoint))
