"""The decode GEMV's launch parameters and access patterns on a CUDA GPU (export/commands/gemv_sweep.py):
`python scripts/gemv_sweep.py --help` for its options."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from export.commands.gemv_sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
