"""`bitnest compile-kernels` from a checkout (export/commands/compile_kernels.py): `python scripts/compile_kernels.py --help` for its options."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from export.commands.compile_kernels import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
