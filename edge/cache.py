"""Where the runtime keeps its per-user files: `$BITNEST_CACHE`, else ~/.cache/bitnest-edge (the folder the
exports, the native library and the auto policy's pass-cost tables share)."""

import os
from pathlib import Path

CACHE_ENV = "BITNEST_CACHE"


def cache_root() -> Path:
    """The user's BitNest cache folder (not created here)."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "bitnest-edge"))
