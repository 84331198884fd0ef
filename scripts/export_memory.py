"""`bitnest export-memory` (export.commands): run `python scripts/export_memory.py --help` for its options."""

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from export.commands import run_command  # noqa: E402


def main(argv=None) -> int:
    return run_command("export-memory", argv)


if __name__ == "__main__":
    sys.exit(main())
